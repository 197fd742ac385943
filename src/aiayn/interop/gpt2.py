"""Open a Hugging Face GPT-2 directory as an aiayn `DecoderLM` model directory (docs/import.md).

    import_gpt2(hf_dir, out)   config.json -> ModelConfig, model.safetensors -> aiayn's state
                               dict, the byte-level BPE (tokenizer.json, or vocab.json +
                               merges.txt) -> hf_tokenizer.json; written to a temporary
                               directory, then renamed to `out`

A GPT-2 block is aiayn's encoder layer run causally, pre-LN (`norm_first`, with GPT-2's final
ln_f as the stack's last LayerNorm). Where GPT-2 differs from the paper, each a ModelConfig
option: learned positions, token embeddings added unscaled (`scale_embeddings = False`, no
x sqrt(d_model)), and GELU's tanh approximation in the FFN (`activation = "gelu_tanh"`, HF's
"gelu_new"). GPT-2 stores its projections as Conv1D, x W + b with W of shape (in, out): each is
transposed into nn.Linear's (out, in); c_attn stacks Q, K, V along its outputs as aiayn's
in_proj does. The output layer is tied to the token embeddings, as in GPT-2.

GPT-2 has one special token, "<|endoftext|>" (50256): it is BOS and EOS, and PAD too (GPT-2
has none; Hugging Face's usual choice, `pad_token = eos_token`). Anything else a config may say
that aiayn cannot compute exactly is refused with one line naming it, and nothing is written
unless the whole import succeeds. Weights are read with safetensors only: a directory holding
only `pytorch_model.bin` is refused (a pickle is never opened).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from aiayn.atomic import check_new_dir
from aiayn.config import ModelConfig
from aiayn.errors import CheckpointError, ConfigError
from aiayn.interop.marian import WEIGHTS, _read_json, _take, read_weights, write_imported
from aiayn.nn.variants import DecoderLM
from aiayn.store.model_dir import check_state_dict
from aiayn.text.hf_tokenizer import HFTokenizer

log = logging.getLogger(__name__)

Activation = Literal["relu", "swish", "gelu", "gelu_tanh"]
# HF's activation_function -> aiayn's (transformers.activations.ACT2FN's names)
ACTIVATIONS: dict[str, Activation] = {
    "gelu_new": "gelu_tanh",  # GPT-2's
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "swish",
    "swish": "swish",
}
INT_KEYS = ("vocab_size", "n_embd", "n_head", "n_layer", "n_positions")
END_OF_TEXT_ID = 50256  # GPT-2's "<|endoftext|>", the default of its bos/eos_token_id


@dataclass(frozen=True)
class ImportedLM:
    """What `import_gpt2` wrote, for the CLI to report."""

    out: Path
    model: ModelConfig
    tokenizer: bool  # whether the directory had one (else the model works on ids only)


# --- reading the Hugging Face directory -----------------------------------------------------------


def _int(hf: dict[str, Any], key: str, default: int | None = None) -> int:
    value = hf.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointError(f"config.json: {key} is missing or not an integer ({value!r})")
    return value


def read_gpt2_config(hf_dir: Path) -> dict[str, Any]:
    """config.json, checked to describe a GPT-2 whose every option aiayn computes."""
    if not hf_dir.is_dir():
        raise CheckpointError(f"Hugging Face model directory not found: {hf_dir}")
    hf = _read_json(hf_dir / "config.json")
    kind, archs = hf.get("model_type"), hf.get("architectures") or []
    if kind != "gpt2":
        named = ", ".join(map(str, archs)) or "no architectures"
        raise CheckpointError(f"{hf_dir} holds a {kind!r} model ({named}), not a GPT-2")
    act = hf.get("activation_function", "gelu_new")
    refusals = [
        (act not in ACTIVATIONS, f"activation_function={act!r}: aiayn's FFN has none such"),
        (
            not hf.get("scale_attn_weights", True),
            "scale_attn_weights=false: aiayn's attention always divides by sqrt(d_k)",
        ),
        (
            bool(hf.get("scale_attn_by_inverse_layer_idx")),
            "scale_attn_by_inverse_layer_idx=true: aiayn's layers all scale alike",
        ),
        (
            bool(hf.get("add_cross_attention")),
            "add_cross_attention=true: a DecoderLM has no cross-attention",
        ),
        (
            not hf.get("tie_word_embeddings", True),
            "tie_word_embeddings=false: aiayn imports GPT-2 with its output layer tied",
        ),
        (
            hf.get("n_inner") is not None and not isinstance(hf.get("n_inner"), int),
            f"n_inner={hf.get('n_inner')!r} is not an integer",
        ),
    ]
    for refused, why in refusals:
        if refused:
            raise CheckpointError(f"{hf_dir}/config.json: {why}")
    try:
        for key in INT_KEYS:
            _int(hf, key)
        _int(hf, "eos_token_id", END_OF_TEXT_ID)
        _int(hf, "bos_token_id", END_OF_TEXT_ID)
    except CheckpointError as e:
        raise CheckpointError(f"{hf_dir}/{e}") from None
    return hf


def model_config(hf: dict[str, Any], where: Path) -> ModelConfig:
    """The ModelConfig of a checked GPT-2 config.json: for inference (dropout 0)."""
    eos = hf.get("eos_token_id", END_OF_TEXT_ID)
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"],
            d_model=hf["n_embd"],
            n_heads=hf["n_head"],
            n_layers=hf["n_layer"],
            d_ff=hf.get("n_inner") or 4 * hf["n_embd"],
            dropout=0.0,
            attn_dropout=0.0,
            max_len=hf["n_positions"],
            positional="learned",
            norm_first=True,
            layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            tie_output=True,
            activation=ACTIVATIONS[hf.get("activation_function", "gelu_new")],
            scale_embeddings=False,
            init="normal",  # GPT-2's N(0, 0.02), should the config ever start a model afresh
            pad_id=eos,  # GPT-2 has no PAD: "<|endoftext|>", as HF's pad_token = eos_token
            bos_id=hf.get("bos_token_id", END_OF_TEXT_ID),
            eos_id=eos,
        )
    except ConfigError as e:
        raise CheckpointError(f"{where}/config.json: {e}") from None


# --- mapping --------------------------------------------------------------------------------------


def _conv1d(hf: dict[str, Tensor], name: str, d_in: int, d_out: int, where: Path) -> Tensor:
    """A Conv1D weight (in, out), transposed into nn.Linear's (out, in)."""
    return _take(hf, name, (d_in, d_out), where).t().contiguous()


def map_weights(hf: dict[str, Tensor], cfg: ModelConfig, where: Path) -> dict[str, Tensor]:
    """aiayn's state dict from GPT-2's tensors (GPT2LMHeadModel's, named "transformer.*", or
    GPT2Model's, without the prefix), every shape checked; a tensor left over is one GPT-2
    does not have, and is refused."""
    hf = {k.removeprefix("transformer."): v for k, v in hf.items()}
    V, D, F, P = cfg.vocab_size, cfg.d_model, cfg.d_ff, cfg.max_len
    out = {
        "embed.tokens.weight": _take(hf, "wte.weight", (V, D), where),
        "embed.learned.weight": _take(hf, "wpe.weight", (P, D), where),
    }
    for i in range(cfg.n_layers):
        h, a = f"h.{i}.", f"decoder.layers.{i}."
        for theirs, ours in (("ln_1", "norm1"), ("ln_2", "norm2")):
            for kind in ("weight", "bias"):
                out[f"{a}{ours}.{kind}"] = _take(hf, f"{h}{theirs}.{kind}", (D,), where)
        for theirs, ours, d_in, d_out in (
            ("attn.c_attn", "self_attn.in_proj", D, 3 * D),  # [W^Q W^K W^V]: in_proj's order
            ("attn.c_proj", "self_attn.out_proj", D, D),
            ("mlp.c_fc", "ffn.w_1", D, F),
            ("mlp.c_proj", "ffn.w_2", F, D),
        ):
            out[f"{a}{ours}.weight"] = _conv1d(hf, f"{h}{theirs}.weight", d_in, d_out, where)
            out[f"{a}{ours}.bias"] = _take(hf, f"{h}{theirs}.bias", (d_out,), where)
        for buffer in ("attn.bias", "attn.masked_bias"):  # older files: the causal mask, saved
            hf.pop(f"{h}{buffer}", None)
    for kind in ("weight", "bias"):
        out[f"decoder.norm.{kind}"] = _take(hf, f"ln_f.{kind}", (D,), where)
    if "lm_head.weight" in hf:  # tied: saved files usually drop it
        head = _take(hf, "lm_head.weight", (V, D), where)
        if not torch.equal(head, out["embed.tokens.weight"]):
            raise CheckpointError(
                f"{where}: lm_head.weight differs from wte.weight, to which GPT-2 ties it"
            )
    if hf:
        raise CheckpointError(
            f"{where} holds tensors a GPT-2 does not have: {', '.join(sorted(hf)[:3])}"
        )
    return out


def read_tokenizer(hf_dir: Path, cfg: ModelConfig) -> HFTokenizer | None:
    """The directory's byte-level BPE, checked against the model's size and special ids; None
    (with a warning) when it has none."""
    tok = HFTokenizer.from_hf_dir(hf_dir)
    if tok is None:
        log.warning(
            "%s has no tokenizer (tokenizer.json, or vocab.json + merges.txt): the model is "
            "imported alone and works on token ids",
            hf_dir,
        )
        return None
    if tok.vocab_size != cfg.vocab_size:
        raise CheckpointError(
            f"{hf_dir}: the tokenizer has {tok.vocab_size} pieces but config.json says "
            f"vocab_size={cfg.vocab_size}"
        )
    if (tok.bos_id, tok.eos_id) != (cfg.bos_id, cfg.eos_id):
        raise CheckpointError(
            f"{hf_dir}: the tokenizer's <|endoftext|> is {tok.eos_id} but config.json says "
            f"bos_token_id={cfg.bos_id}, eos_token_id={cfg.eos_id}"
        )
    return tok


# --- writing --------------------------------------------------------------------------------------


def import_gpt2(hf_dir: str | Path, out: str | Path) -> ImportedLM:
    """Convert the GPT-2 directory `hf_dir` into a new aiayn model directory `out`, which
    `aiayn.store.model_dir.load_model_dir(out)` opens as a `DecoderLM`.

    Everything is read and checked first; then the model directory is built in a temporary
    directory beside `out` and renamed to it, so `out` is either complete or absent.
    """
    hf_dir, out = Path(hf_dir), Path(out)
    check_new_dir(out)
    hf = read_gpt2_config(hf_dir)
    cfg = model_config(hf, hf_dir)
    tok = read_tokenizer(hf_dir, cfg)
    state = map_weights(read_weights(hf_dir), cfg, hf_dir / WEIGHTS)
    model = DecoderLM(cfg)
    check_state_dict(model, state, str(hf_dir / WEIGHTS))
    model.load_state_dict(state, strict=False)  # the tied output layer is filled through wte
    write_imported(out, model, tok, "gpt2", hf_dir)
    return ImportedLM(out, cfg, tok is not None)
