"""aiayn.runtime.memory: glibc's malloc keeps freed pages, so a block allocated again starts on
pages already faulted in. Checked by the kernel's own count of page faults, in a fresh process
each (the setting is the process's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from aiayn.runtime.memory import MMAP_THRESHOLD, keep_freed_memory

GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None

# A search's pattern, through malloc itself (torch's own threads would allocate in between): a
# large block freed (glibc's mmap threshold rises to its size), then rounds (batches) of three
# 12 MiB blocks written and freed together. Each round's minor page faults are printed.
MIB = 1024 * 1024
ROUNDS = textwrap.dedent(
    f"""
    import ctypes, json, resource, sys
    from aiayn.runtime.memory import keep_freed_memory
    kept = keep_freed_memory() if sys.argv[1] == "keep" else None
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def written(size):
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)  # every page
        return block

    libc.free(written({16 * MIB}))
    faults = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for block in [written({12 * MIB}) for _ in range(3)]:
            libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({{"kept": kept, "faults": faults}}))
    """
)


def rounds(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True,
                         check=True)  # fmt: skip
    return json.loads(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_a_freed_block_is_reused_without_page_faults():
    pages = 3 * 12 * MIB // os.sysconf("SC_PAGE_SIZE")  # written in a round
    assert 12 * MIB <= MMAP_THRESHOLD  # blocks the setting covers
    kept = rounds("keep")
    assert kept["kept"] is True
    assert kept["faults"][0] > pages // 3  # the first round takes new memory
    assert sum(kept["faults"][1:]) < pages // 20  # later ones reuse it
    # glibc as it comes: the rounds' 36 MiB freed at the heap's top is more than twice the
    # raised threshold, so it is trimmed (given back), and every round faults it in again.
    plain = rounds("plain")
    assert plain["kept"] is None and min(plain["faults"]) > pages * 9 // 10


def test_it_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("AIAYN_MALLOC", "default")
    assert keep_freed_memory() is False
