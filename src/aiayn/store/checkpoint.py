"""The model directory: `config.json` + `model.safetensors` (+ tokenizer, + training state).

    save_model_dir / load_model_dir    a model's architecture and weights
    save_checkpoint / restore_checkpoint   a training run's full state, resumable exactly
    find_resume / check_resumable      the run directory: resume it, or refuse to overwrite

Nothing here uses pickle: weights are safetensors, everything else is JSON. Every file is
written atomically (`aiayn.atomic`: temporary file in the same directory, fsync, rename), so a
kill at any moment leaves the previous good file in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from aiayn.atomic import (
    atomic_dir,
    atomic_write_bytes,
    atomic_write_json,
    check_new_dir,
    clear_stale,
    remove_dir,
)
from aiayn.config import (
    RUN_CONFIG_FILE,
    Config,
    ModelConfig,
    TrainConfig,
    from_dict,
    read_run_config,
    to_dict,
)
from aiayn.errors import CheckpointError, ConfigError, DataError
from aiayn.nn.model import _ModelBase
from aiayn.nn.variants import MODEL_CLASSES
from aiayn.runtime.distributed import Dist
from aiayn.text.data import HELDOUT_FILES
from aiayn.text.tokenizer import TOKENIZER_FILES

log = logging.getLogger(__name__)
M = TypeVar("M", bound=_ModelBase)

FORMAT = "aiayn-model"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


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
        raise CheckpointError(
            f"{directory} is not an aiayn model directory (no {CONFIG_FILE})"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is corrupt: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an aiayn model config (format != {FORMAT!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format_version {meta.get('format_version')}; "
            f"this aiayn reads {FORMAT_VERSION}"
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
        if shape != (cfg.d_ff, cfg.d_model):
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
    cfg = load_model_config(directory)
    arch = meta.get("architecture")
    if arch not in MODEL_CLASSES:
        raise CheckpointError(f"{directory}: unknown architecture {arch!r}")
    extra = meta.get("extra") or {}
    check_weights_header(directory / WEIGHTS_FILE, cfg, extra)  # before anything is allocated
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


# --- training state: optimizer, step, RNG, data position (resumable runs) ---------------------
# A run directory is a model directory (the best weights) plus `checkpoints/step_XXXXXXXX/`,
# each itself a model directory with `optimizer.safetensors` (optimizer moments, RNG state)
# and `train_state.json` (step, epoch, data position, best metric, ...). A checkpoint is built
# in a hidden temporary directory and renamed into place, so it is either complete or absent.

CHECKPOINTS_DIR = "checkpoints"
OPTIM_FILE = "optimizer.safetensors"
STATE_FILE = "train_state.json"
STATE_FORMAT = "aiayn-train-state"


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split `optimizer.state_dict()` into tensors (for safetensors) and JSON metadata."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in sd["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict, where: str
) -> None:
    """Inverse of `optimizer_tensors`; a state that does not fit the model is a CheckpointError."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = value
    for idx, values in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(values)
    own = optimizer.state_dict()["param_groups"]
    groups = meta.get("param_groups", [])
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in own]:
        raise CheckpointError(f"{where}: optimizer state does not fit this model's parameters")
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{where}: bad optimizer state: {e}") from None


def save_checkpoint(
    run_dir: str | Path,
    model: _ModelBase,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    rng: dict[str, torch.Tensor],
) -> Path:
    """Write `checkpoints/step_<state["step"]>` atomically (`atomic_dir`: complete or absent).

    The same step saved twice (interrupted right after a save, then resumed) is replaced."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    clear_stale(root, "step_*")  # left by a kill during an earlier save
    with atomic_dir(root / f"step_{int(state['step']):08d}", replace=True) as tmp:
        save_model_dir(model, tmp)
        opt_tensors, opt_meta = optimizer_tensors(optimizer)
        rng_named = {f"rng.{k}": v for k, v in rng.items()}
        save_tensors(tmp / OPTIM_FILE, {**opt_tensors, **rng_named})
        state_json = {"format": STATE_FORMAT, "optimizer": opt_meta, **state}
        atomic_write_json(tmp / STATE_FILE, state_json)
    return root / f"step_{int(state['step']):08d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary directories are ignored)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (at least one is always kept)."""
    for old in list_checkpoints(run_dir)[: -max(keep, 1)]:
        remove_dir(old)


def load_checkpoint_state(ckpt: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors (`optim.*`, `rng.*`) and JSON state of one checkpoint, checked."""
    ckpt = Path(ckpt)
    path = ckpt / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt} has no {STATE_FILE}: not a training checkpoint") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is corrupt: {e}") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path} is not an aiayn training state")
    for key in ("step", "epoch", "batch_in_epoch", "optimizer"):
        if key not in state:
            raise CheckpointError(f"{path} is missing {key!r}")
    return load_tensors(ckpt / OPTIM_FILE), state


def average_checkpoints(dirs: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the weights of several model directories (Vaswani et al. §6.1).

    All must share one config (same tensor names and shapes); the sum is taken in float64.
    """
    if not dirs:
        raise CheckpointError("no checkpoints to average")
    first_cfg = read_model_meta(dirs[0])["model"]
    total: dict[str, torch.Tensor] = {}
    for d in dirs:
        if read_model_meta(d)["model"] != first_cfg:
            raise CheckpointError(f"{d} has a different model config from {dirs[0]}")
        tensors = load_tensors(Path(d) / WEIGHTS_FILE)
        if total and set(tensors) != set(total):
            raise CheckpointError(f"{d} holds different tensors from {dirs[0]}")
        for name, t in tensors.items():
            total[name] = total.get(name, 0) + t.double()
    ref = load_tensors(Path(dirs[0]) / WEIGHTS_FILE)
    return {name: (t / len(dirs)).to(ref[name].dtype) for name, t in total.items()}


def write_average(dirs: list[Path], out: str | Path, *, replace: bool = False) -> Path:
    """Average the weights of `dirs` into a new model directory `out` (tokenizer, recipe copied).

    `out` must not exist, or be an empty directory, unless `replace` (a training run's own
    `averaged/`, replaced whole when a finished run is rerun); the directory appears whole or
    not at all (`atomic_dir`: a crash leaves no half-written model).
    """
    out = Path(out)
    if not replace:
        check_new_dir(out)  # before the work, not after it
    averaged = average_checkpoints(dirs)
    model = load_model_dir(dirs[0])
    model.load_state_dict(averaged, strict=False)
    first = Path(dirs[0])
    with atomic_dir(out, replace=replace) as tmp:
        save_model_dir(model, tmp)
        # The tokenizer and the run's recipe (whose [decode] table gives the model its search
        # settings) sit in a model dir, or in the run dir above a checkpoint.
        # The tokenizer's files (one, or Marian's three) are taken together from one place.
        for names in (TOKENIZER_FILES, (RUN_CONFIG_FILE,)):
            for place in (first, first.parent.parent):
                found = [name for name in names if (place / name).is_file()]
                for name in found:
                    atomic_write_bytes(tmp / name, (place / name).read_bytes())
                if found:
                    break
    return out


# --- a training run: its state, its directory, resuming it ------------------------------------

METRICS_FILE = "metrics.jsonl"
# TrainConfig fields that may differ when a run is resumed; any other difference would make
# the continuation a different experiment, so it is refused.
RESUMABLE_CHANGES = {
    "max_steps",
    "max_epochs",
    "max_minutes",
    "valid_every",
    "save_every",
    "log_every",
    "patience",
    "keep_last",
    "threads",
    "bleu_samples",
    "compile",
    "out_dir",
    "device",
    "dtype",
    "deterministic",  # how to compute, not what: a run may change machines
}


# --- state that survives a restart --------------------------------------------------------------


@dataclass
class TrainState:
    """Everything besides weights and optimizer moments that resuming needs (JSON)."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of this epoch's plan already consumed (all ranks)
    best: float | None = None  # best validation value of `best_metric`
    best_step: int = 0
    bad_validations: int = 0  # validations in a row without improvement (early stopping)
    tokens: int = 0  # target tokens trained on
    elapsed_s: float = 0.0
    # lr_schedule = "cosine_budget": its fitted schedule (aiayn.training.train.BudgetPlan), so that a
    # resume follows it: the step it ends at (0 = not fitted yet), the step it was fitted at,
    # where its warmup ends (0 in checkpoints from before it was recorded), and the last re-fit
    total_steps: int = 0
    fit_step: int = 0
    warmup_end: int = 0
    refit_step: int = 0
    refit_progress: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "python_random": _jsonable(random.getstate())}


def _jsonable(x: Any) -> Any:
    return [_jsonable(v) for v in x] if isinstance(x, tuple | list) else x


def _tupled(x: Any) -> Any:
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x


def rng_tensors(device: torch.device) -> dict[str, Tensor]:
    """The generators a step draws from: the CPU's, and the GPU's when training on one."""
    states = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def restore_rng(tensors: dict[str, Tensor], device: torch.device) -> None:
    """Continue the generators saved by `rng_tensors`, where the run's device allows it.

    A run saved on a GPU and resumed on the CPU (or the reverse) resumes with the same weights
    and data position, but its dropout masks come from another generator: bit-exactness holds
    on the same kind of device only.
    """
    torch.set_rng_state(tensors["rng.torch"])
    saved_on_gpu = "rng.cuda" in tensors
    if saved_on_gpu and device.type == "cuda":
        torch.cuda.set_rng_state(tensors["rng.cuda"], device)
    elif saved_on_gpu != (device.type == "cuda"):
        log.info("resuming on %s a run saved on %s: same weights and data position, other "
                 "dropout masks (exact resume needs the same kind of device)", device.type,
                 "cuda" if saved_on_gpu else "cpu")  # fmt: skip


# --- the run directory ----------------------------------------------------------------------------

AVERAGED_DIR = "averaged"  # the averaged model a cosine_budget run writes at its end
_OWN_FILES = {*TOKENIZER_FILES, *HELDOUT_FILES, RUN_CONFIG_FILE, METRICS_FILE, CHECKPOINTS_DIR}


def find_resume(out: Path) -> Path | None:
    """The newest checkpoint of the run in `out`, or None for a fresh run.

    A directory with other content (a model without training state, unrelated files) is
    refused with a CheckpointError, so nothing of the user's is ever overwritten.
    """
    if not out.exists():
        return None
    if not out.is_dir():
        raise CheckpointError(f"train.out_dir {out} exists and is not a directory")
    found = list_checkpoints(out)
    if found:
        if not (out / RUN_CONFIG_FILE).is_file():
            raise CheckpointError(f"{out} has checkpoints but no {RUN_CONFIG_FILE}")
        return found[-1]
    foreign = sorted(p.name for p in out.iterdir() if p.name not in _OWN_FILES)
    if foreign:
        raise CheckpointError(
            f"{out} is not empty and holds no training checkpoint ({', '.join(foreign[:3])}); "
            "refusing to overwrite it: choose a new train.out_dir"
        )
    return None  # only files of a run that died before its first checkpoint: start again


DATA_FIELDS = ("src", "tgt", "valid_src", "valid_tgt")


def data_fingerprint(tc: TrainConfig) -> dict[str, str]:
    """The sha256 of each data file the run reads, saved in run_config.json as `data_sha256`.

    A resume compares contents, not paths: the corpus may move (a new disk, a renamed
    directory), but an edited corpus would silently make the continuation another experiment.
    """
    digests = {}
    for name in DATA_FIELDS:
        path = getattr(tc, name)
        if not path:
            continue
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError as e:
            raise DataError(f"train.{name}: cannot read {path}: {e.strerror}") from None
        digests[name] = digest.hexdigest()
    return digests


def check_resumable(out: Path, cfg: Config, fingerprint: dict[str, str]) -> None:
    """Refuse to resume under a model, recipe or data that differs from the one saved."""
    saved = read_run_config(out)
    saved_sha = saved.get("data_sha256", {})  # absent in runs from before it was recorded
    if not isinstance(saved_sha, dict):
        raise CheckpointError(f"{out / RUN_CONFIG_FILE}: data_sha256 is not a table")
    # Data checked by content may have moved; without a recorded digest, the path must match.
    movable = RESUMABLE_CHANGES | {f for f in DATA_FIELDS if f in saved_sha}
    now = to_dict(cfg)
    diffs = [
        f"train.{name} {getattr(cfg.train, name)} differs from the file the run started with"
        for name, digest in saved_sha.items()
        if fingerprint.get(name) != digest
    ] + [
        f"{section}.{k} was {saved.get(section, {}).get(k)!r}, now {v!r}"
        for section in ("model", "train")
        for k, v in now[section].items()
        if saved.get(section, {}).get(k) != v and not (section == "train" and k in movable)
    ]
    if diffs:
        raise CheckpointError(
            f"cannot resume {out} with a different config: {'; '.join(diffs[:3])} "
            "(set them back, or choose a new train.out_dir)"
        )


def restore_checkpoint(
    resume: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, d: Dist
) -> TrainState:
    """Load weights, optimizer and state from checkpoint `resume`; on one process, RNG too."""
    tensors, saved = load_checkpoint_state(resume)
    weights = load_tensors(resume / WEIGHTS_FILE)
    check_state_dict(model, weights, str(resume))
    model.load_state_dict(weights, strict=False)
    load_optimizer_tensors(opt, tensors, saved["optimizer"], str(resume))
    names = {f.name for f in dataclasses.fields(TrainState)}
    state = TrainState(**{k: v for k, v in saved.items() if k in names})
    if d.world == 1:  # exact resume: the RNG continues where it stopped
        restore_rng(tensors, d.device)
        random.setstate(_tupled(saved["python_random"]))
    log.info("resuming %s at step %d (epoch %d)", resume, state.step, state.epoch + 1)
    return state
