"""The garbage collector's pauses: what a command holds for life frozen out of collections,
and every pause measured for `/metrics`.

CPython's cyclic collector stops the process while it runs (it holds the GIL). A full
(generation 2) collection walks every container object the process keeps: torch, the model's
modules, FastAPI and pydantic in a server, ~170 thousand objects once `aiayn.cli.main` is
imported (~0.16 s a walk) and ~210 thousand in `aiayn serve`. Those
objects live as long as the process, so they are frozen into the collector's permanent
generation (`gc.freeze`: never walked again; a frozen object is still freed when its last
reference goes):

- the `aiayn` command freezes what its imports created before it runs (`aiayn.__main__.run`):
  the collections the interpreter runs as it exits took ~0.6 s of a one-line
  `aiayn translate`;
- `aiayn serve` freezes again once the model and the app are loaded: under
  `bench/serve_load.py` (32 clients) its full collections took 157-210 ms each, about every 10
  s, while every request in flight waited; frozen, ~5 ms.

docs/lab/overhead.md, "Garbage-collector pauses", has the measurements. `AIAYN_GC=default` in
the environment leaves the collector as it is. As a library, aiayn freezes nothing (but
`aiayn.serve.launch.serve`, which serves for the rest of the process).

`GcPauses` times every collection, by generation (the server's `/metrics` shows them:
aiayn.serve.guard).
"""

from __future__ import annotations

import bisect
import gc
import os
import time
from collections.abc import Callable

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)  # seconds
GENERATIONS = 3


class GcPauses:
    """The duration of every collection, by generation: how many fell in each of `BUCKETS`
    (the last count: over the largest bound), their sum and the longest.

    The callback runs inside the collector, on whichever thread's allocation set it off, so it
    only adds to plain lists: taking a lock there could wait forever on a lock its own thread
    holds (a metric's, mid-update). One collection runs at a time, so a start and its stop
    are never interleaved with another's."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock, self._started = clock, 0.0
        self.counts = [[0] * (len(BUCKETS) + 1) for _ in range(GENERATIONS)]
        self.sums = [0.0] * GENERATIONS
        self.longest = [0.0] * GENERATIONS

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = self.clock()
            return
        # (a later CPython may number its generations otherwise: the oldest bucket takes them)
        seconds, g = self.clock() - self._started, min(info["generation"], GENERATIONS - 1)
        self.counts[g][bisect.bisect_left(BUCKETS, seconds)] += 1  # the first bound >= it
        self.sums[g] += seconds
        self.longest[g] = max(self.longest[g], seconds)


_pauses: GcPauses | None = None


def gc_pauses() -> GcPauses:
    """The process's `GcPauses`, timing every collection from the first call on."""
    global _pauses
    if _pauses is None:
        _pauses = GcPauses()
        gc.callbacks.append(_pauses)
    return _pauses


def freeze_startup(collect: bool = True) -> int:
    """Freeze every object the process holds (module comment), after one collection if
    `collect` (skip it where there is no garbage to find: right after the imports there was
    none, and a collection there walks them all once more). Returns how many objects are
    frozen (0 with `AIAYN_GC=default`: nothing done). That collection is not a pause anyone
    waits on (nothing is served yet), so `GcPauses` does not count it."""
    if os.environ.get("AIAYN_GC", "") == "default":
        return 0
    timer = _pauses if _pauses in gc.callbacks else None
    if timer is not None:
        gc.callbacks.remove(timer)
    try:
        if collect:
            gc.collect()
        gc.freeze()
    finally:
        if timer is not None:
            gc.callbacks.append(timer)
    return gc.get_freeze_count()
