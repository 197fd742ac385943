"""Parallel text in: two line-aligned files (or one TSV), streamed line by line and checked.

Unusable pairs are dropped *as pairs* and counted (`DataStats`): line i of the source is only
ever paired with line i of the target. Errors a user can cause (different line counts, invalid
UTF-8, an empty file) are `DataError`s with one-line messages. `hold_out` sets aside a
validation set from a training corpus (deduplicated against it) when the user gave none.
"""

from __future__ import annotations

import codecs
import logging
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from aiayn.errors import DataError

MAX_LINE_CHARS = 10_000  # a "sentence" longer than this is almost surely a broken line
# The most of one line that is ever held in memory: a file (or stdin) with a line of gigabytes
# was read whole. Far above MAX_LINE_CHARS, so a cut line is still dropped as too long.
MAX_LINE_BYTES = 1 << 20

log = logging.getLogger(__name__)


@dataclass
class DataStats:
    """What reading and encoding kept and dropped, so that filtering is never silent."""

    read: int = 0
    held_out: int = 0  # left out of training: held out for validation, or a held-out source
    empty: int = 0  # a side is empty (or whitespace only)
    too_long_chars: int = 0  # a side has more than MAX_LINE_CHARS characters
    too_long_tokens: int = 0  # a side has more than max_len tokens (with EOS)
    examples: list[str] = field(default_factory=list)  # where the first drops happened
    lines: array = field(default_factory=lambda: array("q"))  # file line of each pair passed on

    def where(self, i: int) -> str:
        """Pair `i` of those passed on, named as the user can find it: its file line when
        `read_parallel` counted lines, else its place in the list (a held-out set)."""
        return f"line {self.lines[i]}" if i < len(self.lines) else f"pair {i + 1}"

    def drop(self, reason: str, where: str) -> None:
        setattr(self, reason, getattr(self, reason) + 1)
        if len(self.examples) < 5:
            self.examples.append(where)

    @property
    def dropped(self) -> int:
        return self.empty + self.too_long_chars + self.too_long_tokens

    @property
    def kept(self) -> int:
        return self.read - self.held_out - self.dropped

    def report(self, name: str) -> str:
        msg = f"{name}: read {self.read} pairs, kept {self.kept}"
        if self.held_out:
            msg += f"; {self.held_out} held out for validation (or sharing a held-out source)"
        if self.dropped:
            msg += (
                f"; dropped {self.dropped} (empty side {self.empty}, over {MAX_LINE_CHARS} chars "
                f"{self.too_long_chars}, over max_len tokens {self.too_long_tokens}; "
                f"first: {', '.join(self.examples)})"
            )
        return msg


def source_text(line: str) -> str:
    """A line as the model reads it: without surrounding whitespace or a leading U+FEFF (a
    byte order mark pasted from a file, inside a served text or a line of a concatenated
    file; as a zero-width no-break space it carries no text). `aiayn translate`, the server
    and `aiayn explain` all encode this, so what is explained is what is translated."""
    return line.strip().lstrip("\ufeff").strip()


def read_lines(stream: BinaryIO, name: str) -> Iterator[str]:
    """Decoded lines of a binary stream without their newline (LF or CRLF) and without a UTF-8
    byte order mark at its start (Windows editors write one; it would be part of the first
    sentence); invalid UTF-8 is a DataError that names the file (`name`) and the line."""
    line_no = 0
    while raw := stream.readline(MAX_LINE_BYTES + 1):
        line_no += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raw = _cut_long_line(stream, raw, f"{name}: line {line_no}")
        if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{name}: line {line_no} is not valid UTF-8 (byte {e.start}: {e.reason})"
            ) from None


def _cut_long_line(stream: BinaryIO, head: bytes, where: str) -> bytes:
    """The first MAX_LINE_BYTES bytes of a longer line (cut at a character's start); the rest
    of the line is read past in bounded pieces, so the next line is the file's next line."""
    while (rest := stream.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
        pass
    cut = MAX_LINE_BYTES
    while cut > 0 and head[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte: not a start
        cut -= 1
    log.warning(
        "%s is longer than %d bytes: only its first %d are read", where, MAX_LINE_BYTES, cut
    )
    return head[:cut]


def _lines(path: Path) -> Iterator[str]:
    """Decoded lines of the corpus file `path` (see `read_lines`)."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise DataError(f"corpus file not found: {path}") from None
    with f:
        yield from read_lines(f, str(path))


def count_lines(path: str | Path) -> int:
    """Lines in the file `path` (a last line without a newline counts), read in 1 MiB blocks:
    no line, however long, is held whole."""
    n, last = 0, b"\n"
    with Path(path).open("rb") as f:
        while block := f.read(1 << 20):
            n, last = n + block.count(b"\n"), block[-1:]
    return n + (last != b"\n")


def _aligned(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    """Line i of `src` with line i of `tgt`; a length mismatch is a DataError naming both counts."""
    src_it, tgt_it = _lines(src), _lines(tgt)
    n = 0
    while True:
        s, t = next(src_it, None), next(tgt_it, None)
        if s is None or t is None:
            if s is None and t is None:
                return
            n_src = n + (0 if s is None else 1 + sum(1 for _ in src_it))
            n_tgt = n + (0 if t is None else 1 + sum(1 for _ in tgt_it))
            raise DataError(
                f"{src} has {n_src} lines but {tgt} has {n_tgt}: the files must be line-aligned"
            )
        n += 1
        yield s, t


def _tsv(path: Path) -> Iterator[tuple[str, str]]:
    for line_no, line in enumerate(_lines(path), 1):
        cols = line.split("\t")
        if len(cols) != 2:
            raise DataError(
                f"{path}: line {line_no} has {len(cols)} tab-separated fields, not 2 "
                "(a file given without its target side is read as source<TAB>target "
                "lines)"
            )
        yield cols[0], cols[1]


def read_parallel(
    src: str | Path,
    tgt: str | Path | None = None,
    stats: DataStats | None = None,
    heldout: Heldout | None = None,
) -> Iterator[tuple[str, str]]:
    """Stream (source, target) sentence pairs from two line-aligned files or one TSV.

    A pair with an empty side or a side over MAX_LINE_CHARS characters is dropped whole (the
    other side with it, so alignment holds) and counted in `stats`. Surrounding whitespace is
    stripped. Raises DataError for an empty file, different line counts or invalid UTF-8.
    With `heldout` (see `hold_out`), its lines, and every pair with one of its sources, are
    left out (counted as `held_out`).
    """
    stats = stats if stats is not None else DataStats()
    return _filtered(raw_pairs(src, tgt), stats, heldout)


def raw_pairs(src: str | Path, tgt: str | Path | None) -> Iterator[tuple[str, str]]:
    """Every line pair as read (nothing stripped or dropped); files checked at the call."""
    src = Path(src)
    paths = [src] if not tgt else [src, Path(tgt)]
    for p in paths:
        if not p.is_file():
            what = (
                "is a directory, not a file"
                if p.is_dir()
                else "not found"
                if not p.exists()
                # a pipe (`<(zcat ...)`) or a device: a corpus is read more than once
                else "is not a regular file (a pipe or a device; a corpus is read more than "
                "once: write it to a file)"
            )
            raise DataError(f"corpus file {what}: {p}")
        if p.stat().st_size == 0:
            raise DataError(f"corpus file is empty: {p}")
    return _tsv(src) if not tgt else _aligned(src, Path(tgt))


def _filtered(
    pairs: Iterator[tuple[str, str]], stats: DataStats, heldout: Heldout | None = None
) -> Iterator[tuple[str, str]]:
    for line_no, (s, t) in enumerate(pairs, 1):
        stats.read += 1
        s, t = s.strip(), t.strip()
        if heldout is not None and (line_no - 1 in heldout.lines or s in heldout.sources):
            stats.held_out += 1
        elif not s or not t:
            stats.drop("empty", f"line {line_no}")
        elif len(s) > MAX_LINE_CHARS or len(t) > MAX_LINE_CHARS:
            stats.drop("too_long_chars", f"line {line_no}")
        else:
            stats.lines.append(line_no)
            yield s, t


HELDOUT_FILES = ("heldout_valid.src", "heldout_valid.tgt")  # written into the run directory
HELDOUT_MAX = 2000  # pairs: enough for a stable loss and BLEU, cheap to validate on a CPU
HELDOUT_SHARE = 0.05  # at most this share of the corpus, so small corpora keep 95% to learn


@dataclass(frozen=True)
class Heldout:
    """Validation pairs drawn from the training corpus, and what training must then leave out."""

    pairs: list[tuple[str, str]]  # stripped, usable (no empty or over-long side), one per source
    lines: frozenset[int]  # 0-based corpus lines drawn (a drawn line that was unusable too)
    sources: frozenset[str]  # training pairs with one of these sources are left out as well
    corpus_lines: int


def hold_out(src: str | Path, tgt: str | Path | None, seed: int) -> Heldout:
    """Draw min(HELDOUT_MAX, HELDOUT_SHARE of the lines) corpus lines as a validation set.

    The draw is a pure function of (line count, seed), so every rank and every resumed session
    holds out the same pairs. Two streaming passes: one counts lines, one keeps the drawn ones.
    The pairs are deduplicated by source, and training leaves out every pair whose source is a
    held-out one (`read_parallel(..., heldout=...)`), so no validation source is trained on.
    """
    n = count_lines(src) if Path(src).is_file() else 0  # a missing file: raised below
    k = min(HELDOUT_MAX, int(HELDOUT_SHARE * n))
    drawn = frozenset(random.Random(seed).sample(range(n), k))
    pairs: list[tuple[str, str]] = []
    sources: set[str] = set()
    for i, (s, t) in enumerate(raw_pairs(src, tgt)):
        s, t = s.strip(), t.strip()
        usable = s and t and len(s) <= MAX_LINE_CHARS and len(t) <= MAX_LINE_CHARS
        if i in drawn and usable and s not in sources:
            pairs.append((s, t))
            sources.add(s)
    return Heldout(pairs, drawn, frozenset(sources), n)
