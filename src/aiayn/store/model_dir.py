"""The model directory: `config.json` + `model.safetensors` (+ tokenizer, + run_config.json).

    save_model_dir / load_model_dir    a model's architecture and weights, checked on load
    aiayn.store.checkpoints            a training run's checkpoints (each a model directory too)
    aiayn.store.run_dir                the run directory: resume it, or refuse to overwrite

Nothing here uses pickle: weights are safetensors, everything else is JSON. Every file is
written atomically (`aiayn.atomic`: temporary file in the same directory, fsync, rename), so a
kill at any moment leaves the previous good file in place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, overload

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from aiayn.atomic import atomic_write_bytes, atomic_write_json, read_json_object
from aiayn.config import ModelConfig
from aiayn.config_files import from_dict, to_dict
from aiayn.errors import CheckpointError, ConfigError
from aiayn.nn.embeddings import position_table_bytes
from aiayn.nn.model import _ModelBase
from aiayn.nn.variants import MODEL_CLASSES
from aiayn.runtime.device import require_memory

M = TypeVar("M", bound=_ModelBase)
FORMAT = "aiayn-model"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
EXPORT_FILE = "aiayn_export.json"  # what marks an `aiayn export` directory (interop.export_dir)


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
        if directory.exists():  # a weights file given for its directory, say
            raise CheckpointError(f"{directory} is a file; give the model directory it is in")
        raise CheckpointError(f"model directory not found: {directory}")
    if (directory / EXPORT_FILE).is_file():  # its config.json is the engine's
        raise CheckpointError(
            f"{directory} was written by aiayn export (translate, evaluate "
            "and serve run it); give the aiayn model directory it came from"
        )
    missing = f"{directory} is not an aiayn model directory (no {CONFIG_FILE})"
    meta = read_json_object(
        directory / CONFIG_FILE, missing, fmt=("an aiayn model config", FORMAT, FORMAT_VERSION)
    )
    return meta


def load_model_config(directory: str | Path) -> ModelConfig:
    return model_config_of(read_model_meta(directory), directory)


def model_config_of(
    meta: dict[str, Any], directory: str | Path, name: str = CONFIG_FILE
) -> ModelConfig:
    """The model config in a `config.json` (or `name`, e.g. `aiayn_export.json`) already read."""
    try:
        return from_dict(ModelConfig, meta["model"], "model")
    except (ConfigError, KeyError, TypeError) as e:
        raise CheckpointError(f"{directory}/{name}: bad model config: {e}") from None


def check_state_dict(model: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Raise a CheckpointError naming the first tensor that does not fit the model."""
    expected = unique_state_dict(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: weights do not fit the config: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    for name, ref in expected.items():
        got = tensors[name]
        if got.shape != ref.shape:
            raise CheckpointError(
                f"{where}: tensor {name} has shape {tuple(got.shape)}, "
                f"config expects {tuple(ref.shape)}"
            )
        if got.dtype != ref.dtype:
            raise CheckpointError(f"{where}: tensor {name} is {got.dtype}, expected {ref.dtype}")
        if got.is_floating_point() and not torch.isfinite(got).all():
            raise CheckpointError(f"{where}: tensor {name} holds NaN or inf")


def check_weights_header(path: Path, cfg: ModelConfig, extra: dict[str, Any]) -> None:
    """Check the sizes in `config.json` against the safetensors header, reading no tensor.

    Building a model allocates what the config says, so a config that claims d_model=10^9
    would fail with an out-of-memory error (or worse, succeed slowly) before the weights are
    ever compared. Here every size that scales an allocation (vocab_size, d_model, d_ff,
    n_layers, a learned max_len, n_classes) must match a tensor in the file, so the model built
    afterwards is no bigger than the weights on disk. `check_state_dict` checks every tensor
    once the model exists.
    """
    try:
        with safe_open(path, framework="pt") as f:
            names = f.keys()  # a list; a safe_open handle itself is not iterable
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in names}
    except FileNotFoundError:
        raise CheckpointError(f"missing {path.name} in {path.parent}") from None
    except (SafetensorError, ValueError, OSError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None

    def mismatch(field: str, value: object, holds: str) -> CheckpointError:
        return CheckpointError(
            f"{path.parent}: {CONFIG_FILE} says {field}={value} but {path.name} holds {holds}"
        )

    def ending(suffix: str) -> dict[str, tuple[int, ...]]:
        return {n: s for n, s in shapes.items() if n.endswith(suffix)}

    tokens, w_1 = ending(".tokens.weight"), ending(".ffn.w_1.weight")
    if not tokens or not w_1:
        raise CheckpointError(f"{path} holds no aiayn token embeddings or feed-forward layers")
    for name, shape in tokens.items():
        if len(shape) != 2:
            raise CheckpointError(f"{path}: {name} has shape {shape}, not (vocab, d_model)")
        if shape[1] != cfg.d_model:
            raise mismatch("d_model", cfg.d_model, f"{shape[1]}-wide embeddings ({name})")
        if shape[0] != cfg.vocab_size:
            raise mismatch("vocab_size", cfg.vocab_size, f"{shape[0]} token embeddings ({name})")
    for name, shape in w_1.items():
        if shape != (cfg.d_hidden, cfg.d_model):  # d_hidden: a gated FFN's matched width
            raise mismatch("d_ff", cfg.d_ff, f"{name} of shape {shape}")
    layers: dict[str, set[str]] = {}  # stack ("encoder", "decoder") -> layer indices
    for name in shapes:
        stack, _, rest = name.partition(".layers.")
        if rest:
            layers.setdefault(stack, set()).add(rest.split(".", 1)[0])
    for stack, indices in sorted(layers.items()):
        if len(indices) != cfg.n_layers:
            raise mismatch("n_layers", cfg.n_layers, f"{len(indices)} {stack} layers")
    if cfg.positional == "learned":
        learned = ending(".learned.weight")
        for name, shape in learned.items():
            if shape != (cfg.max_len, cfg.d_model):
                raise mismatch("max_len", cfg.max_len, f"{name} of shape {shape}")
        if not learned:
            raise mismatch("positional", "'learned'", "no learned position table")
    n_classes = extra.get("n_classes")
    if n_classes is not None:
        got = shapes.get("classifier.weight", (None,))[0]
        if got != n_classes:
            raise mismatch("n_classes", n_classes, f"a classifier for {got} classes")


def check_position_table(cfg: ModelConfig, error: type[Exception] = CheckpointError) -> None:
    """Refuse a config whose sinusoidal table cannot be computed in this machine's memory. No
    weight's shape bounds the table (it is never saved), so a config's max_len alone sizes it:
    one of 10^9 rows would be a 512 GB allocation."""
    require_memory(
        position_table_bytes(cfg),
        torch.device("cpu"),
        lambda need, have: (
            f"a sinusoidal table of max_len={cfg.max_len:,} positions x d_model={cfg.d_model} "
            f"needs {need:,.1f} GiB while it is computed, more than this machine's "
            f"{have:,.1f} GiB: choose a smaller max_len"
        ),
        error,
    )


def check_fits_in_memory(directory: Path, cfg: ModelConfig) -> None:
    """Refuse, before anything is allocated, weights that loading cannot hold in this machine's
    memory: the model's parameters (the header check has matched them to the file) and the
    file's tensors read beside them, twice the file; and the one size no weight bounds, a
    sinusoidal table's `max_len`."""
    check_position_table(cfg)
    size = (directory / WEIGHTS_FILE).stat().st_size
    require_memory(
        2 * size,
        torch.device("cpu"),
        lambda _, have: (
            f"{directory}: {WEIGHTS_FILE} holds {size / 2**30:,.1f} GiB, and loading holds it "
            f"twice (the model built from {CONFIG_FILE} and the file read beside it), more "
            f"than this machine's {have:,.1f} GiB"
        ),
        CheckpointError,
    )


@overload
def load_model_dir(
    directory: str | Path, map_location: str | torch.device = "cpu", expect: None = None
) -> _ModelBase: ...
@overload
def load_model_dir(
    directory: str | Path, map_location: str | torch.device = "cpu", *, expect: type[M]
) -> M: ...
def load_model_dir(
    directory: str | Path,
    map_location: str | torch.device = "cpu",
    expect: type[_ModelBase] | None = None,
) -> _ModelBase:
    """Rebuild the model described by `config.json` and load its weights, checking every tensor.

    `expect` names the architecture the caller needs, e.g. `load_model_dir(d, expect=Transformer)`
    for translation: a directory holding another one is a CheckpointError.
    """
    directory = Path(directory)
    meta = read_model_meta(directory)
    return build_model(directory, meta, model_config_of(meta, directory), map_location, expect)


def build_model(
    directory: Path,
    meta: dict[str, Any],
    cfg: ModelConfig,
    map_location: str | torch.device = "cpu",
    expect: type[_ModelBase] | None = None,
) -> _ModelBase:
    """`load_model_dir` for a `config.json` already read (`meta`, holding `cfg`)."""
    arch = meta.get("architecture")
    if arch not in MODEL_CLASSES:
        raise CheckpointError(f"{directory}: unknown architecture {arch!r}")
    extra = meta.get("extra") or {}
    check_weights_header(directory / WEIGHTS_FILE, cfg, extra)  # before anything is allocated
    check_fits_in_memory(directory, cfg)
    try:
        model = MODEL_CLASSES[arch](cfg, **extra)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{directory}: cannot build {arch} from config: {e}") from None
    if expect is not None and not isinstance(model, expect):
        raise CheckpointError(f"{directory} holds a {arch}, not a {expect.__name__}")
    tensors = load_tensors(directory / WEIGHTS_FILE)
    check_state_dict(model, tensors, str(directory / WEIGHTS_FILE))
    model.load_state_dict(tensors, strict=False)  # tied aliases are filled through their twin
    model.eval()
    return model.to(map_location)
