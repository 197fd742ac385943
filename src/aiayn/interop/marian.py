"""Open a Hugging Face MarianMT (OPUS-MT) directory as an aiayn model directory (docs/import.md).

    import_marian(hf_dir, out)   config.json -> ModelConfig, model.safetensors -> aiayn's
                                 state dict, the tokenizer's files, the generation settings ->
                                 run_config.json's [decode]; written to a temporary directory,
                                 then renamed to `out`

A MarianMTModel is the paper's post-LN Transformer with four differences, each a ModelConfig
option defaulting to the paper: a swish FFN (`activation`), the positional table's sines in
the first half of the dimensions and cosines in the second (`positional_layout = "halves"`),
a bias on the pre-softmax projection (`logits_bias`, HF's final_logits_bias), and Marian's
special ids (EOS 0, PAD the last id, decoding starts from PAD: `bos_id = pad_id`). Anything
else a config may say that aiayn cannot compute exactly is refused with one line naming it:
nothing is guessed, and nothing is written unless the whole import succeeds.

Weights are read with safetensors only; a directory holding only `pytorch_model.bin` is
refused (a pickle is never opened).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from aiayn.atomic import atomic_dir, atomic_write_json, check_new_dir, read_json_object
from aiayn.config import MAX_ALPHA, DecodeConfig, ModelConfig
from aiayn.config_files import RUN_CONFIG_FILE, to_dict
from aiayn.errors import CheckpointError
from aiayn.nn.embeddings import sinusoidal_positions
from aiayn.nn.model import Transformer, _ModelBase
from aiayn.store.model_dir import check_position_table, check_state_dict, save_model_dir
from aiayn.text.tokenizer import MARIAN_FILES, MarianTokenizer, Tokenizer, check_marian_vocab

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
Activation = Literal["relu", "swish"]
ACTIVATIONS: dict[str, Activation] = {"swish": "swish", "silu": "swish", "relu": "relu"}  # HF's

# HF's names inside one layer -> aiayn's (q/k/v are packed into in_proj separately).
ENCODER_LAYER = {
    "self_attn.out_proj": "self_attn.out_proj",
    "self_attn_layer_norm": "norm1",
    "fc1": "ffn.w_1",
    "fc2": "ffn.w_2",
    "final_layer_norm": "norm2",
}
DECODER_LAYER = {
    "self_attn.out_proj": "self_attn.out_proj",
    "self_attn_layer_norm": "norm1",
    "encoder_attn.out_proj": "cross_attn.out_proj",
    "encoder_attn_layer_norm": "norm2",
    "fc1": "ffn.w_1",
    "fc2": "ffn.w_2",
    "final_layer_norm": "norm3",
}
ATTENTION = {"self_attn": "self_attn", "encoder_attn": "cross_attn"}
INT_KEYS = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "encoder_attention_heads",
    "encoder_ffn_dim",
    "max_position_embeddings",
    "pad_token_id",
    "eos_token_id",
)


@dataclass(frozen=True)
class Imported:
    """What `import_marian` wrote, for the CLI to report."""

    out: Path
    model: ModelConfig
    decode: DecodeConfig
    source_lang: str | None
    target_lang: str | None


# --- reading the Hugging Face directory -----------------------------------------------------------


def _read_json(path: Path, required: bool = True) -> dict[str, Any]:
    return read_json_object(path, f"{path.parent} has no {path.name}" if required else None)


def read_hf_config(hf_dir: Path) -> dict[str, Any]:
    """config.json, checked to describe a MarianMTModel whose every option aiayn computes."""
    if not hf_dir.is_dir():
        raise CheckpointError(f"Hugging Face model directory not found: {hf_dir}")
    hf = _read_json(hf_dir / "config.json")
    kind, archs = hf.get("model_type"), hf.get("architectures") or []
    if kind != "marian" or (archs and "MarianMTModel" not in archs):
        raise CheckpointError(
            f"{hf_dir} holds a {kind!r} model ({', '.join(archs) or 'no architectures'}), "
            "not a MarianMTModel"
        )
    refusals = [
        (
            hf.get("activation_function", "gelu") not in ACTIVATIONS,
            f"activation_function={hf.get('activation_function', 'gelu')!r}: aiayn's FFN has relu "
            "or swish",
        ),
        (
            hf.get("encoder_layers") != hf.get("decoder_layers"),
            f"encoder_layers={hf.get('encoder_layers')} but decoder_layers="
            f"{hf.get('decoder_layers')}: aiayn has one n_layers for both stacks",
        ),
        (
            hf.get("encoder_attention_heads") != hf.get("decoder_attention_heads"),
            "encoder_attention_heads != decoder_attention_heads: aiayn has one n_heads",
        ),
        (
            hf.get("encoder_ffn_dim") != hf.get("decoder_ffn_dim"),
            "encoder_ffn_dim != decoder_ffn_dim: aiayn has one d_ff",
        ),
        (
            not hf.get("scale_embedding", False),
            "scale_embedding=false: aiayn always scales embeddings by sqrt(d_model) (§3.4)",
        ),
        (
            hf.get("decoder_vocab_size") not in (None, hf.get("vocab_size")),
            f"decoder_vocab_size={hf.get('decoder_vocab_size')} != vocab_size="
            f"{hf.get('vocab_size')}: aiayn has one vocabulary for both sides",
        ),
        (
            hf.get("decoder_start_token_id", hf.get("pad_token_id")) != hf.get("pad_token_id"),
            f"decoder_start_token_id={hf.get('decoder_start_token_id')} is not pad_token_id="
            f"{hf.get('pad_token_id')}: aiayn's Marian tokenizer starts decoding from PAD",
        ),
    ] + [  # leftovers of BART's config in old conversions; HF's Marian code ignores them
        (
            bool(hf.get(key)),
            f"{key}=true: HF's MarianMTModel is post-LN without it, so these "
            "weights would not compute what they were trained for",
        )
        for key in ("normalize_before", "add_final_layer_norm", "normalize_embedding")
    ]
    for refused, why in refusals:
        if refused:
            raise CheckpointError(f"{hf_dir}/config.json: {why}")
    for key in INT_KEYS:
        if not isinstance(hf.get(key), int) or isinstance(hf.get(key), bool):
            raise CheckpointError(f"{hf_dir}/config.json: {key} is missing or not an integer")
    return hf


def read_weights(hf_dir: Path) -> dict[str, Tensor]:
    """The tensors of model.safetensors (or of the shards its index names), as float32."""
    if (hf_dir / SHARD_INDEX).is_file():
        index = _read_json(hf_dir / SHARD_INDEX).get("weight_map", {})
        names = list(index.values()) if isinstance(index, dict) else []
        outside = [
            n for n in names if not isinstance(n, str) or Path(n).name != n or n in ("", "..")
        ]
        if outside:  # a shard is a file of this directory, never a path to elsewhere
            raise CheckpointError(
                f"{hf_dir}/{SHARD_INDEX} names a shard that is not a file name of the "
                f"directory: {outside[0]!r}"
            )
        files = sorted(set(names))
    elif (hf_dir / WEIGHTS).is_file():
        files = [WEIGHTS]
    else:
        other = [n for n in ("pytorch_model.bin", "tf_model.h5") if (hf_dir / n).exists()]
        if other:  # pytorch_model.bin is a pickle: loading it could run any code
            raise CheckpointError(
                f"{hf_dir} has weights only as {other[0]} (aiayn reads safetensors and never "
                f"opens a pickle): fetch {WEIGHTS} instead (docs/import.md)"
            )
        raise CheckpointError(f"{hf_dir} has no {WEIGHTS}")
    tensors: dict[str, Tensor] = {}
    for name in files:
        path = hf_dir / str(name)
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():  # noqa: SIM118  # a safe_open handle is not iterable
                    tensors[key] = f.get_tensor(key).float()
        except FileNotFoundError:
            raise CheckpointError(f"{hf_dir} has no {name}") from None
        except (SafetensorError, ValueError, OSError) as e:
            raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None
    return tensors


def read_tokenizer(hf_dir: Path, hf: dict[str, Any]) -> MarianTokenizer:
    """source.spm, target.spm and vocab.json, checked against config.json's ids and size."""
    missing = [name for name in MARIAN_FILES if not (hf_dir / name).is_file()]
    if missing:
        raise CheckpointError(f"{hf_dir} has no {', '.join(missing)} (a Marian tokenizer)")
    if (hf_dir / "target_vocab.json").exists():
        raise CheckpointError(
            f"{hf_dir} has separate source and target vocabularies (target_vocab.json): "
            "aiayn has one vocabulary for both sides"
        )
    vocab = check_marian_vocab(_read_json(hf_dir / "vocab.json"))
    if len(vocab) != hf["vocab_size"]:
        raise CheckpointError(
            f"{hf_dir}: vocab.json has {len(vocab)} pieces but config.json says "
            f"vocab_size={hf['vocab_size']}"
        )
    source, target = ((hf_dir / name).read_bytes() for name in MARIAN_FILES[:2])
    tok = MarianTokenizer(source, target, vocab)
    for key, piece, got in (
        ("pad_token_id", "<pad>", tok.pad_id),
        ("eos_token_id", "</s>", tok.eos_id),
    ):
        if hf[key] != got:
            raise CheckpointError(
                f"{hf_dir}: config.json says {key}={hf[key]} but vocab.json has {piece} = {got}"
            )
    return tok


# --- mapping --------------------------------------------------------------------------------------


def model_config(hf: dict[str, Any], logits_bias: bool) -> ModelConfig:
    """The ModelConfig of a checked MarianMTModel config.json."""
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"],
        n_layers=hf["encoder_layers"],
        d_ff=hf["encoder_ffn_dim"],
        dropout=float(hf.get("dropout", 0.1)),
        attn_dropout=float(hf.get("attention_dropout", 0.0)),
        max_len=hf["max_position_embeddings"],
        positional="sinusoidal",
        positional_layout="halves",
        norm_first=False,
        layer_norm_eps=1e-5,  # HF builds its LayerNorms with PyTorch's default
        share_embeddings=bool(hf.get("share_encoder_decoder_embeddings", True)),
        tie_output=bool(hf.get("tie_word_embeddings", True)),
        activation=ACTIVATIONS[hf["activation_function"]],
        logits_bias=logits_bias,
        pad_id=hf["pad_token_id"],
        bos_id=hf["pad_token_id"],  # Marian's decoder starts from PAD
        eos_id=hf["eos_token_id"],
    )


def _take(hf: dict[str, Tensor], name: str, shape: tuple[int, ...], where: Path) -> Tensor:
    """Remove tensor `name` from `hf`, checking its shape."""
    if name not in hf:
        raise CheckpointError(f"{where} has no tensor {name}")
    t = hf.pop(name)
    if tuple(t.shape) != shape:
        raise CheckpointError(
            f"{where}: tensor {name} has shape {tuple(t.shape)}, config.json implies {shape}"
        )
    return t


def _embeddings(hf: dict[str, Tensor], cfg: ModelConfig, where: Path) -> dict[str, Tensor]:
    """The token embeddings and the output layer, with the sharing and tying the config says."""
    V, D = cfg.vocab_size, cfg.d_model
    shared = "model.shared.weight"
    if shared in hf:  # HF stores a shared matrix once; older versions also under each stack
        src = tgt = _take(hf, shared, (V, D), where)
        for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
            if name in hf and not torch.equal(_take(hf, name, (V, D), where), src):
                raise CheckpointError(f"{where}: {name} differs from {shared}, which it shares")
    else:
        src = _take(hf, "model.encoder.embed_tokens.weight", (V, D), where)
        tgt = _take(hf, "model.decoder.embed_tokens.weight", (V, D), where)
    if cfg.share_embeddings and not torch.equal(src, tgt):
        raise CheckpointError(
            f"{where}: share_encoder_decoder_embeddings is true but the stacks' embeddings differ"
        )
    out = {"src_embed.tokens.weight": src}
    if not cfg.share_embeddings:
        out["tgt_embed.tokens.weight"] = tgt
    head = _take(hf, "lm_head.weight", (V, D), where) if "lm_head.weight" in hf else None
    if cfg.tie_output:  # HF ties lm_head to the decoder's embeddings, whatever the file holds
        if head is not None and not torch.equal(head, tgt):
            raise CheckpointError(
                f"{where}: tie_word_embeddings is true but lm_head.weight differs from the "
                "decoder's embeddings"
            )
    elif head is None:
        raise CheckpointError(f"{where} has no tensor lm_head.weight (tie_word_embeddings=false)")
    else:
        out["generator.weight"] = head
    return out


def _layer(hf: dict[str, Tensor], cfg: ModelConfig, stack: str, i: int, where: Path) -> dict:
    """One encoder or decoder layer's tensors, renamed; Q, K, V packed into in_proj."""
    D, F = cfg.d_model, cfg.d_ff
    shapes = {"fc1": ((F, D), (F,)), "fc2": ((D, F), (D,))}  # else (D, D) or a norm's (D,)
    out = {}
    for theirs, ours in (ENCODER_LAYER if stack == "encoder" else DECODER_LAYER).items():
        w_shape, b_shape = shapes.get(theirs, (((D,) if "norm" in theirs else (D, D)), (D,)))
        for kind, shape in (("weight", w_shape), ("bias", b_shape)):
            name = f"model.{stack}.layers.{i}.{theirs}.{kind}"
            out[f"{stack}.layers.{i}.{ours}.{kind}"] = _take(hf, name, shape, where)
    for theirs, ours in ATTENTION.items():
        if stack == "encoder" and theirs == "encoder_attn":
            continue
        for kind, shape in (("weight", (D, D)), ("bias", (D,))):
            qkv = [
                _take(hf, f"model.{stack}.layers.{i}.{theirs}.{p}_proj.{kind}", shape, where)
                for p in "qkv"
            ]
            out[f"{stack}.layers.{i}.{ours}.in_proj.{kind}"] = torch.cat(qkv)  # [W^Q; W^K; W^V]
    return out


def map_weights(hf: dict[str, Tensor], cfg: ModelConfig, where: Path) -> dict[str, Tensor]:
    """aiayn's state dict from HF's tensors (consumed), every shape checked; a tensor left over
    is one HF's MarianMTModel does not have either, and is refused."""
    hf = dict(hf)
    out = _embeddings(hf, cfg, where)
    for stack in ("encoder", "decoder"):
        for i in range(cfg.n_layers):
            out |= _layer(hf, cfg, stack, i, where)
        table = f"model.{stack}.embed_positions.weight"  # older versions saved the sinusoids
        if table in hf:
            got = _take(hf, table, (cfg.max_len, cfg.d_model), where)
            want = sinusoidal_positions(cfg.max_len, cfg.d_model, "halves")
            if not torch.allclose(got, want, atol=1e-4):
                raise CheckpointError(f"{where}: {table} is not Marian's sinusoidal table")
    if cfg.logits_bias:
        out["generator.bias"] = _take(hf, "final_logits_bias", (1, cfg.vocab_size), where)[0]
    hf.pop("final_logits_bias", None)  # all zeros when logits_bias is off
    if hf:
        raise CheckpointError(
            f"{where} holds tensors a MarianMTModel does not have: {', '.join(sorted(hf)[:3])}"
        )
    return out


def decode_config(hf: dict[str, Any], generation: dict[str, Any]) -> DecodeConfig:
    """The search settings of HF's generation config (generation_config.json over config.json).

    num_beams carries over (HF's default 1 when absent), and so does the length penalty: HF
    divides a hypothesis's log-probability by |Y| ** length_penalty (default 1.0), aiayn's
    "power" form with alpha = length_penalty, so the import searches as `generate()` does
    (tests/interop/test_marian.py compares the two). max_length is HF's absolute cap (512 in
    OPUS-MT, its positional table); aiayn's limit is source length + 50, capped by the same
    table (ModelConfig.max_len). min_length counts HF's start token.
    """
    settings = {**hf, **generation}
    bad = settings.get("bad_words_ids")
    if bad and bad != [[hf["pad_token_id"]]]:
        log.warning("bad_words_ids %s: aiayn bans PAD only; the others can be emitted", bad)
    alpha = settings.get("length_penalty", 1.0)
    if not isinstance(alpha, int | float) or not 0 <= alpha <= MAX_ALPHA:
        log.warning(
            "length_penalty %r is outside aiayn's [0, %g]: alpha 1.0 (HF's default) is used",
            alpha,
            MAX_ALPHA,
        )
        alpha = 1.0
    return DecodeConfig(
        beam_size=int(settings.get("num_beams") or 1),
        alpha=float(alpha),
        length_penalty="power",
        min_len=max(0, int(settings.get("min_length") or 0) - 1),
    )


def languages(hf_dir: Path) -> tuple[str | None, str | None]:
    """(source, target) language from tokenizer_config.json, or an opus-mt-SRC-TGT dir name."""
    tc = _read_json(hf_dir / "tokenizer_config.json", required=False)
    src, tgt = tc.get("source_lang"), tc.get("target_lang")
    named = re.search(r"opus-mt-(?:tc-\w+-)?([^-]+)-([^-]+)$", hf_dir.resolve().name)
    if named:
        src, tgt = src or named.group(1), tgt or named.group(2)
    return (str(src) if src else None), (str(tgt) if tgt else None)


# --- writing --------------------------------------------------------------------------------------


def import_marian(hf_dir: str | Path, out: str | Path) -> Imported:
    """Convert the MarianMT directory `hf_dir` into a new aiayn model directory `out`.

    Everything is read and checked first; then the model directory is built in a temporary
    directory beside `out` and renamed to it, so `out` is either complete or absent.
    """
    hf_dir, out = Path(hf_dir), Path(out)
    check_new_dir(out)
    hf = read_hf_config(hf_dir)
    tok = read_tokenizer(hf_dir, hf)
    tensors = read_weights(hf_dir)
    bias = tensors.get("final_logits_bias")
    cfg = model_config(hf, logits_bias=bias is not None and bool(bias.any()))
    check_position_table(cfg)  # max_position_embeddings alone sizes Marian's sinusoidal table
    state = map_weights(tensors, cfg, hf_dir / WEIGHTS)
    model = Transformer(cfg)
    check_state_dict(model, state, str(hf_dir / WEIGHTS))
    model.load_state_dict(state, strict=False)  # tied aliases are filled through their twin
    if float(hf.get("activation_dropout") or 0.0) > 0:
        log.warning("activation_dropout is not modelled: continued training omits it")
    decode = decode_config(hf, _read_json(hf_dir / "generation_config.json", required=False))
    src_lang, tgt_lang = languages(hf_dir)
    imported = {"source_lang": src_lang, "target_lang": tgt_lang}
    write_imported(out, model, tok, "marian", hf_dir, imported, {"decode": to_dict(decode)})
    return Imported(out, cfg, decode, src_lang, tgt_lang)


def write_imported(
    out: Path,
    model: _ModelBase,
    tok: Tokenizer | None,
    kind: str,
    hf_dir: Path,
    imported: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write an imported model's directory at once (staged beside `out`, then renamed:
    `atomic_dir`): its weights and config, its tokenizer where it has one, and a
    run_config.json saying where it came from."""
    run_config = {
        "model": to_dict(model.cfg),
        **(extra or {}),
        "imported": {"from": kind, "directory": hf_dir.resolve().name, **(imported or {})},
    }
    with atomic_dir(out) as tmp:
        save_model_dir(model, tmp)
        if tok is not None:
            tok.save(tmp)
        atomic_write_json(tmp / RUN_CONFIG_FILE, run_config)
