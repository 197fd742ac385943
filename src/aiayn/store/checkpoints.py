"""A training run's checkpoints: `checkpoints/step_<N>/`, each a model directory plus the
optimizer's moments, the RNG states and `train_state.json`; listed, pruned, and averaged into a
new model directory. Each is written by `atomic_dir`, so a kill leaves the previous ones whole.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from aiayn.atomic import (
    atomic_dir,
    atomic_write_bytes,
    atomic_write_json,
    check_new_dir,
    clear_stale,
    read_json_object,
    remove_dir,
)
from aiayn.config_files import RUN_CONFIG_FILE
from aiayn.errors import CheckpointError
from aiayn.nn.model import _ModelBase
from aiayn.store.model_dir import (
    WEIGHTS_FILE,
    load_model_dir,
    load_tensors,
    read_model_meta,
    save_model_dir,
    save_tensors,
)
from aiayn.text.tokenizer import TOKENIZER_FILES

log = logging.getLogger(__name__)

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
    return sorted(found, key=checkpoint_step)


def checkpoint_step(ckpt: Path) -> int:
    """The step a checkpoint directory (`step_00001234`) was saved at."""
    return int(ckpt.name[5:])


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (at least one is always kept)."""
    for old in list_checkpoints(run_dir)[: -max(keep, 1)]:
        remove_dir(old)


def load_checkpoint_state(ckpt: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors (`optim.*`, `rng.*`) and JSON state of one checkpoint, checked."""
    ckpt = Path(ckpt)
    path = ckpt / STATE_FILE
    missing = f"{ckpt} has no {STATE_FILE}: not a training checkpoint"
    state = read_json_object(path, missing, fmt=("an aiayn training state", STATE_FORMAT, None))
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
    dirs = [Path(d) for d in dirs]
    _check_one_vocabulary(dirs)
    seen: set[Path] = set()
    for d in dirs:
        if d.resolve() in seen:
            log.warning("%s is given more than once: it counts that many times in the mean", d)
        seen.add(d.resolve())
    averaged = average_checkpoints(dirs)
    model = load_model_dir(dirs[0])
    model.load_state_dict(averaged, strict=False)
    with atomic_dir(out, replace=replace) as tmp:
        save_model_dir(model, tmp)
        # The tokenizer and the run's recipe (whose [decode] table gives the model its search
        # settings) sit in a model dir, or in the run dir above a checkpoint.
        for names in (TOKENIZER_FILES, (RUN_CONFIG_FILE,)):
            for place, found in _files_of(dirs[0], names):
                for name in found:
                    atomic_write_bytes(tmp / name, (place / name).read_bytes())
    return out


def _files_of(model: Path, names: tuple[str, ...]) -> list[tuple[Path, list[str]]]:
    """Where the files `names` of a model directory or checkpoint are: the directory itself,
    else the run directory above a checkpoint; [(place, the names found there)], or [].
    A tokenizer's files (one, or Marian's three) are taken together from one place."""
    for place in (model, model.parent.parent):
        found = [name for name in names if (place / name).is_file()]
        if found:
            return [(place, found)]
    return []


def _check_one_vocabulary(dirs: list[Path]) -> None:
    """Averaging is for checkpoints of one run: weights of models whose tokenizers differ
    give each embedding row the mean of different pieces' vectors (the config, which holds
    only the vocabulary's size, cannot tell)."""
    first: bytes | None = None
    for d in dirs:
        tokenizer = b"".join(
            (place / name).read_bytes()
            for place, found in _files_of(d, TOKENIZER_FILES)
            for name in found
        )
        if first is None:
            first = tokenizer
        elif tokenizer and first and tokenizer != first:
            raise CheckpointError(
                f"{d} has another tokenizer than {dirs[0]}: checkpoints of different runs "
                "cannot be averaged"
            )
