"""Open a Hugging Face LLaMA-family directory as an aiayn `DecoderLM` model directory
(docs/import.md, "A LLaMA").

    import_llama(hf_dir, out)   config.json -> ModelConfig, model.safetensors (or the shards
                                its index names) -> aiayn's state dict, tokenizer.json ->
                                hf_tokenizer.json + hf_special_ids.json; written to a
                                temporary directory, then renamed to `out`
    LlamaTokenizer              the tokenizer.json, with the model's special ids beside it

A LLaMA block (Touvron et al., 2023) is aiayn's encoder layer run causally and pre-norm, with
these switches, each a ModelConfig option: rotary positions on Q and K (`positional = "rope"`,
base rope_theta; HF's q_proj and k_proj rows are already in the "halves" pairing aiayn rotates,
so nothing is permuted), RMSNorm (`norm = "rmsnorm"`), a SwiGLU FFN of intermediate_size
(gate_proj = W_1, up_proj = W_3, down_proj = W_2), no biases, grouped-query attention
(`kv_heads`), unscaled token embeddings and, usually, an untied output layer. W^Q, W^K and W^V
stack into aiayn's one in_proj, in that order. Mistral is the same network with a sliding
window (`attn_window`). A LLaMA with attention_bias or mlp_bias takes aiayn's biases, the
group it lacks set to zero (the same function).

Anything else a config may say that aiayn cannot compute exactly (scaled RoPE, a head size
other than hidden_size / heads, another activation, Qwen2's q/k/v-only biases and prompts
without BOS) is refused with one line naming it, and nothing is written unless the whole import
succeeds. Weights are read with safetensors only: a pickle is never opened.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.atomic import atomic_write_json, check_new_dir, read_json_object
from aiayn.config import ModelConfig
from aiayn.errors import CheckpointError, ConfigError
from aiayn.interop.gpt2 import ImportedLM, _int
from aiayn.interop.marian import WEIGHTS, _read_json, _take, read_weights, write_imported
from aiayn.nn.variants import DecoderLM
from aiayn.store.model_dir import check_state_dict
from aiayn.text.hf_tokenizer import LibTokenizer  # first: it says when `tokenizers` is missing

from tokenizers import Tokenizer as HFLibTokenizer  # isort: skip

log = logging.getLogger(__name__)

KINDS = ("llama", "mistral")  # config.json's model_type values read here
INT_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "max_position_embeddings",
)
# Beyond this many positions a config needs --max-len: RoPE has no table to allocate, but no
# LLaMA that aiayn can compute exactly (unscaled RoPE) was trained on more.
MAX_POSITIONS = 1 << 20
HF_JSON = "tokenizer.json"
SPECIAL_IDS_FILE = "hf_special_ids.json"  # a model directory's: the ids tokenizer.json lacks


# --- reading the Hugging Face directory -----------------------------------------------------------


def _rope_theta(hf: dict[str, Any]) -> tuple[float, str | None]:
    """RoPE's base, and why it cannot be computed (None when it can): transformers 5 writes
    rope_parameters {rope_type, rope_theta}; earlier versions rope_theta and rope_scaling."""
    params, scaling = hf.get("rope_parameters"), hf.get("rope_scaling")
    theta: Any = hf.get("rope_theta", 10000.0)
    for name, table in (("rope_parameters", params), ("rope_scaling", scaling)):
        if table is None:
            continue
        if not isinstance(table, dict):
            return 0.0, f"{name}={table!r} is not a table"
        kind = table.get("rope_type", table.get("type", "default"))
        if kind != "default":
            return 0.0, f"{name} has rope_type={kind!r}: aiayn's RoPE is unscaled"
        if table.get("partial_rotary_factor", 1.0) != 1.0:
            return 0.0, f"{name}: partial_rotary_factor: aiayn's RoPE turns the whole head"
        theta = table.get("rope_theta", theta)
    if not isinstance(theta, int | float) or isinstance(theta, bool) or theta <= 1:
        return 0.0, f"rope_theta={theta!r} is not a number above 1"
    return float(theta), None


def read_llama_config(hf_dir: Path) -> dict[str, Any]:
    """config.json, checked to describe a LLaMA (or Mistral) whose every option aiayn
    computes."""
    if not hf_dir.is_dir():
        raise CheckpointError(f"Hugging Face model directory not found: {hf_dir}")
    hf = _read_json(hf_dir / "config.json")
    kind, archs = hf.get("model_type"), hf.get("architectures") or []
    if kind == "qwen2":
        raise CheckpointError(
            f"{hf_dir} holds a Qwen2: its q/k/v projections alone carry biases and its prompts "
            "start without BOS, which aiayn's DecoderLM does not express: not imported"
        )
    if kind not in KINDS:
        named = ", ".join(map(str, archs)) or "no architectures"
        raise CheckpointError(f"{hf_dir} holds a {kind!r} model ({named}), not a LLaMA or Mistral")
    try:
        for key in INT_KEYS:
            _int(hf, key)
        heads = _int(hf, "num_attention_heads")
        _int(hf, "num_key_value_heads", heads)
    except CheckpointError as e:
        raise CheckpointError(f"{hf_dir}/{e}") from None
    act, (_, rope_why) = hf.get("hidden_act", "silu"), _rope_theta(hf)
    head_dim, d_k = hf.get("head_dim"), hf["hidden_size"] // heads
    window = hf.get("sliding_window")
    refusals = [
        (act != "silu", f"hidden_act={act!r}: aiayn imports LLaMA's SwiGLU (silu) FFN only"),
        (rope_why is not None, str(rope_why)),
        (
            head_dim is not None and (head_dim != d_k or hf["hidden_size"] % heads),
            f"head_dim={head_dim} but hidden_size / num_attention_heads = "
            f"{hf['hidden_size'] / heads:g}: aiayn's head size is d_model / n_heads",
        ),
        (
            kind == "llama" and window is not None,
            f"sliding_window={window!r} on a llama: aiayn reads it for mistral only",
        ),
        (
            window is not None and (not isinstance(window, int) or window < 1),
            f"sliding_window={window!r} is not a positive integer",
        ),
        (bool(hf.get("use_sliding_window")), "use_sliding_window=true: a Qwen2 option"),
    ]
    for refused, why in refusals:
        if refused:
            raise CheckpointError(f"{hf_dir}/config.json: {why}")
    return hf


def _special_id(hf: dict[str, Any], key: str, default: int | None, where: Path) -> int | None:
    """config.json's `key` id; a list (LLaMA 3 Instruct's eos_token_id) gives its first, with a
    warning: aiayn's generation stops at one EOS."""
    value = hf.get(key, default)
    if isinstance(value, list) and value:
        log.warning("%s/config.json: %s=%s; aiayn stops at the first only", where, key, value)
        value = value[0]
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise CheckpointError(f"{where}/config.json: {key}={value!r} is not a token id")
    return value


def model_config(hf: dict[str, Any], where: Path, max_len: int | None = None) -> ModelConfig:
    """The ModelConfig of a checked LLaMA config.json, for inference (dropout 0). `max_len`
    lowers the positions the model accepts below max_position_embeddings."""
    P = hf["max_position_embeddings"]
    if max_len is not None and not 2 <= max_len <= P:
        raise CheckpointError(
            f"--max-len {max_len}: choose 2 .. {P} (config.json's max_position_embeddings)"
        )
    if max_len is None and P > MAX_POSITIONS:
        raise CheckpointError(
            f"{where}/config.json: max_position_embeddings={P:,}; pass --max-len (at most "
            f"{MAX_POSITIONS:,} are taken as they stand)"
        )
    max_len = max_len or P
    bos = _special_id(hf, "bos_token_id", 1, where)  # LlamaConfig's defaults: <s> 1, </s> 2
    eos = _special_id(hf, "eos_token_id", 2, where)
    pad = _special_id(hf, "pad_token_id", None, where)
    if bos is None or eos is None:
        raise CheckpointError(f"{where}/config.json: bos_token_id and eos_token_id are needed")
    window = hf.get("sliding_window") or 0
    bias = bool(hf.get("attention_bias")) or bool(hf.get("mlp_bias"))
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"],
            d_model=hf["hidden_size"],
            n_heads=hf["num_attention_heads"],
            n_layers=hf["num_hidden_layers"],
            d_ff=hf["intermediate_size"],
            dropout=0.0,
            attn_dropout=0.0,
            max_len=max_len,
            positional="rope",
            rope_base=_rope_theta(hf)[0],
            norm="rmsnorm",
            norm_first=True,
            layer_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            activation="swiglu",
            ffn_match_params=False,  # d_ff is intermediate_size as it stands
            bias=bias,
            kv_heads=hf.get("num_key_value_heads") or 0,
            attn_window=window if window < max_len else 0,  # a window as long as all: none
            tie_output=bool(hf.get("tie_word_embeddings", False)),
            scale_embeddings=False,
            logits_bias=False,
            init="normal",  # LLaMA's N(0, 0.02), should the config ever start a model afresh
            pad_id=pad if pad is not None else eos,  # HF's usual pad_token = eos_token
            bos_id=bos,
            eos_id=eos,
        )
    except ConfigError as e:
        raise CheckpointError(f"{where}/config.json: {e}") from None


# --- mapping --------------------------------------------------------------------------------------


def map_weights(
    hf: dict[str, Tensor], raw: dict[str, Any], cfg: ModelConfig, where: Path
) -> dict[str, Tensor]:
    """aiayn's state dict from LlamaForCausalLM's tensors ("model.*" and lm_head; LlamaModel's
    without the prefix), every shape checked; a tensor left over is one a LLaMA does not have,
    and is refused. `raw` is config.json, for which projections carry biases."""
    m = "model." if "model.embed_tokens.weight" in hf else ""
    V, D, F = cfg.vocab_size, cfg.d_model, cfg.d_hidden
    JK = cfg.n_kv_heads * cfg.d_k

    def take(name: str, *shape: int) -> Tensor:
        return _take(hf, name, shape, where)

    def bias(name: str, n: int, has: bool) -> Tensor:
        # zeros where this model has none: aiayn's `bias` is one switch for attention and
        # FFN, and adding 0 is the same function
        return take(name, n) if has else torch.zeros(n)

    attn_b, mlp_b = bool(raw.get("attention_bias")), bool(raw.get("mlp_bias"))
    out = {"embed.tokens.weight": take(f"{m}embed_tokens.weight", V, D)}
    for i in range(cfg.n_layers):
        h, a = f"{m}layers.{i}.", f"decoder.layers.{i}."
        hf.pop(f"{h}self_attn.rotary_emb.inv_freq", None)  # older files save RoPE's buffer
        qkv = [(f"{h}self_attn.{p}_proj", n) for p, n in (("q", D), ("k", JK), ("v", JK))]
        # [W^Q; W^K; W^V]: in_proj's rows; query head h reads K/V head h // (H/J), as repeat_kv
        out[f"{a}self_attn.in_proj.weight"] = torch.cat([take(f"{p}.weight", n, D) for p, n in qkv])
        out[f"{a}self_attn.out_proj.weight"] = take(f"{h}self_attn.o_proj.weight", D, D)
        if cfg.bias:
            out[f"{a}self_attn.in_proj.bias"] = torch.cat(
                [bias(f"{p}.bias", n, attn_b) for p, n in qkv]
            )
            out[f"{a}self_attn.out_proj.bias"] = bias(f"{h}self_attn.o_proj.bias", D, attn_b)
        for theirs, ours, (n_out, n_in) in (
            ("gate_proj", "w_1", (F, D)),  # Meta's w1 = gate, w3 = up, w2 = down
            ("up_proj", "w_3", (F, D)),
            ("down_proj", "w_2", (D, F)),
        ):
            out[f"{a}ffn.{ours}.weight"] = take(f"{h}mlp.{theirs}.weight", n_out, n_in)
            if cfg.bias:
                out[f"{a}ffn.{ours}.bias"] = bias(f"{h}mlp.{theirs}.bias", n_out, mlp_b)
        out[f"{a}norm1.weight"] = take(f"{h}input_layernorm.weight", D)
        out[f"{a}norm2.weight"] = take(f"{h}post_attention_layernorm.weight", D)
    out["decoder.norm.weight"] = take(f"{m}norm.weight", D)
    if not cfg.tie_output:
        out["generator.weight"] = take("lm_head.weight", V, D)
    elif "lm_head.weight" in hf and not torch.equal(  # tied: saved files usually drop it
        take("lm_head.weight", V, D), out["embed.tokens.weight"]
    ):
        raise CheckpointError(
            f"{where}: lm_head.weight differs from embed_tokens.weight, to which "
            "tie_word_embeddings=true ties it"
        )
    if hf:
        raise CheckpointError(
            f"{where} holds tensors a LLaMA does not have: {', '.join(sorted(hf)[:3])}"
        )
    return out


# --- the tokenizer --------------------------------------------------------------------------------


class LlamaTokenizer(LibTokenizer):
    """A LLaMA's tokenizer.json (SentencePiece-style BPE for LLaMA 1/2 and Mistral, byte-level
    BPE for LLaMA 3), run by `tokenizers`, with the special ids of the model's config.json: a
    tokenizer.json does not say which token is BOS or EOS (HF keeps that in config.json and
    tokenizer_config.json), so aiayn saves them beside it (SPECIAL_IDS_FILE). `encode` adds
    only what aiayn asks for, as LibTokenizer: "<s> text" is `encode(text, bos=True,
    eos=False)`, HF's LlamaTokenizerFast default. `vocab_size` is the model's, which may
    exceed the tokenizer's pieces (embedding rows no text reaches)."""

    def __init__(self, tok: HFLibTokenizer, pad_id: int, bos_id: int, eos_id: int, size: int):
        self.tok = tok
        tok.no_padding()
        tok.no_truncation()
        self.pad_id, self.bos_id, self.eos_id, self._size = pad_id, bos_id, eos_id, size

    @property
    def vocab_size(self) -> int:
        return self._size

    def save(self, directory: str | Path) -> Path:
        path = super().save(directory)
        atomic_write_json(
            Path(directory) / SPECIAL_IDS_FILE, {**self.special_ids, "vocab_size": self._size}
        )
        return path

    @classmethod
    def load_file(cls, path: Path) -> LlamaTokenizer:
        """From a model directory's `hf_tokenizer.json` and the ids saved beside it."""
        ids = read_json_object(path.parent / SPECIAL_IDS_FILE, f"no {SPECIAL_IDS_FILE} by {path}")
        keys = ("pad_id", "bos_id", "eos_id", "vocab_size")
        if not all(isinstance(ids.get(k), int) and ids[k] >= 0 for k in keys):
            raise CheckpointError(f"{path.parent / SPECIAL_IDS_FILE}: needs {', '.join(keys)}")
        return cls(_read_library_json(path), *(int(ids[k]) for k in keys))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` up to the first EOS, BOS and PAD skipped."""
        return self.tok.decode(self._content(ids), skip_special_tokens=False)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The pieces as the vocabulary spells them ("▁the", or byte-level "Ġthe")."""
        return [self.tok.id_to_token(int(i)) or "<unk>" for i in ids]


def _read_library_json(path: Path) -> HFLibTokenizer:
    try:
        return HFLibTokenizer.from_str(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read {path} ({e})") from None
    except Exception as e:  # the library raises plain Exceptions for malformed JSON
        raise CheckpointError(f"{path} is not a tokenizers JSON file ({e})") from None


def read_tokenizer(hf_dir: Path, cfg: ModelConfig) -> LlamaTokenizer | None:
    """The directory's tokenizer.json, checked against the model's size and special ids; None
    (with a warning) when it has none."""
    if not (hf_dir / HF_JSON).is_file():
        spm = (hf_dir / "tokenizer.model").exists()
        also = " (tokenizer.model alone is not read)" if spm else ""
        log.warning(
            "%s has no %s%s: the model is imported alone and works on token ids "
            "(load_model_dir(out)(ids_BT) gives the logits)",
            hf_dir,
            HF_JSON,
            also,
        )
        return None
    lib = _read_library_json(hf_dir / HF_JSON)
    pieces = lib.get_vocab_size(with_added_tokens=True)
    if pieces > cfg.vocab_size:
        raise CheckpointError(
            f"{hf_dir}: the tokenizer has {pieces} pieces but config.json says "
            f"vocab_size={cfg.vocab_size}"
        )
    for role, i in (("bos", cfg.bos_id), ("eos", cfg.eos_id)):
        if i >= pieces:
            raise CheckpointError(
                f"{hf_dir}: config.json's {role}_token_id={i} is no piece of the tokenizer "
                f"({pieces} pieces)"
            )
    return LlamaTokenizer(lib, cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.vocab_size)


# --- writing --------------------------------------------------------------------------------------


def import_llama(hf_dir: str | Path, out: str | Path, max_len: int | None = None) -> ImportedLM:
    """Convert the LLaMA (or Mistral) directory `hf_dir` into a new aiayn model directory
    `out`, which `aiayn.store.model_dir.load_model_dir(out)` opens as a `DecoderLM`;
    `max_len` lowers the positions it accepts.

    Everything is read and checked first; then the model directory is built in a temporary
    directory beside `out` and renamed to it, so `out` is either complete or absent.
    """
    hf_dir, out = Path(hf_dir), Path(out)
    check_new_dir(out)
    hf = read_llama_config(hf_dir)
    cfg = model_config(hf, hf_dir, max_len)
    tok = read_tokenizer(hf_dir, cfg)
    state = map_weights(read_weights(hf_dir), hf, cfg, hf_dir / WEIGHTS)
    model = DecoderLM(cfg)
    check_state_dict(model, state, str(hf_dir / WEIGHTS))
    model.load_state_dict(state, strict=False)  # a tied output layer is filled through embed
    write_imported(out, model, tok, "llama", hf_dir, {"model_type": hf["model_type"]})
    return ImportedLM(out, cfg, tok is not None)
