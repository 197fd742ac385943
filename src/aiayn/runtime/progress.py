"""Progress on stderr, and the one place that decides its form.

On a terminal (or in a notebook) it is a tqdm bar. In a log file or a pipe a bar's
carriage-return updates pile up on one line (`nohup aiayn translate ... 2> log` held every
state of the bar), so there a plain line comes at most every LINE_INTERVAL_S, the first only
once the work has taken that long: a short job writes nothing, a long one a line to `tail -f`.
fairseq's `--log-format` chooses the same way (tqdm on a terminal, `simple` lines otherwise).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, TypeVar

from tqdm import tqdm as tqdm_std
from tqdm.auto import tqdm as tqdm_auto
from tqdm.autonotebook import tqdm as tqdm_notebook  # tqdm's own bar unless in a notebook

LINE_INTERVAL_S = 30.0
BAR_EVERY = 1000  # items between a bar's updates in `counted`: its cost stays out of the loop
PLAIN_FORMAT = (
    "{desc}: {n_fmt}/{total_fmt} {unit}s ({percentage:.0f}%) in {elapsed}, "
    "{rate_fmt}, {remaining} left{postfix}"
)


def interactive() -> bool:
    """Whether a bar can redraw itself: stderr is a terminal, or tqdm.auto found a notebook."""
    return tqdm_notebook is not tqdm_std or sys.stderr.isatty()


class _Lines:
    """A file for tqdm that writes each of its redraws as a line of its own."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, s: str) -> int:
        text = s.replace("\r", "").rstrip()  # the redraw's return and its erasing spaces
        if text:
            self.stream.write(text + "\n")
        return len(s)

    def flush(self) -> None:
        self.stream.flush()


def progress(
    *, total: int | None, unit: str, desc: str | None = None, disable: bool = False, **kw: Any
) -> tqdm_std:
    """A tqdm bar on stderr where one can redraw (`interactive`), else plain timed lines."""
    if interactive():
        return tqdm_auto(total=total, unit=unit, desc=desc, disable=disable, file=sys.stderr, **kw)
    return tqdm_std(
        total=total,
        unit=unit,
        desc=desc,
        disable=disable,
        file=_Lines(sys.stderr),
        mininterval=LINE_INTERVAL_S,
        delay=LINE_INTERVAL_S,
        bar_format=PLAIN_FORMAT,
        **kw,
    )


T = TypeVar("T")


def counted(items: Iterable[T], bar: tqdm_std) -> Iterator[T]:
    """`items`, counted on `bar` every BAR_EVERY and at their end (a corpus's pairs: the bar's
    own iteration would call it per item, and close it before the caller can settle its total)."""
    n = 0
    for n, item in enumerate(items, 1):
        if n % BAR_EVERY == 0:
            bar.update(BAR_EVERY)
        yield item
    bar.update(n % BAR_EVERY)
