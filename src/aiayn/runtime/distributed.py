"""The processes of one training run: the torchrun process group and stopping on a signal.

Dist / init_distributed   rank, world size and device (gloo on CPU ranks, NCCL on GPUs)
all_sum                   a sum over ranks, on the rank's device (one host sync per call;
                          on one process a plain copy that never touches the device)
stop_on_signals           Ctrl-C / SIGTERM become a flag the loop checks after each step
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from aiayn.runtime.device import resolve_device

# --- the process group -------------------------------------------------------------------------


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
    """Sum over ranks. Several ranks: one host sync, so call it per log, not per micro-batch.
    One process: a plain copy, and host values never go through the device. The loop asks
    `should_stop` after every step; a round trip through a GPU there would make the host wait
    for each step's kernels before it could queue the next step's."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return values.tolist() if isinstance(values, Tensor) else [float(v) for v in values]
    t = reduce_tensor(values, d)
    dist.all_reduce(t)
    return t.tolist()


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
