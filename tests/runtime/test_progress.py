"""Progress on stderr: a bar where it can redraw, plain timed lines in a log file or a pipe."""

from __future__ import annotations

import io
import sys

import pytest

import aiayn.runtime.progress as progress_mod
from aiayn.runtime.progress import interactive, progress


def run_bar(n: int) -> str:
    with progress(total=n, unit="line", desc="translate") as bar:
        for _ in range(n):
            bar.update(1)
    assert isinstance(sys.stderr, io.StringIO)  # set by each test
    return sys.stderr.getvalue()


def test_a_log_file_gets_one_plain_line_per_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a terminal: no carriage returns, no bar glyphs; each redraw is a line of its own
    (before, a log held every state of the bar on one line, joined by '\\r')."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setattr(progress_mod, "LINE_INTERVAL_S", 0.0)  # every update, for the test
    assert not interactive()
    lines = run_bar(4).splitlines()
    assert "\r" not in "".join(lines) and "|" not in "".join(lines)
    assert lines[0].startswith("translate: 0/4 lines (0%) in ")
    assert any(line.startswith("translate: 4/4 lines (100%) in ") for line in lines)
    assert len(lines) >= 5  # 0..4


def test_a_short_job_in_a_log_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first plain line comes once the work has taken LINE_INTERVAL_S (30 s)."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert run_bar(100) == ""


def test_a_terminal_gets_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert interactive()
    out = run_bar(3)
    assert "\r" in out and "3/3" in out and "line/s" in out
