"""A model directory, opened once: what it is and what it holds.

Every command that takes `--model DIR`, the server and the engines start from
`ModelDir.open(DIR)`, which reads the directory's description once and checks it:

    kind "aiayn"    `aiayn train`, `average` or `import` wrote it: `config.json`,
                    `model.safetensors`, the tokenizer, and `run_config.json` whose `[decode]`
                    table holds the search defaults (`imported` says where an import came from)
    kind "export"   `aiayn export` wrote it: an engine's own files, the tokenizer, and
                    `aiayn_export.json` (the engine, the quantization, the source model's
                    config and search defaults)

What is costly to read (the weights, the tokenizer) is read when asked for, once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import torch

from aiayn.atomic import read_json_object
from aiayn.config import LM_DEFAULTS, DecodeConfig, ModelConfig, check_decode_config
from aiayn.config_files import RUN_CONFIG_FILE, from_dict, read_run_config
from aiayn.errors import CheckpointError
from aiayn.nn.model import _ModelBase
from aiayn.runtime.device import Precision, choose_precision, resolve_device
from aiayn.store.model_dir import EXPORT_FILE, build_model, model_config_of, read_model_meta
from aiayn.text.tokenizer import Tokenizer

M = TypeVar("M", bound=_ModelBase)

EXPORT_FORMAT = "aiayn-export"
EXPORT_FORMAT_VERSION = 1
ENGINES = ("ctranslate2", "onnxruntime")


def is_export_dir(directory: str | Path) -> bool:
    """Whether `directory` holds an exported model (rather than an aiayn model directory)."""
    return (Path(directory) / EXPORT_FILE).is_file()


def read_export_meta(directory: str | Path) -> dict[str, Any]:
    """Read and check `aiayn_export.json`; a missing or foreign file is a CheckpointError."""
    path = Path(directory) / EXPORT_FILE
    missing = f"{directory} is not an exported model (no {EXPORT_FILE})"
    what = ("an aiayn export", EXPORT_FORMAT, EXPORT_FORMAT_VERSION)
    meta = read_json_object(path, missing, fmt=what)
    if meta.get("engine") not in ENGINES:
        raise CheckpointError(f"{path}: unknown engine {meta.get('engine')!r}")
    return meta


def saved_decode_config(directory: str | Path, default: DecodeConfig | None = None) -> DecodeConfig:
    """The `[decode]` table saved with a model (or run) directory, or if there is none
    `default` (the paper's search: `DecodeConfig()`)."""
    table = read_run_config(directory).get("decode")
    if table is None:
        return default or DecodeConfig()
    return _decode_config(table, f"{Path(directory) / RUN_CONFIG_FILE} is unreadable")


def _decode_config(table: Any, refusal: str) -> DecodeConfig:
    """The search defaults in a saved `[decode]` table, checked; a bad one is a
    CheckpointError that starts with `refusal` (the file's name)."""
    try:
        cfg = from_dict(DecodeConfig, table, "decode")
    except (ValueError, TypeError, AttributeError) as e:  # a bad value, or not a table
        raise CheckpointError(f"{refusal}: {e}") from None
    check_decode_config(cfg)
    return cfg


@dataclass(frozen=True)
class ModelDir:
    """A model directory's description, read and checked once (`ModelDir.open`)."""

    path: Path
    kind: Literal["aiayn", "export"]
    meta: dict[str, Any]  # config.json, or aiayn_export.json for an export
    model_cfg: ModelConfig
    decode: DecodeConfig  # the search defaults saved with the model

    @classmethod
    def open(cls, directory: str | Path) -> ModelDir:
        path = Path(directory)
        if is_export_dir(path):
            meta = read_export_meta(path)
            return cls(
                path,
                "export",
                meta,
                model_config_of(meta, path, EXPORT_FILE),
                _decode_config(
                    meta.get("decode", {}), f"{path}/{EXPORT_FILE}: bad decode settings"
                ),
            )
        meta = read_model_meta(path)
        # a language model (an import, say) with no saved table samples, as `generate` does
        default = LM_DEFAULTS if meta.get("architecture") == "DecoderLM" else None
        decode = saved_decode_config(path, default)
        return cls(path, "aiayn", meta, model_config_of(meta, path), decode)

    @property
    def is_export(self) -> bool:
        return self.kind == "export"

    @property
    def engine(self) -> str | None:
        """An export's engine and quantization, e.g. "ctranslate2 (int8)"; None for aiayn's."""
        if not self.is_export:
            return None
        return f"{self.meta['engine']} ({self.meta.get('quantization', 'float32')})"

    @property
    def source(self) -> Path:
        """The aiayn model directory behind this one: an export's source, if it is still
        there (the glass box traces it), else this directory."""
        if self.is_export:
            source = str(self.meta.get("source_model") or "")
            return Path(source) if source and Path(source).is_dir() else self.path
        return self.path

    @property
    def architecture(self) -> str:
        return str(self.meta.get("architecture", ""))

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        """The directory's tokenizer, checked to fit the model (read on first use)."""
        tok = Tokenizer.load(self.path)
        tok.check_fits(self.model_cfg, str(self.path))
        return tok

    def load_model(self, expect: type[M], map_location: str | torch.device = "cpu") -> M:
        """The model, its weights checked against the config (`aiayn.store.model_dir`)."""
        if self.is_export:
            raise CheckpointError(
                f"{self.path} was written by aiayn export (translate, evaluate and serve run "
                "it); give the aiayn model directory it came from"
            )
        self.require(expect)
        model = build_model(self.path, self.meta, self.model_cfg, map_location, expect)
        return cast(M, model)  # build_model checked it is an `expect`

    def require(self, expect: type[_ModelBase]) -> None:
        """Raise a one-line CheckpointError, saying what to do with it, unless the directory
        holds an `expect` (or says nothing of its architecture: build_model then checks)."""
        have, want = self.architecture, expect.__name__
        if have and want in KINDS and have != want:
            what, use = KINDS.get(have, (f"a {have}", ""))
            raise CheckpointError(
                f"{self.path} holds {what}, not {KINDS[want][0]}" + (f" ({use})" if use else "")
            )


# What each kind of model is, and the commands that take it (`ModelDir.require`'s message).
KINDS = {
    "Transformer": ("a translator", "aiayn translate, aiayn evaluate --src/--ref"),
    "DecoderLM": ("a language model", "aiayn generate, aiayn evaluate --text"),
    "EncoderClassifier": ("a classifier", "aiayn classify, aiayn evaluate --data"),
    "EncoderMLM": (
        "a masked language model (a pre-trained encoder)",
        "aiayn train --config classify --set train.init_from=DIR fine-tunes it",
    ),
}


def open_model_dir(directory: str | Path | ModelDir) -> ModelDir:
    """`ModelDir.open(directory)`, or the ModelDir itself: what every loader accepts."""
    return directory if isinstance(directory, ModelDir) else ModelDir.open(directory)


def load_for_decoding(
    directory: str | Path | ModelDir,
    expect: type[M],
    device: str | torch.device = "auto",
    dtype: str = "auto",
) -> tuple[ModelDir, M, Precision]:
    """A model to decode with: the directory opened, the device resolved (a missing one said
    before any file is read), the decoding precision chosen and applied, the weights on it."""
    where = resolve_device(device) if isinstance(device, str) else device
    precision = choose_precision(dtype, where, "dtype", decoding=True)
    opened = open_model_dir(directory)
    model = opened.load_model(expect, where)
    precision.apply()
    return opened, model, precision
