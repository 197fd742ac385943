"""A training run's directory: the state that survives a restart (`TrainState`, RNG streams),
finding the checkpoint to resume from, and refusing to resume into a different experiment
(changed recipe, changed data) or to overwrite another run's files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.config import Config, TrainConfig
from aiayn.config_files import RUN_CONFIG_FILE, read_run_config, to_dict
from aiayn.errors import CheckpointError, DataError
from aiayn.runtime.distributed import Dist
from aiayn.store.checkpoints import (
    CHECKPOINTS_DIR,
    list_checkpoints,
    load_checkpoint_state,
    load_optimizer_tensors,
)
from aiayn.store.model_dir import WEIGHTS_FILE, check_state_dict, load_tensors
from aiayn.text.corpus import HELDOUT_FILES
from aiayn.text.lm_data import text_paths
from aiayn.text.tokenizer import TOKENIZER_FILES

log = logging.getLogger(__name__)

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
    "choose_alpha",  # what the end does with the averaged model, not what is trained
}


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
    # lr_schedule = "cosine_budget": its fitted schedule (training.schedule.BudgetPlan), so that a
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
        log.info(
            "resuming on %s a run saved on %s: same weights and data position, other "
            "dropout masks (exact resume needs the same kind of device)",
            device.type,
            "cuda" if saved_on_gpu else "cpu",
        )


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


DATA_FIELDS = ("src", "tgt", "valid_src", "valid_tgt", "text", "valid_text", "data", "valid_data")


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
        # a language model's text may be several files (aiayn.text.lm_data.text_paths)
        files = text_paths(path) if name in ("text", "valid_text") else [path]
        try:
            for file in files:
                with open(file, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
        except OSError as e:
            raise DataError(f"train.{name}: cannot read {path}: {e.strerror}") from None
        digests[name] = digest.hexdigest()
    return digests


def _defaults(section: object) -> dict[str, Any]:
    """The default of each field of a config dataclass that has one, as `to_dict` writes it."""
    return json.loads(
        json.dumps(
            {
                f.name: f.default
                for f in dataclasses.fields(section)  # type: ignore[arg-type]
                if f.default is not dataclasses.MISSING
            }
        )
    )


def check_resumable(out: Path, cfg: Config, fingerprint: dict[str, str]) -> None:
    """Refuse to resume under a model, recipe or data that differs from the one saved."""
    saved = read_run_config(out)
    saved_sha = saved.get("data_sha256", {})  # absent in runs from before it was recorded
    if not isinstance(saved_sha, dict):
        raise CheckpointError(f"{out / RUN_CONFIG_FILE}: data_sha256 is not a table")
    # Data checked by content may have moved; without a recorded digest, the path must match.
    movable = RESUMABLE_CHANGES | {f for f in DATA_FIELDS if f in saved_sha}
    now = to_dict(cfg)
    # A field added to aiayn after the run started is absent from its run_config.json; its
    # default keeps the old behaviour (new options start off), so the default is what it ran.
    was = {
        section: {**_defaults(getattr(cfg, section)), **saved.get(section, {})}
        for section in ("model", "train")
    }
    diffs = [
        f"train.{name} {getattr(cfg.train, name)} differs from the file the run started with"
        for name, digest in saved_sha.items()
        if fingerprint.get(name) != digest
    ] + [
        f"{section}.{k} was {was[section].get(k)!r}, now {v!r}"
        for section in ("model", "train")
        for k, v in now[section].items()
        if was[section].get(k) != v and not (section == "train" and k in movable)
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
