"""Host memory that stays with the process: glibc's malloc told to reuse what it frees.

A search allocates large tensors again and again: every batch's K/V cache (rows x heads x
output limit x d_k, per layer), every step's logits and log-probabilities. glibc's malloc
serves blocks above its mmap threshold (128 KiB, raised as large blocks are freed, at most
32 MiB) with fresh pages from the kernel and hands them back on `free`, and it trims the top
of its heap whenever more than twice that is free. Either way the next block of that size
starts on untouched pages, and the first write to each costs a page fault (the kernel
zeroes it): one beam-4 pass over the quick start model's
1,000 test sentences took 136-188 thousand faults, 61-73 thousand with this module's
setting, and ~20% less CPU (docs/lab/decoding.md, "Freed memory kept for reuse"). jemalloc
and tcmalloc keep freed pages by design; the same from glibc takes two settings, which
`keep_freed_memory` makes through `mallopt`.

The price: the process keeps the memory of its largest moment until it exits instead of
returning it between batches. aiayn's commands call it as they start (`AIAYN_MALLOC=default`
leaves malloc as it is); as a library, aiayn changes nothing unless asked.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on a 64-bit system (DEFAULT_MMAP_THRESHOLD_MAX):
# blocks above it are still mapped and unmapped each time.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 2**31 - 1  # the largest `mallopt` takes (an int): in effect, never trim
_kept = False


def kept() -> bool:
    """Whether `keep_freed_memory` has changed this process's malloc (benchmarks report it)."""
    return _kept


def keep_freed_memory() -> bool:
    """Make glibc's malloc reuse freed blocks up to 32 MiB instead of returning their pages to
    the kernel (a mmap threshold at its maximum, no trimming). Returns whether it was done:
    not on other C libraries (musl, macOS, Windows), nor with `AIAYN_MALLOC=default` in the
    environment. Under `LD_PRELOAD` of jemalloc or tcmalloc it is done but changes nothing:
    their malloc, which keeps freed pages anyway, serves the process."""
    if os.environ.get("AIAYN_MALLOC", "") == "default" or not sys.platform.startswith("linux"):
        return False
    try:
        process = ctypes.CDLL(None)  # the symbols the process has loaded, its C library's too
        if not hasattr(process, "gnu_get_libc_version"):  # not glibc: mallopt differs or lacks
            return False
        mallopt = process.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    global _kept
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    _kept = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and done
    log.debug("malloc keeps freed memory: %s", _kept)
    return _kept
