"""What the speed benchmarks report about the machine: CPU model and ISA, allocator, GPU peak.

Shared by bench/decode_speed.py and bench/train_speed.py (run as scripts, so `bench/` is on
sys.path and `import device_info` finds this file).
"""

from __future__ import annotations

import os
import platform
import sys

import torch

# Dense bf16 tensor-core peak in TFLOP/s (no 2:4 sparsity), from NVIDIA's data sheets, keyed by
# what `torch.cuda.get_device_name()` returns. A device missing here gets MFU = null.
PEAK_BF16_TFLOPS: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 989.0,  # H100 SXM
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H200": 989.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
}


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (`lscpu`'s "Model name")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_isa() -> dict[str, object]:
    """The vector ISA PyTorch dispatches to, and whether the CPU has AVX2 / AVX-512 / AMX.

    AMX (Intel Sapphire Rapids and later) multiplies bf16 tiles in hardware; AVX2-only CPUs
    (e.g. AMD Zen 2) have neither AVX-512 nor AMX, which changes which kernels win.
    """
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    has = {"avx2": "avx2" in flags, "avx512": "avx512f" in flags, "amx": "amx_tile" in flags}
    names = [name for name, key in (("AMX", "amx"), ("AVX-512", "avx512"), ("AVX2", "avx2"))
             if has[key]]  # fmt: skip
    return {
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "best": names[0] if names else "none of AVX2/AVX-512/AMX",
        **has,
    }


def allocator() -> str:
    """glibc malloc, unless a jemalloc/tcmalloc library is preloaded (LD_PRELOAD); whether it
    keeps freed memory, as aiayn's commands make it (`aiayn.runtime.memory`)."""
    from aiayn.runtime.memory import kept

    preload = os.environ.get("LD_PRELOAD", "")
    for name in ("jemalloc", "tcmalloc", "mimalloc"):
        if name in preload:
            return f"{name} ({preload})"
    glibc = "glibc malloc, freed memory kept" if kept() else "glibc malloc"
    return glibc + (f" (LD_PRELOAD={preload})" if preload else "")


def require_device(device: str) -> torch.device:
    """The torch.device to run on; a one-line error and exit code 2 when CUDA is missing."""
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda, but torch.cuda.is_available() is False on this machine")
    return torch.device(device)


def gpu_peak_flops(device: torch.device) -> tuple[float | None, str]:
    """(dense bf16 peak in FLOP/s or None, a note saying where it came from)."""
    if device.type != "cuda":
        return None, "no GPU peak on CPU"
    name = torch.cuda.get_device_name(device)
    tflops = PEAK_BF16_TFLOPS.get(name)
    if tflops is None:
        return None, f"unknown device {name!r}: no peak in the table, MFU not reported"
    return tflops * 1e12, f"{name}: {tflops:g} TFLOP/s dense bf16 (data sheet)"


def machine(device: torch.device) -> dict[str, object]:
    """The JSON block both benchmarks print about where they ran."""
    info: dict[str, object] = {
        "device": str(device),
        "cpu_model": cpu_model(),
        "cpu_isa": cpu_isa(),
        "allocator": allocator(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so wall-clock timings cover it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
