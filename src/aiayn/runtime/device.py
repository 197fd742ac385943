"""Where the model runs and in which precision: the one owner of both choices.

    resolve_device("auto")            cuda (this process's LOCAL_RANK under torchrun), else
                                      mps, else cpu; "cuda:7" on a one-GPU machine is an error
    choose_precision("auto", device)  bf16 autocast where the hardware computes bf16 natively,
                                      fp32 otherwise, with the reason in words

Native bf16 means: a CUDA GPU of compute capability 8.0 or newer (Ampere, Hopper, ...), or a
CPU with AVX512-BF16 or AMX tiles. Elsewhere bf16 autocast is emulated: measured on a CPU
with AVX2 only, one training step took 37.8x as long as in fp32. So "auto" never picks
it there, and asking for it anyway trains, with a warning.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal

import torch

from aiayn.config import check_threads
from aiayn.errors import ConfigError

log = logging.getLogger(__name__)

DTYPES = ("auto", "fp32", "bf16")
_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda)(?::(\d+))?$")


class DeviceError(ConfigError):
    """A device that is not on this machine, or a name that is not a device."""


def resolve_device(spec: str = "auto") -> torch.device:
    """The torch.device for `spec` (auto | cpu | cuda | cuda:N | mps), checked against the machine.

    "auto" and a bare "cuda" mean this process's GPU: `cuda:$LOCAL_RANK` under torchrun.
    """
    m = _DEVICE_RE.match(spec.strip().lower())
    if m is None:
        raise DeviceError(f"device {spec!r}: choose auto, cpu, cuda, cuda:N or mps")
    kind, index = m.group(1), m.group(2)
    if index is not None and kind != "cuda":
        raise DeviceError(f"device {spec!r}: only cuda takes an index (cuda:N)")
    if kind == "auto":
        if torch.cuda.is_available():
            kind = "cuda"
        elif _mps_available():
            kind = "mps"
        else:
            return torch.device("cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if not _mps_available():
            raise DeviceError(f"device {spec!r}: this machine has no Apple MPS device")
        return torch.device("mps")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise DeviceError(f"device {spec!r}: no CUDA GPU is available (torch {build})")
    n = torch.cuda.device_count()
    i = int(index) if index is not None else int(os.environ.get("LOCAL_RANK", "0"))
    if i >= n:
        raise DeviceError(
            f"device {spec!r} means cuda:{i}, but this machine has {n} CUDA "
            f"device{'s' if n != 1 else ''} (cuda:0..cuda:{n - 1})"
        )
    return torch.device("cuda", i)


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def cpu_native_bf16() -> bool:
    """True when this CPU computes bf16 in hardware (AVX512-BF16 or AMX), as torch reports it."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether `device` computes bf16 natively, and what was found, in words."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        return major >= 8, f"{name} (compute capability {major}.{minor})"
    if device.type == "cpu":
        isa = torch.backends.cpu.get_cpu_capability()
        if cpu_native_bf16():
            return True, f"CPU with native bf16 (AVX512-BF16 or AMX; torch reports {isa})"
        return False, f"CPU without native bf16 (no AVX512-BF16 or AMX; torch reports {isa})"
    return False, f"{device.type} (bf16 autocast support varies)"


@dataclass(frozen=True)
class Precision:
    """The chosen arithmetic: `dtype` is what autocast computes matmuls in; `tf32` lets CUDA
    run fp32 matmuls on tensor cores (10-bit mantissa); `why` says how it was chosen."""

    device: torch.device
    dtype: Literal["fp32", "bf16"]
    tf32: bool
    why: str

    def autocast(self) -> AbstractContextManager[object]:
        """The context for forward passes: bf16 autocast, or nothing for fp32."""
        if self.dtype == "bf16":
            return torch.autocast(self.device.type, torch.bfloat16)
        return nullcontext()

    def apply(self) -> None:
        """Set the process-wide TF32 switches for this choice (they are global in torch)."""
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
            torch.backends.cudnn.allow_tf32 = self.tf32

    def to_json(self) -> dict[str, object]:
        return {"device": str(self.device), "dtype": self.dtype, "tf32": self.tf32, "why": self.why}


def choose_precision(
    requested: str, device: torch.device, what: str = "dtype", *, decoding: bool = False
) -> Precision:
    """The precision for `requested` (auto | fp32 | bf16) on `device`.

    auto: bf16 autocast where the hardware has it natively, else fp32 (with TF32 on a CUDA GPU
    that lacks bf16). For `decoding` on a CPU, auto is fp32 even with native bf16: the decoder's
    CPU fast path is oneDNN-prepacked fp32 weights, which autocast would bypass, and bf16
    decoding measured slower there (1.1-1.3x the time, docs/decoding.md).
    An explicit "fp32" is strict fp32, TF32 off: what parity checks want. An explicit "bf16"
    where it is only emulated is honoured, with a warning.
    """
    if requested not in DTYPES:
        raise ConfigError(f"{what}={requested!r}: choose one of {list(DTYPES)}")
    native, found = native_bf16(device)
    if requested == "fp32":
        return Precision(device, "fp32", False, f"fp32 as asked, on {found}")
    if requested == "bf16":
        if not native:
            log.warning(
                "%s='bf16' on a %s: bf16 is emulated there and much slower than fp32 "
                "(37.8x per training step on an AVX2-only CPU); '%s=auto' picks fp32 here",
                what,
                found,
                what,
            )
        return Precision(device, "bf16", False, f"bf16 autocast as asked, on {found}")
    if native and decoding and device.type == "cpu":
        return Precision(device, "fp32", False, f"auto: fp32 for decoding on a {found}")
    if native:
        return Precision(device, "bf16", False, f"auto: bf16 autocast, native on {found}")
    tf32 = device.type == "cuda"
    extra = " with TF32 matmuls" if tf32 else ""
    return Precision(device, "fp32", tf32, f"auto: fp32{extra}, no native bf16 on {found}")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: `taskset`, a container's cpuset), which
    can be fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call (macOS, Windows)
        return os.cpu_count() or 1


def set_threads(n: int, name: str = "--threads") -> None:
    """torch's intra-op threads: n > 0 sets them, 0 leaves torch's default.

    More threads than usable CPUs is allowed but said: the threads then take turns on a core,
    and each wait at a product's barrier costs a scheduler slice (--threads 1000 on one core
    trained at 76 target tokens/s against thousands)."""
    check_threads(n, name)
    cpus = usable_cpus()
    if n > cpus:
        log.warning(
            "%s=%d is more than the %d CPU%s this process may use: the threads will take "
            "turns and run much slower; give %d or fewer",
            name,
            n,
            cpus,
            "" if cpus == 1 else "s",
            cpus,
        )
    if n:
        torch.set_num_threads(n)


def total_memory(device: torch.device) -> int | None:
    """Bytes of memory `device` has in all: a GPU's own, or the machine's RAM for the CPU (and
    for Apple's unified memory); None where it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        return None


def require_memory(
    need: int, device: torch.device, refusal: Callable[[float, float], str], error: type[Exception]
) -> None:
    """The one memory guard: raise `error(refusal(need_gib, have_gib))` when `need` bytes are
    more than `device` has in all. Callers size what they are about to allocate (on the meta
    device, from a config or a file's size) before anything is allocated or written: past the
    machine's memory, torch's allocation fails with a traceback, or the kernel's OOM killer
    ends the process, long after the mistake was made."""
    have = total_memory(device)
    if have is not None and need > have:
        raise error(refusal(need / 2**30, have / 2**30))
