"""An exported model directory: what is in it (`aiayn_export.json`) and how one is written.

`aiayn export ctranslate2|onnx` turns an aiayn model directory into a directory that another
engine runs (CTranslate2, ONNX Runtime). Besides the engine's own files it holds the tokenizer
(written by the tokenizer's own `save`) and `aiayn_export.json`: the format, the engine, the
quantization, the source model's config and its search defaults, so that `aiayn translate
--model OUT` knows what OUT is and decodes with the same settings.

Reading one is `aiayn.store.directory.ModelDir`'s, as for every model directory. An export
is built in a hidden temporary sibling of OUT and renamed into place at the end, so
OUT is either complete or absent; an OUT that exists and is not empty is refused up front.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiayn.atomic import atomic_dir, atomic_write_json, check_new_dir
from aiayn.config import DecodeConfig, ModelConfig
from aiayn.config_files import to_dict
from aiayn.errors import ConfigError
from aiayn.nn.model import Transformer
from aiayn.store.directory import EXPORT_FORMAT, EXPORT_FORMAT_VERSION, ModelDir
from aiayn.store.model_dir import EXPORT_FILE
from aiayn.text.tokenizer import Tokenizer


def load_source(model_dir: Path, out: Path) -> tuple[Transformer, Tokenizer, DecodeConfig]:
    """The model, tokenizer and search defaults to export, checked to fit each other; `out` is
    refused first if it is taken, before anything is loaded."""
    check_new_dir(out)
    source = ModelDir.open(model_dir)
    model = source.load_model(Transformer)
    return model, source.tokenizer, source.decode


def source_architecture(model_dir: Path, out: Path, engine: str = "") -> str:
    """What `model_dir` holds: "Transformer" (a translator), "DecoderLM" (a language model) or,
    for `engine` "onnx", "EncoderClassifier" (a classifier: CTranslate2 has no model of that
    kind); anything else is refused in one line. `out` is refused first if it is taken."""
    check_new_dir(out)
    arch = ModelDir.open(model_dir).architecture or "Transformer"
    if arch == "EncoderClassifier" and engine != "onnx":
        raise ConfigError(
            f"{model_dir} holds EncoderClassifier (a classifier), which CTranslate2 cannot run "
            "(it has no encoder-classifier model): export it with aiayn export onnx"
        )
    if arch not in ("Transformer", "DecoderLM", "EncoderClassifier"):
        raise ConfigError(
            f"{model_dir} holds {arch}, which aiayn export does not take: it exports a "
            "Transformer (a translator), a DecoderLM (a language model) or an "
            "EncoderClassifier (a classifier, to ONNX)"
        )
    return arch


def write_export(
    out: Path, engine_files: Callable[[Path], None], tok: Tokenizer, **meta: Any
) -> Path:
    """Write an export into `out` at once (staged, then renamed: `atomic_dir`): the engine's
    files (`engine_files(staging_dir)`), the tokenizer and `aiayn_export.json` (`meta`: the
    keywords of `write_export_meta`). Returns `out`."""
    with atomic_dir(out) as tmp:
        engine_files(tmp)
        tok.save(tmp)
        write_export_meta(tmp, **meta)
    return out


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
    architecture: str = "Transformer",
    extra: dict[str, Any] | None = None,
) -> None:
    """Write `aiayn_export.json` into `directory` (the staged export). `extra`: what the
    model's class takes besides its config (a classifier's labels), as config.json's."""
    atomic_write_json(
        directory / EXPORT_FILE,
        {
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_FORMAT_VERSION,
            "engine": engine,
            "quantization": quantization,
            # "Transformer", "DecoderLM" (export_lm) or "EncoderClassifier" (export_cls)
            "architecture": architecture,
            "model": to_dict(model_cfg),
            "decode": to_dict(decode),
            "source_model": str(source),
            "files": files,  # role -> file name, e.g. {"encoder": "encoder.onnx"}
            "versions": versions,  # aiayn and the engine's package at export time
            **({"extra": extra} if extra else {}),
        },
    )
