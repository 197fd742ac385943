"""bench/lm_generate_speed.py runs end to end (a few tokens) and prints its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import paths
import pytest

pytest.importorskip("transformers")


def test_the_sampling_speed_benchmark_prints_both_sides():
    out = subprocess.run(
        [sys.executable, str(paths.BENCH / "lm_generate_speed.py"), "--reps", "1", "--new", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    for batch in ("batch_1", "batch_8"):
        assert result[batch]["aiayn_tokens_per_s"] > 0 and result[batch]["hf_tokens_per_s"] > 0
