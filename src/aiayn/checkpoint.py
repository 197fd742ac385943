"""The model directory: `config.json` + `model.safetensors` (+ tokenizer, + training state).

Nothing here uses pickle: weights are safetensors, everything else is JSON. Every file is
written atomically (temporary file in the same directory, fsync, rename), so a kill at any
moment leaves the previous good file in place.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from aiayn.config import ModelConfig, from_dict, to_dict
from aiayn.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from aiayn.model import _ModelBase

FORMAT = "aiayn-model"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with tied tensors stored once (under their first name), contiguous."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().contiguous().cpu()
    return out


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    atomic_write_bytes(path, st_save({k: v.contiguous() for k, v in tensors.items()}))


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; a missing or corrupt file is a CheckpointError."""
    path = Path(path)
    try:
        return st_load(path.read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"missing {path.name} in {path.parent}") from None
    except (SafetensorError, ValueError, OSError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None


def save_model_dir(model: _ModelBase, directory: str | Path) -> None:
    """Write the model's `config.json` and `model.safetensors` into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_tensors(directory / WEIGHTS_FILE, unique_state_dict(model))
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "architecture": type(model).__name__,
        "model": to_dict(model.cfg),
        "extra": model.extra_config(),
    }
    atomic_write_json(directory / CONFIG_FILE, meta)


def read_model_meta(directory: str | Path) -> dict[str, Any]:
    """Read and check `config.json`; a missing or foreign file is a CheckpointError."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"model directory not found: {directory}")
    path = directory / CONFIG_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not an aiayn model directory (no {CONFIG_FILE})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is corrupt: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an aiayn model config (format != {FORMAT!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format_version {meta.get('format_version')}; this aiayn reads {FORMAT_VERSION}"
        )
    return meta


def load_model_config(directory: str | Path) -> ModelConfig:
    meta = read_model_meta(directory)
    try:
        return from_dict(ModelConfig, meta["model"], "model")
    except (ConfigError, KeyError, TypeError) as e:
        raise CheckpointError(f"{directory}/{CONFIG_FILE}: bad model config: {e}") from None


def check_state_dict(model: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Raise a CheckpointError naming the first tensor that does not fit the model."""
    expected = unique_state_dict(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: weights do not fit the config: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    for name, ref in expected.items():
        got = tensors[name]
        if got.shape != ref.shape:
            raise CheckpointError(
                f"{where}: tensor {name} has shape {tuple(got.shape)}, config expects {tuple(ref.shape)}"
            )
        if got.dtype != ref.dtype:
            raise CheckpointError(f"{where}: tensor {name} is {got.dtype}, expected {ref.dtype}")
        if got.is_floating_point() and not torch.isfinite(got).all():
            raise CheckpointError(f"{where}: tensor {name} holds NaN or inf")


def load_model_dir(directory: str | Path, map_location: str = "cpu") -> _ModelBase:
    """Rebuild the model described by `config.json` and load its weights, checking every tensor."""
    from aiayn.model import MODEL_CLASSES

    directory = Path(directory)
    meta = read_model_meta(directory)
    cfg = load_model_config(directory)
    arch = meta.get("architecture")
    if arch not in MODEL_CLASSES:
        raise CheckpointError(f"{directory}: unknown architecture {arch!r}")
    extra = meta.get("extra") or {}
    try:
        model = MODEL_CLASSES[arch](cfg, **extra)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{directory}: cannot build {arch} from config: {e}") from None
    tensors = load_tensors(directory / WEIGHTS_FILE)
    check_state_dict(model, tensors, str(directory / WEIGHTS_FILE))
    model.load_state_dict(tensors, strict=False)  # tied aliases are filled through their twin
    model.eval()
    return model.to(map_location)
