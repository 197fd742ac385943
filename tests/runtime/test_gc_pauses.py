"""aiayn.runtime.gc_pauses: every collection timed into the right bucket, and what the process
holds frozen out of full collections (`aiayn serve` does it once loaded)."""

from __future__ import annotations

import gc

import pytest

import aiayn.runtime.gc_pauses as gp


def test_pauses_land_in_their_bucket_by_generation():
    readings = iter([10.0, 10.03, 20.0, 20.0005, 30.0, 32.0])
    p = gp.GcPauses(clock=lambda: next(readings))
    for g in (1, 0, 2):
        p("start", {"generation": g})
        p("stop", {"generation": g, "collected": 0, "uncollectable": 0})
    le = dict(zip(gp.BUCKETS, range(len(gp.BUCKETS)), strict=True))
    assert p.counts[1][le[0.05]] == 1 and sum(p.counts[1]) == 1  # 30 ms: the 50 ms bucket
    assert p.counts[0][le[0.001]] == 1 and sum(p.counts[0]) == 1  # 0.5 ms: the first
    assert p.counts[2][-1] == 1 and sum(p.counts[2]) == 1  # 2 s: over the largest bound
    assert p.sums == pytest.approx([0.0005, 0.03, 2.0])
    assert p.longest == pytest.approx([0.0005, 0.03, 2.0])


def test_every_collection_is_timed_but_the_freeze_s_own():
    pauses = gp.gc_pauses()
    assert gp.gc_pauses() is pauses and gc.callbacks.count(pauses) == 1  # installed once
    full = sum(pauses.counts[2])
    gc.collect()
    assert sum(pauses.counts[2]) >= full + 1 and pauses.longest[2] > 0
    tracked = len(gc.get_objects())
    try:
        full = sum(pauses.counts[2])
        frozen = gp.freeze_startup()
        # The freeze's own collection is not a pause a request waits on: not counted.
        assert sum(pauses.counts[2]) == full and pauses in gc.callbacks
        # what the process held (the count falls as frozen temporaries are freed: no equality)
        assert frozen > 0.9 * tracked and gc.get_freeze_count() > 0.9 * tracked
        assert len(gc.get_objects()) < 0.1 * tracked  # a full collection skips them now
    finally:
        gc.unfreeze()


def test_aiayn_gc_default_leaves_the_collector_alone(monkeypatch):
    monkeypatch.setenv("AIAYN_GC", "default")
    try:
        assert gp.freeze_startup() == 0 and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_the_command_freezes_torch_but_help_and_data_never_import_it():
    """`import aiayn` leaves torch out (`aiayn --help` took 2.1 s, 0.3 s without it); a command
    that needs torch imports it in `startup`, before the freeze, so torch's objects are frozen
    as before."""
    import subprocess
    import sys

    probe = (
        "import gc, sys\n"
        "from aiayn.cli.main import main, startup\n"
        "try:\n"
        "    main(['--help'], on_start=startup)\n"
        "except SystemExit:\n"
        "    pass\n"
        "startup('data')\n"
        "assert 'torch' not in sys.modules, 'help or data imported torch'\n"
        "gc.unfreeze()\n"
        "before = len(gc.get_objects())\n"
        "startup('translate')\n"
        "assert 'torch' in sys.modules\n"
        "assert gc.get_freeze_count() > before + 50_000, (before, gc.get_freeze_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
