"""What a training run keeps between steps and across restarts (used by train.py).

    Dist / init_distributed   rank, world size and device under torchrun (gloo/CPU, nccl/GPU)
    TrainState                step, epoch, data position, best value, ... (JSON)
    load_data / StepLoader    the corpora, and each step's share of batches for this rank
    find_resume ...           the run directory: resume, or refuse to overwrite anything else
    stop_on_signals           Ctrl-C / SIGTERM become a flag the loop checks after each step
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from aiayn import checkpoint as ckpt_io
from aiayn.config import RUN_CONFIG_FILE, Config, TrainConfig, to_dict
from aiayn.data import (
    DataStats,
    Example,
    batch_plan,
    encode_pairs,
    padding_efficiency,
    read_parallel,
)
from aiayn.device import resolve_device
from aiayn.errors import CheckpointError, ConfigError, DataError
from aiayn.model import Transformer
from aiayn.tokenizer import TOKENIZER_FILE, Tokenizer

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
# TrainConfig fields that may differ when a run is resumed; any other difference would make
# the continuation a different experiment, so it is refused.
RESUMABLE_CHANGES = {
    "max_steps", "max_epochs", "max_minutes", "valid_every", "save_every", "log_every",
    "patience", "keep_last", "threads", "bleu_samples", "compile", "out_dir",
    "device", "dtype", "deterministic",  # how to compute, not what: a run may change machines
}



# --- distributed setup --------------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_spec: str = "auto") -> Dist:
    """This process's device, and under torchrun its rank in the process group.

    The backend follows the device: NCCL for CUDA (each rank on cuda:LOCAL_RANK, made the
    current device so NCCL's own buffers land there), gloo for the CPU. The device is checked
    before anything is created, so a missing GPU is a one-line error.
    """
    device = resolve_device(device_spec)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world <= 1:
        return Dist(device=device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), device)


def reduce_tensor(values: Tensor | list[float], d: Dist) -> Tensor:
    """`values` as the float64 tensor a reduce takes: on the rank's device (NCCL reduces only
    GPU tensors; gloo, CPU ones)."""
    return torch.as_tensor(values, dtype=torch.float64).to(d.device)


def all_sum(values: Tensor | list[float], d: Dist) -> list[float]:
    """Sum over ranks (a plain copy on one process). One host sync: call it per log, not per
    micro-batch."""
    t = reduce_tensor(values, d)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


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


# --- the data a run sees -----------------------------------------------------------------------


@dataclass
class RunData:
    train: list[Example]
    valid: list[Example]
    valid_refs: list[str]  # target text of the validation pairs, for BLEU


def load_data(tc: TrainConfig, tok: Tokenizer, d: Dist) -> RunData:
    """Read, check and encode the training and validation corpora; report what was dropped."""
    if not tc.src:
        raise ConfigError("train.src is empty: give a training corpus (two files or a TSV)")
    stats = DataStats()
    train = encode_pairs(read_parallel(tc.src, tc.tgt or None, stats), tok, tc.max_len, stats)
    _report(stats, "train", d)
    valid: list[Example] = []
    refs: list[str] = []
    if tc.valid_src:
        vstats = DataStats()
        pairs = list(read_parallel(tc.valid_src, tc.valid_tgt or None, vstats))
        kept: list[int] = []
        valid = encode_pairs(pairs, tok, tc.max_len, vstats, kept=kept)
        refs = [pairs[i][1] for i in kept]
        _report(vstats, "valid", d)
    if not train:
        raise ConfigError(f"no training pairs left after filtering {tc.src}")
    return RunData(train, valid, refs)


def _report(stats: DataStats, name: str, d: Dist) -> None:
    if d.main:
        (log.warning if stats.dropped else log.info)(stats.report(name))


class StepLoader:
    """Hands out, per optimizer step, this rank's micro-batches and the step's target tokens.

    One step consumes accum_steps × world batches of the epoch's plan; rank r takes every
    world-th of them. The plan depends only on (seed, epoch), so (epoch, batch_in_epoch) in
    `TrainState` is a complete data position. A remainder shorter than one step is skipped
    and the epoch ends at once, so `state.epoch` always counts finished epochs.
    """

    def __init__(self, data: list[Example], tc: TrainConfig, d: Dist) -> None:
        self.data, self.tc, self.d = data, tc, d
        self.per_step = tc.accum_steps * d.world
        self._plan: tuple[int, list[list[int]]] = (-1, [])

    def plan(self, epoch: int) -> list[list[int]]:
        if self._plan[0] != epoch:
            plan = batch_plan(self.data, self.tc.max_tokens, seed=self.tc.seed, epoch=epoch)
            if len(plan) < self.per_step:
                raise ConfigError(
                    f"one step needs {self.per_step} batches but an epoch has {len(plan)}; "
                    "lower train.max_tokens or train.accum_steps"
                )
            if self.d.main:
                log.info(
                    "epoch %d: %d batches, padding efficiency %.1f%%",
                    epoch + 1, len(plan), 100 * padding_efficiency(self.data, plan),
                )
            self._plan = (epoch, plan)
        return self._plan[1]

    def next_step(self, state: TrainState) -> tuple[list[list[int]], int]:
        plan = self.plan(state.epoch)
        start = state.batch_in_epoch
        chunk = plan[start : start + self.per_step]
        tokens = sum(len(self.data[i].tgt) + 1 for idx in chunk for i in idx)
        state.batch_in_epoch += self.per_step
        if state.batch_in_epoch + self.per_step > len(plan):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        return chunk[self.d.rank :: self.d.world], tokens


# --- stopping on a signal -------------------------------------------------------------------------


@contextmanager
def stop_on_signals() -> Iterator[dict[str, int]]:
    """SIGINT/SIGTERM set a flag the loop checks after each step (then save and exit)."""
    flag = {"signal": 0}

    def handler(signum: int, frame: object) -> None:
        flag["signal"] = signum
        signal.signal(signum, signal.SIG_DFL)  # a second Ctrl-C kills at once

    old = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: no handlers, the flag stays 0
        pass
    try:
        yield flag
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


# --- the run directory ----------------------------------------------------------------------------

_OWN_FILES = {TOKENIZER_FILE, RUN_CONFIG_FILE, METRICS_FILE, ckpt_io.CHECKPOINTS_DIR}


def find_resume(out: Path) -> Path | None:
    """The newest checkpoint of the run in `out`, or None for a fresh run.

    A directory with other content (a model without training state, unrelated files) is
    refused with a CheckpointError, so nothing of the user's is ever overwritten.
    """
    if not out.exists():
        return None
    if not out.is_dir():
        raise CheckpointError(f"train.out_dir {out} exists and is not a directory")
    found = ckpt_io.list_checkpoints(out)
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
    try:
        saved = json.loads((out / RUN_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{out / RUN_CONFIG_FILE} is unreadable: {e}") from None
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


def prepare_tokenizer(cfg: Config, out: Path, resume: Path | None, given: Tokenizer | None,
               d: Dist) -> Tokenizer:
    """The run's tokenizer: reloaded on resume, else given or trained on the training text."""
    if resume is not None:
        return Tokenizer.load(out)
    if d.main:
        tok = given
        if tok is None:
            tc = cfg.train
            if not tc.src:
                raise ConfigError("train.src is empty: give a training corpus (two files or a TSV)")
            texts = (side for pair in read_parallel(tc.src, tc.tgt or None) for side in pair)
            log.info("training a %d-piece %s tokenizer on %s", tc.vocab_size, tc.spm_model_type,
                     tc.src)
            tok = Tokenizer.train(texts, tc.vocab_size, tc.spm_model_type)
        out.mkdir(parents=True, exist_ok=True)
        tok.save(out)
    if d.world > 1:
        dist.barrier()
    return tok if d.main else Tokenizer.load(out)  # type: ignore[return-value]


def restore_checkpoint(
    resume: Path, model: Transformer, opt: torch.optim.Optimizer, d: Dist
) -> TrainState:
    """Load weights, optimizer and state from checkpoint `resume`; on one process, RNG too."""
    tensors, saved = ckpt_io.load_checkpoint_state(resume)
    weights = ckpt_io.load_tensors(resume / ckpt_io.WEIGHTS_FILE)
    ckpt_io.check_state_dict(model, weights, str(resume))
    model.load_state_dict(weights, strict=False)
    ckpt_io.load_optimizer_tensors(opt, tensors, saved["optimizer"], str(resume))
    names = {f.name for f in dataclasses.fields(TrainState)}
    state = TrainState(**{k: v for k, v in saved.items() if k in names})
    if d.world == 1:  # exact resume: the RNG continues where it stopped
        restore_rng(tensors, d.device)
        random.setstate(_tupled(saved["python_random"]))
    log.info("resuming %s at step %d (epoch %d)", resume, state.step, state.epoch + 1)
    return state
