"""Frozen configuration: one dataclass per concern, passed whole, never mutated.

`ModelConfig` fixes the architecture (the paper's symbols: d_model, h, N, d_ff, P_drop).
`TrainConfig` and `DecodeConfig` hold the training recipe and the search settings.
`Config` bundles the three; it is read from TOML (`configs/*.toml`) and changed with typed
overrides (`--set train.warmup_steps=8000`), always through `dataclasses.replace`.

The recipes live in the package (`aiayn/configs/`; the repository's `configs/` links to it),
so an installed aiayn has them too: `load_config("own_data")` reads the built-in recipe.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from aiayn.atomic import read_json_object
from aiayn.errors import ConfigError

# The special-id layout aiayn trains its SentencePiece vocabularies with (text/tokenizer.py), and
# ModelConfig's defaults. Nothing else reads these: a vocabulary owns its ids (Tokenizer.pad_id,
# ...), a model records them (ModelConfig.pad_id, ...), so a vocabulary with another layout (a
# Marian model's: eos 0, pad last) fits without remapping.
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

# The full Config of a training run, saved in its directory (and copied by `aiayn average`).
RUN_CONFIG_FILE = "run_config.json"


def read_run_config(directory: str | Path) -> dict[str, Any]:
    """A model or run directory's `run_config.json` as a dict; {} when there is none.

    The one reader of the file (resuming, a model's saved search settings, what the server
    learns of a model): an unreadable file or one that is not a JSON object is a
    CheckpointError naming it, never a silent default.
    """
    return read_json_object(Path(directory) / RUN_CONFIG_FILE)


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of Figure 1. Defaults are the paper's base model (Table 3)."""

    vocab_size: int  # joint source/target vocabulary, filled from the tokenizer (§3.4)
    d_model: int = 512
    n_heads: int = 8  # h; d_k = d_v = d_model / h
    n_layers: int = 6  # N, for each of the encoder and decoder stacks
    d_ff: int = 2048
    dropout: float = 0.1  # P_drop on sub-layer outputs and embedding sums (§5.4)
    attn_dropout: float = 0.0  # on attention weights; not in the paper, used by tensor2tensor
    max_len: int = 1024  # rows of the positional table: the longest sequence the model accepts
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"  # §3.5; the paper found both equal
    norm_first: bool = False  # the paper is post-LN; True = pre-LN with a final LayerNorm
    layer_norm_eps: float = 1e-5
    share_embeddings: bool = True  # one embedding matrix for source and target (§3.4)
    tie_output: bool = True  # the pre-softmax projection reuses the target embedding (§3.4)
    # Where other toolkits differ from the paper (aiayn import marian needs all three):
    activation: Literal["relu", "swish"] = "relu"  # the FFN's: max(0, .) in §3.3; Marian: swish
    # "interleaved": sin/cos alternate as in §3.5; "halves": all sines, then all cosines
    # (tensor2tensor, Marian, fairseq). The same function either way, its dimensions permuted.
    positional_layout: Literal["interleaved", "halves"] = "interleaved"
    logits_bias: bool = False  # a bias on the pre-softmax projection (Marian's final_logits_bias)
    # The weights' random start (the paper names none): "xavier" = Xavier-uniform projections
    # and N(0, d_model^-0.5) embeddings (tensor2tensor, fairseq); "normal" = N(0, 0.02) for
    # both (BERT, Hugging Face's Marian and BART). Read only when a model is built to train.
    init: Literal["xavier", "normal"] = "xavier"
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self) -> None:
        checks = [
            (self.vocab_size > 0, "vocab_size must be positive"),
            (self.d_model > 0 and self.n_heads > 0, "d_model and n_heads must be positive"),
            (
                self.d_model % max(self.n_heads, 1) == 0,
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}",
            ),
            (self.n_layers >= 1, "n_layers must be at least 1"),
            (self.d_ff > 0, "d_ff must be positive"),
            (0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)"),
            (0.0 <= self.attn_dropout < 1.0, f"attn_dropout={self.attn_dropout} not in [0, 1)"),
            (self.max_len >= 2, "max_len must be at least 2"),
            (
                self.positional in ("sinusoidal", "learned"),
                f"positional={self.positional!r}: choose 'sinusoidal' or 'learned'",
            ),
            (
                self.activation in ("relu", "swish"),
                f"activation={self.activation!r}: choose 'relu' or 'swish'",
            ),
            (
                self.init in ("xavier", "normal"),
                f"init={self.init!r}: choose 'xavier' or 'normal'",
            ),
            (
                self.positional_layout in ("interleaved", "halves"),
                f"positional_layout={self.positional_layout!r}: choose 'interleaved' or 'halves'",
            ),
            (
                self.positional != "sinusoidal" or self.d_model % 2 == 0,
                "sinusoidal positions need an even d_model",
            ),
            (
                all(0 <= i < self.vocab_size for i in (self.pad_id, self.bos_id, self.eos_id)),
                f"special ids pad/bos/eos={self.pad_id}/{self.bos_id}/{self.eos_id} "
                f"must lie in [0, vocab_size={self.vocab_size})",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"ModelConfig: {message}")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named architecture, e.g. `ModelConfig.preset("paper_base", vocab_size=37000)`."""
        if name not in MODEL_PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(MODEL_PRESETS)}")
        if "vocab_size" not in overrides:
            raise ConfigError(f"preset {name!r} needs vocab_size=...")
        return cls(**{**MODEL_PRESETS[name], **overrides})


# Table 3 of the paper, plus a model small enough to train on a laptop CPU in minutes.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "paper_base": dict(d_model=512, n_heads=8, n_layers=6, d_ff=2048, dropout=0.1),
    "paper_big": dict(d_model=1024, n_heads=16, n_layers=6, d_ff=4096, dropout=0.3),
    "cpu_small": dict(d_model=256, n_heads=4, n_layers=3, d_ff=1024, dropout=0.1),
    "cpu_tiny": dict(d_model=128, n_heads=4, n_layers=2, d_ff=512, dropout=0.1),
}


@dataclass(frozen=True)
class TrainConfig:
    """The training recipe (§5). Defaults are the paper's where it gives one."""

    src: str = ""  # training source file (or a TSV with both sides when tgt is empty)
    tgt: str = ""
    valid_src: str = ""
    valid_tgt: str = ""
    out_dir: str = "runs/model"
    # continued training: start from this model directory's weights, tokenizer and whole
    # [model] architecture (e.g. an `aiayn import marian` one), with a fresh optimizer
    init_from: str = ""
    vocab_size: int = 8000  # SentencePiece joint vocabulary
    # "word": the text comes segmented (pieces between spaces, e.g. subword-nmt's "@@ " BPE),
    # and each distinct piece is one entry, the vocab_size most frequent (unseen ones: bytes)
    spm_model_type: Literal["bpe", "unigram", "word"] = "bpe"
    max_tokens: int = 4096  # token budget per batch (source or target, whichever is longer)
    max_len: int = 256  # pairs with more tokens than this on either side are filtered (counted)
    label_smoothing: float = 0.1  # ε_ls (§5.4)
    # subword regularization: each epoch segments the training text afresh, sampling with
    # this SentencePiece alpha (BPE: each merge skipped with this probability, "BPE-dropout");
    # 0 = the one best segmentation, as the paper. Not the paper's; docs/training.md
    subword_alpha: float = 0.0
    # cosine_budget = cosine to 0 at a total fitted to max_minutes (or max_steps): training.md
    lr_schedule: Literal["noam", "inverse_sqrt", "cosine", "cosine_budget", "constant"] = "noam"
    lr: float = 1.0  # a multiplier on noam; the peak rate for the other schedules
    # cosine_budget only: the rate holds at its peak after warmup and falls (half a cosine to
    # 0) over this last share of the steps left (warmup-stable-decay); 1.0 = a cosine over all
    budget_decay: float = 1.0
    warmup_steps: int = 4000
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 = no clipping
    accum_steps: int = 1
    max_steps: int = 100_000
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # wall-clock budget; 0 = no limit
    valid_every: int = 1000
    save_every: int = 1000
    keep_last: int = 5  # checkpoints kept for averaging (the paper averages the last 5 / 20)
    # average this many checkpoints into OUT_DIR/averaged at the end, its alpha chosen on
    # validation: cosine_budget saves them evenly spaced over the last 20% (times
    # budget_decay) of its schedule; other schedules take the last ones kept (save_every
    # apart, and the final step's), as `aiayn average --last`. 0 = off
    average_last: int = 0
    # choose the averaged model's decode.alpha on validation (False: it keeps the [decode]
    # table's, e.g. a published recipe's own length penalty)
    choose_alpha: bool = True
    patience: int = 0  # validations without improvement before stopping; 0 = never
    best_metric: Literal["loss", "bleu"] = "loss"
    bleu_samples: int = 200  # validation sentences decoded greedily for BLEU; 0 = skip
    seed: int = 1
    # auto = bf16 autocast where the hardware has native bf16 (CUDA compute capability >= 8,
    # a CPU with AVX512-BF16 or AMX), else fp32; aiayn.runtime.device owns the choice
    dtype: Literal["auto", "fp32", "bf16"] = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps; under torchrun, cuda = LOCAL_RANK
    deterministic: bool = False  # deterministic kernels: bit-exact resume on a GPU (slower)
    compile: bool = False  # torch.compile
    threads: int = 0  # torch threads; 0 = leave torch's default
    log_every: int = 50  # steps between training records (fewer on a short fitted budget)


@dataclass(frozen=True)
class DecodeConfig:
    """Search settings (§6.1): beam 4, length penalty α = 0.6, max length = source + 50."""

    beam_size: int = 4
    alpha: float = 0.6  # the length penalty's exponent: score = log p(Y) / lp(Y)
    # lp(Y) = ((5 + |Y|) / 6) ** α, GNMT's (the paper's α = 0.6), or |Y| ** α ("power": fairseq's
    # --lenpen, Hugging Face's and CTranslate2's length_penalty, Marian's --normalize)
    length_penalty: Literal["gnmt", "power"] = "gnmt"
    max_len_a: float = 1.0  # max output length = a * source length + b
    max_len_b: int = 50
    max_tokens: int = 0  # a hard cap on output tokens per sentence (0 = the model's max_len)
    min_len: int = 0
    nbest: int = 1
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class Config:
    """Everything one run needs: `configs/*.toml` files hold these three tables."""

    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


# --- reading and overriding -------------------------------------------------------------------


def _config_error(e: ValidationError, where: str) -> ConfigError:
    """pydantic's first complaint as aiayn's one line: `train.max_tokens='lots': expected int`."""
    err = e.errors()[0]
    kind, ctx = err["type"], err.get("ctx", {})
    if kind == "value_error":  # a dataclass's own check (__post_init__) said it: keep its words
        return ConfigError(str(ctx["error"]))
    at = ".".join([where, *map(str, err["loc"])]).strip(".")
    if kind == "missing":
        return ConfigError(f"[{where}]: missing required field {at!r}")
    if kind == "literal_error":
        return ConfigError(f"{at}={err['input']!r}: choose one of {ctx['expected']}")
    typ = {"int": "int", "bool": "bool", "float": "float", "string": "str"}.get(kind.split("_")[0])
    return ConfigError(f"{at}={err['input']!r}: " + (f"expected {typ}" if typ else err["msg"]))


def _validate(tp: Any, value: Any, where: str) -> Any:
    """`value` (TOML, JSON or a `--set` string) as type `tp`, by pydantic's lax conversions
    ("8_000" -> 8000, "on" -> True, [0.9, 0.98] -> a tuple; 3.5 is no int)."""
    try:
        return TypeAdapter(tp).validate_python(value)
    except ValidationError as e:
        raise _config_error(e, where) from None


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass `cls` from a plain dict, converting types and rejecting unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names if isinstance(data, dict) else set()
    if unknown:
        raise ConfigError(
            f"unknown key(s) {sorted(unknown)} in [{where or cls.__name__}]; known: {sorted(names)}"
        )
    return _validate(cls, data, where or cls.__name__)


def to_dict(obj: Any) -> dict[str, Any]:
    """A JSON-ready dict (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(obj)))


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply `section.field=value` strings, each typed from the dataclass field."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or section not in ("model", "train", "decode"):
            raise ConfigError(f"--set {item!r}: expected model|train|decode.FIELD=VALUE")
        sub = getattr(cfg, section)
        hints = typing.get_type_hints(type(sub))
        if name not in hints:
            known = sorted(f.name for f in dataclasses.fields(sub))
            raise ConfigError(f"--set {item!r}: {section} has no field {name!r}; known: {known}")
        value: Any = raw.strip()
        tp = hints[name]
        if typing.get_origin(tp) is tuple:  # "0.9,0.98" or "(0.9, 0.98)"
            value = [v for v in value.strip("()[] ").split(",") if v.strip()]
        value = _validate(tp, value, key)
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(sub, **{name: value})})
    return cfg


# The recipes shipped with aiayn, as package data: aiayn/configs/NAME.toml
BUILTIN_CONFIGS_DIR = Path(__file__).resolve().parent / "configs"


def builtin_configs() -> list[str]:
    """The names of the shipped recipes (`own_data`, `multi30k_en_de`, ...)."""
    return sorted(p.stem for p in BUILTIN_CONFIGS_DIR.glob("*.toml"))


def find_config(name_or_path: str | Path) -> Path:
    """A config file: the path given where it exists, else the built-in recipe of that name
    (`own_data` or `own_data.toml`: a bare name, so that a mistyped path is never replaced by
    a recipe). Missing both: a ConfigError naming the recipes."""
    path = Path(name_or_path)
    try:
        if path.is_file():
            return path
        if path.is_dir():
            raise ConfigError(f"config {path} is a directory; give a TOML file")
    except OSError as e:  # is_file raises some errors: a name over the system's length limit
        raise ConfigError(f"config {str(path)[:80]!r}: {e.strerror}") from None
    bare = len(path.parts) == 1 and not str(name_or_path).endswith(("/", os.sep))  # own_data/
    if bare and path.suffix in ("", ".toml"):
        builtin = BUILTIN_CONFIGS_DIR / f"{path.stem}.toml"
        if builtin.is_file():
            return builtin
    raise ConfigError(
        f"config file not found: {path} (the built-in recipes, by name: "
        f"{', '.join(builtin_configs())})"
    )


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read a TOML config (tables [model], [train], [decode]) and apply `--set` overrides.

    `path` is a file, or the name of a built-in recipe (`find_config`).

    `[model]` may name a `preset`; its other keys override the preset. `vocab_size` may be
    left out: it is filled from the tokenizer when training starts.
    """
    path = find_config(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    unknown = set(data) - {"model", "train", "decode"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {sorted(unknown)}; use model/train/decode")
    model = dict(data.get("model", {}))
    preset = model.pop("preset", None)
    if preset is not None:
        if preset not in MODEL_PRESETS:
            raise ConfigError(f"{path}: unknown preset {preset!r}; one of {sorted(MODEL_PRESETS)}")
        model = {**MODEL_PRESETS[preset], **model}
    model.setdefault("vocab_size", 8)  # placeholder until the tokenizer fixes it
    cfg = Config(
        model=from_dict(ModelConfig, model, "model"),
        train=from_dict(TrainConfig, data.get("train", {}), "train"),
        decode=from_dict(DecodeConfig, data.get("decode", {}), "decode"),
    )
    return apply_overrides(cfg, overrides or [])
