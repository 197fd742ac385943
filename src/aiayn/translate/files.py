"""Files and streams for `aiayn translate` and `aiayn evaluate`: a UTF-8 file read and checked
in full before any work starts (with a progress bar), or stdin streamed line by line."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from aiayn.config import DecodeConfig
from aiayn.runtime.progress import progress as progress_bar
from aiayn.text.corpus import read_lines
from aiayn.translate.translator import Translator


def read_file_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (checked in full before any work starts)."""
    path = Path(path)
    with path.open("rb") as f:
        return list(read_lines(f, str(path)))


def translate_to(
    translator: Translator,
    cfg: DecodeConfig,
    out: TextIO,
    input_path: Path | None,
    *,
    batch_tokens: int = 2048,
    buffer_size: int = 1024,
) -> int:
    """Translate a file (with a progress bar) or stdin (streamed) into `out`; return the count.

    Writes one line per input line, or with `cfg.nbest > 1` the Moses n-best format
    `LINE_NO ||| translation ||| score`, best first (one such line for an empty input line).
    """
    bar = None
    if input_path is not None:
        all_lines = read_file_lines(input_path)  # checked up front
        lines: Sequence[str] | Iterator[str] = all_lines
        bar = progress_bar(total=len(all_lines), unit="line", desc="translate")
    else:
        lines = read_lines(sys.stdin.buffer, "<stdin>")  # streamed: checked as it comes
    stream = translator.translate_stream(
        lines,
        cfg,
        batch_tokens=batch_tokens,
        buffer_size=buffer_size,
        progress=bar.update if bar is not None else None,
    )
    n = 0
    try:
        for n, results in enumerate(stream, 1):
            if cfg.nbest > 1:
                out.writelines(f"{n} ||| {r.text} ||| {r.hyp.score:.4f}\n" for r in results)
            else:
                out.write(results[0].text + "\n")
            if input_path is None:
                out.flush()  # a stream's reader sees each line as soon as it exists
    finally:
        if bar is not None:
            bar.close()
    return n
