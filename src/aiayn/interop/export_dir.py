"""An exported model directory: what is in it (`aiayn_export.json`) and how one is written.

`aiayn export ctranslate2|onnx` turns an aiayn model directory into a directory that another
engine runs (CTranslate2, ONNX Runtime). Besides the engine's own files it holds the tokenizer
(written by the tokenizer's own `save`) and `aiayn_export.json`: the format, the engine, the
quantization, the source model's config and its search defaults, so that `aiayn translate
--model OUT` knows what OUT is and decodes with the same settings.

An export is built in a hidden temporary sibling of OUT and renamed into place at the end, so
OUT is either complete or absent; an OUT that exists and is not empty is refused up front.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiayn.atomic import atomic_write_json, check_new_dir, read_json_object
from aiayn.config import DecodeConfig, ModelConfig, from_dict, to_dict
from aiayn.errors import CheckpointError, ConfigError
from aiayn.nn.model import Transformer
from aiayn.store.model_dir import EXPORT_FILE, load_model_dir
from aiayn.text.tokenizer import Tokenizer
from aiayn.translate.translator import saved_decode_config

EXPORT_FORMAT = "aiayn-export"
EXPORT_FORMAT_VERSION = 1
ENGINES = ("ctranslate2", "onnxruntime")


def is_export_dir(directory: str | Path) -> bool:
    """Whether `directory` holds an exported model (rather than an aiayn model directory)."""
    return (Path(directory) / EXPORT_FILE).is_file()


def load_source(model_dir: Path, out: Path) -> tuple[Transformer, Tokenizer, DecodeConfig]:
    """The model, tokenizer and search defaults to export, checked to fit each other; `out` is
    refused first if it is taken, before anything is loaded."""
    check_new_dir(out)
    model = load_model_dir(model_dir, expect=Transformer)
    tok = Tokenizer.load(model_dir)
    tok.check_fits(model.cfg, str(model_dir))
    return model, tok, saved_decode_config(model_dir)


def write_export_meta(
    directory: Path,
    *,
    engine: str,
    quantization: str,
    model_cfg: ModelConfig,
    decode: DecodeConfig,
    source: Path,
    files: dict[str, str],
    versions: dict[str, str],
) -> None:
    """Write `aiayn_export.json` into `directory` (the staged export)."""
    atomic_write_json(
        directory / EXPORT_FILE,
        {
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_FORMAT_VERSION,
            "engine": engine,
            "quantization": quantization,
            "architecture": "Transformer",
            "model": to_dict(model_cfg),
            "decode": to_dict(decode),
            "source_model": str(source),
            "files": files,  # role -> file name, e.g. {"encoder": "encoder.onnx"}
            "versions": versions,  # aiayn and the engine's package at export time
        },
    )


def read_export_meta(directory: str | Path) -> dict[str, Any]:
    """Read and check `aiayn_export.json`; a missing or foreign file is a CheckpointError."""
    path = Path(directory) / EXPORT_FILE
    missing = f"{directory} is not an exported model (no {EXPORT_FILE})"
    what = ("an aiayn export", EXPORT_FORMAT, EXPORT_FORMAT_VERSION)
    meta = read_json_object(path, missing, fmt=what)
    if meta.get("engine") not in ENGINES:
        raise CheckpointError(f"{path}: unknown engine {meta.get('engine')!r}")
    return meta


def export_model_config(meta: dict[str, Any], directory: str | Path) -> ModelConfig:
    try:
        return from_dict(ModelConfig, meta["model"], "model")
    except (ConfigError, KeyError, TypeError) as e:
        raise CheckpointError(f"{directory}/{EXPORT_FILE}: bad model config: {e}") from None


def export_decode_config(meta: dict[str, Any], directory: str | Path) -> DecodeConfig:
    """The search defaults the exported model was saved with (its source model's)."""
    try:
        return from_dict(DecodeConfig, meta.get("decode", {}), "decode")
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{directory}/{EXPORT_FILE}: bad decode settings: {e}") from None


def export_engine(directory: Path) -> str | None:
    """The engine of an `aiayn export` directory (with its quantization), None otherwise."""
    if not is_export_dir(directory):
        return None
    meta = read_export_meta(directory)
    return f"{meta['engine']} ({meta.get('quantization', 'float32')})"


def export_source(directory: Path) -> Path | None:
    """The model directory an export was made from, if it is still there."""
    if not is_export_dir(directory):
        return None
    source = Path(str(read_export_meta(directory).get("source_model", "")))
    return source if source.is_dir() else None
