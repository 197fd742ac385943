"""bench/lm_vs_nanogpt.py: its help, and a few steps of aiayn's side alone (--aiayn-only) on
tiny Shakespeare, read back into the report (docs/lab/lm.md has the real run beside nanoGPT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import BENCH, SHARED

SCRIPT = BENCH / "lm_vs_nanogpt.py"
TEXT = os.path.normpath(os.path.join(SHARED, "data", "tinyshakespeare", "input.txt"))


def test_help_names_the_flags():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    for flag in ("--nanogpt", "--out", "--steps", "--threads", "--aiayn-only", "--aiayn-dtype"):
        assert flag in out


def test_parses_nanogpt_lines():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lm_vs_nanogpt", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    log = "\n".join(
        ["step 0: train loss 4.1676, val loss 4.1649"]
        + [f"iter {i}: loss 3.5, time {50 + i}.00ms, mfu 0.02%" for i in range(21)]
        + ["step 20: train loss 3.0000, val loss 3.1000"]
    )
    got = bench.parse_nanogpt(log)
    assert got["valid_loss_estimate"] == 3.1 and got["final_eval_step"] == 20
    assert got["median_iter_ms"] == 65.5  # iterations 11..20 only
    assert got["iterations"] == 21


@pytest.mark.skipif(not os.path.exists(TEXT), reason=f"no tiny Shakespeare at {TEXT}")
def test_a_few_aiayn_steps_report_a_valid_loss_and_a_speed(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--aiayn-only", "--steps", "5", "--valid-every", "5",
           "--out", str(tmp_path / "out"), "--text", TEXT]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + (tmp_path / "out" / "aiayn.log").read_text()
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "nanogpt" not in report and report["aiayn_dtype"] == "fp32"
    aiayn = report["aiayn"]
    assert aiayn["final_valid_step"] == 5
    assert 0 < aiayn["valid_loss"] < 5  # a char model starts near ln(69) = 4.2
    assert aiayn["it_per_s"] > 0
