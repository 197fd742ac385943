"""The garbage collector's pauses: the objects a server holds for life frozen out of full
collections, and every pause measured for `/metrics`.

CPython's cyclic collector stops the process while it runs (it holds the GIL). A full
(generation 2) collection traverses every container object the process keeps: torch,
FastAPI and pydantic, the model's modules, ~210 thousand objects in `aiayn serve` with the
quick start model. Under `bench/serve_load.py` (32 clients, AMD EPYC Zen 3) the server ran
two of them in 20 s, 130-175 ms each: every request in flight waited, and so did the model
worker at its next Python line. Those objects live as long as the process, so once the
server has loaded, `freeze_startup` moves them to the collector's permanent generation
(`gc.freeze`: never traversed again; a frozen object is still freed when its last reference
goes) and a full collection then takes ~3 ms (docs/benchmarks.md, "Garbage-collector
pauses"). `AIAYN_GC=default` in the environment leaves the collector as it is.

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
        seconds, g = self.clock() - self._started, info["generation"]
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


def freeze_startup() -> int:
    """Collect once, then freeze every object the process holds (module comment). Returns how
    many objects are frozen (0 with `AIAYN_GC=default`: nothing done). That collection is not
    a pause anyone waits on (nothing is served yet), so `GcPauses` does not count it."""
    if os.environ.get("AIAYN_GC", "") == "default":
        return 0
    timer = _pauses if _pauses in gc.callbacks else None
    if timer is not None:
        gc.callbacks.remove(timer)
    try:
        gc.collect()
        gc.freeze()
    finally:
        if timer is not None:
            gc.callbacks.append(timer)
    return gc.get_freeze_count()
