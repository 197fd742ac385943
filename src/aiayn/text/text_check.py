"""`aiayn data check --text`: what is wrong with a language model's text, before training on it.

The parallel corpus' check (aiayn.text.check) judges pairs; a language model's text is one
stream, so this one judges lines. Each line gets at most one count per kind:

    empty       a file that is empty or whitespace only (one count a file)
    binary      a line holding NUL bytes: a binary file, not text
    not_utf8    a line that is not valid UTF-8 (its example says the byte where)
    control     a line holding a control character other than tab and newline (Unicode Cc;
                the CR of a CRLF ending is a line ending), or U+FFFD, the mark of text decoded
                with the wrong encoding
    duplicates  a non-blank line that repeats an earlier one (surrounding whitespace aside):
                every repeat counts once, the first time does not
and each line of the validation text:
    leakage     a line of at least LEAK_MIN_CHARS characters that is also a training line:
                the validation loss would measure memory (shorter lines, a speaker's name or
                "Yes.", recur in any text)

Besides the counts: the share of the training text (characters) in repeated lines, and of the
validation text in leaked lines; the most repeated lines with their counts; the size of each
text (bytes, characters, distinct characters, lines); and the tokenizer that fits it.

Memory is bounded by 12 bytes a non-blank line (a 64-bit hash and its length, in arrays), never
the text: files of millions of lines check in one streaming pass, read in pieces of at most
PIECE_BYTES (a longer line is judged piece by piece: each piece counts as a line for the kinds),
plus a second pass for the examples.
`aiayn data check` imports no torch, so neither does this module.
"""

from __future__ import annotations

import re
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from aiayn.errors import DataError
from aiayn.runtime.progress import progress

TEXT_KINDS = ("empty", "binary", "not_utf8", "control", "duplicates")
VALID_KINDS = ("leakage",)
KINDS = TEXT_KINDS + VALID_KINDS
N_EXAMPLES = 3
N_MOST_REPEATED = 5
LEAK_MIN_CHARS = 20
PIECE_BYTES = 1 << 20  # a line longer than this (a minified file) is read in pieces
CHAR_MAX_DISTINCT = 256  # a character vocabulary this small is cheap and sees every character
BPE_MIN_CHARS = 1_000_000  # enough text to train a BPE vocabulary of a few thousand pieces
WARN_DUPLICATED_SHARE = 0.1  # repeats are normal in text (refrains, names): warn above this

_CONTROL = re.compile("[\x01-\x08\x0b-\x1f\x7f-\x9f\ufffd]")  # NUL is `binary`'s
_BOM = b"\xef\xbb\xbf"


def text_files(spec: str | Path | list[Path]) -> list[Path]:
    """The files of `train.text`: comma-separated paths, a folder standing for its *.txt files
    (what a language model's run reads: aiayn.text.lm_data). DataError for a missing one."""
    parts = [Path(p) for p in spec] if isinstance(spec, list) else str(spec).split(",")
    paths: list[Path] = []
    for path in (Path(str(p).strip()) for p in parts if str(p).strip()):
        if path.is_dir():
            found = sorted(p for p in path.glob("*.txt") if p.is_file())
            if not found:
                raise DataError(f"{path}: a folder with no *.txt files")
            paths.extend(found)
        elif path.is_file():
            paths.append(path)
        else:
            raise DataError(f"{path}: no such file or folder")
    if not paths:
        raise DataError("no text file given")
    return paths


def _pieces(f: BinaryIO) -> Iterator[tuple[int, int, bytes, bool]]:
    """(1-based line, the file offset of its first byte, its bytes without the line ending (and
    without a BOM), whether a newline ended it). A line longer than PIECE_BYTES comes in several
    pieces of the same line number, each cut where a UTF-8 character ends: never a false
    `not_utf8`."""
    line, offset, carry = 1, 0, b""
    while True:
        chunk = f.readline(PIECE_BYTES)
        raw, carry = carry + chunk, b""
        if not raw:
            return
        ended = raw.endswith(b"\n")
        if not ended and len(chunk) == PIECE_BYTES:  # a cut line: carry a cut character over
            for back in range(1, min(4, len(raw)) + 1):
                byte = raw[-back]
                if byte >= 0xC0:  # the lead byte of a character 2-4 bytes wide
                    width = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                    if width > back:
                        raw, carry = raw[:-back], raw[-back:]
                    break
                if byte < 0x80:  # ASCII: nothing cut
                    break
        text = raw[:-1] if ended else raw
        if ended and text.endswith(b"\r"):
            text = text[:-1]  # a CRLF ending, read as the newline it stands for
        start = offset
        if offset == 0 and text.startswith(_BOM):
            text, start = text[3:], 3
        yield line, start, text, ended
        offset += len(raw)
        line += ended


def _open(path: Path) -> BinaryIO:
    try:
        return path.open("rb")
    except OSError as e:
        raise DataError(f"{path}: {e.strerror or e}") from None


@dataclass
class _Scan:
    """One text's (training or validation) numbers: sizes, per-line hashes, kinds found."""

    files: list[Path]
    hashes: array = field(default_factory=lambda: array("q"))  # each non-blank line's, stripped
    lengths: array = field(default_factory=lambda: array("I"))  # its characters, stripped
    bytes: int = 0
    characters: int = 0
    lines: int = 0
    blank_lines: int = 0
    distinct: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TEXT_KINDS[:-1], 0))
    examples: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {k: [] for k in TEXT_KINDS[:-1]}
    )

    def found(self, kind: str, example: dict[str, Any]) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < N_EXAMPLES:
            self.examples[kind].append(example)

    def sizes(self) -> dict[str, int]:
        return {
            "files": len(self.files),
            "bytes": self.bytes,
            "characters": self.characters,
            "distinct_characters": len(self.distinct),
            "lines": self.lines,
            "blank_lines": self.blank_lines,
        }


def _scan(files: list[Path], bar: bool) -> _Scan:
    """One streaming pass over the files: sizes, the per-line kinds with their first examples,
    and the hashes that find repeats afterwards."""
    scan = _Scan(files)
    for path in files:
        with (
            _open(path) as f,
            progress(
                total=path.stat().st_size,
                unit="B",
                unit_scale=True,
                desc=f"check {path.name}",
                disable=not bar,
            ) as pb,
        ):
            nonblank, last_offset, last_ended = 0, 0, True
            for line, offset, raw, ended in _pieces(f):
                if line % 1000 == 0:
                    pb.update(offset - last_offset)
                    last_offset = offset
                where = {"file": str(path), "line": line}
                if b"\x00" in raw:
                    scan.found("binary", where | {"text": _show(raw)})
                try:
                    text = raw.decode("utf-8")
                    visible = text
                except UnicodeDecodeError as e:
                    scan.found("not_utf8", where | {"byte": offset + e.start, "text": _show(raw)})
                    text = raw.decode("utf-8", "replace")
                    visible = raw.decode("utf-8", "ignore")  # its U+FFFD are not control's
                if _CONTROL.search(visible):
                    scan.found("control", where | {"text": text[:200]})
                scan.characters += len(text) + ended
                scan.distinct.update(text)
                if ended:
                    scan.distinct.add("\n")
                key = text.strip()
                if key:
                    nonblank += 1
                    scan.hashes.append(hash(key))
                    scan.lengths.append(len(key))
                else:
                    scan.blank_lines += ended  # a line cut in pieces is blank in none of them
                scan.lines += ended
                last_ended = ended
            scan.lines += not last_ended  # a last line without its newline
            pb.update(path.stat().st_size - last_offset)
            scan.bytes += f.tell()
            if not nonblank:
                scan.found("empty", {"file": str(path), "line": 1, "text": ""})
    return scan


def _show(raw: bytes) -> str:
    """A line that is not text, as far as it reads: undecodable bytes as U+FFFD, NUL as \\0."""
    return raw[:200].decode("utf-8", "replace").replace("\x00", "\\0")


def _repeats(hashes: np.ndarray) -> np.ndarray:
    """(N,) bool: True where the hash occurred on an earlier line."""
    first = np.zeros(len(hashes), dtype=bool)
    first[np.unique(hashes, return_index=True)[1]] = True
    return ~first


def suggest_tokenizer(characters: int, distinct: int) -> tuple[str, str]:
    """`train.tokenizer` for a text of `characters` with `distinct` different ones, and why."""
    if distinct <= CHAR_MAX_DISTINCT:
        return "char", f"{distinct} distinct characters: one id each, a small vocabulary"
    if characters >= BPE_MIN_CHARS:
        return "bpe", (
            f"{distinct} distinct characters are many for a character vocabulary; "
            f"{characters:,} characters are enough to train BPE pieces on"
        )
    return "byte", (
        f"{distinct} distinct characters are many for a character vocabulary, and "
        f"{characters:,} characters few for BPE: 256 byte ids fit any text"
    )


@dataclass
class TextCheckReport:
    """Counts per kind (module docstring), a few examples each, the shares and sizes."""

    files: dict[str, list[str]]
    counts: dict[str, int]
    examples: dict[str, list[dict[str, Any]]]
    duplicated_share: float  # of the training characters, in repeated lines
    leakage_share: float  # of the validation characters, in leaked lines
    most_repeated: list[dict[str, Any]]  # {"text", "count"}, the most repeated lines first
    sizes: dict[str, dict[str, int]]  # "train" (and "valid"): bytes, characters, lines, ...
    tokenizer: dict[str, str]  # {"suggested": "char", "why": "..."}

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "counts": self.counts,
            "examples": self.examples,
            "duplicated_share": self.duplicated_share,
            "leakage_share": self.leakage_share,
            "most_repeated": self.most_repeated,
            "sizes": self.sizes,
            "tokenizer": self.tokenizer,
        }

    def summary(self) -> str:
        """One line: the kinds found, e.g. "3 duplicates (0.4% of the text), 2 leakage (5.0% of
        the validation text)" ("nothing found" if none)."""
        found = []
        for kind, n in self.counts.items():
            if not n:
                continue
            if kind == "duplicates":
                found.append(f"{n} duplicates ({self.duplicated_share:.1%} of the text)")
            elif kind == "leakage":
                found.append(f"{n} leakage ({self.leakage_share:.1%} of the validation text)")
            else:
                found.append(f"{n} {kind}")
        return ", ".join(found) if found else "nothing found"

    @property
    def serious(self) -> bool:
        """Whether training should warn: anything but a modest share of repeated lines."""
        return (
            any(n for kind, n in self.counts.items() if kind != "duplicates")
            or self.duplicated_share > WARN_DUPLICATED_SHARE
        )


def check_text_corpus(
    train: str | Path | list[Path],
    valid: str | Path | list[Path] | None = None,
    *,
    examples: bool = True,
    bar: bool = False,
) -> TextCheckReport:
    """Check a language model's training text (`train.text`: a file, a folder of *.txt, or
    comma-separated files) and its validation text (`train.valid_text`, "" or None: none).

    Returns the counts of every kind (module docstring) with up to N_EXAMPLES examples each;
    `examples=False` skips the second pass that reads the repeated and leaked lines (and the
    most repeated ones); `bar` shows a progress bar over each file's bytes. A missing or
    unreadable file is a DataError; whatever is wrong inside a file is a count."""
    train_files = text_files(train)
    valid_files = text_files(valid) if valid else []
    tr = _scan(train_files, bar)
    va = _scan(valid_files, bar) if valid_files else None
    counts = dict(tr.counts)
    shown = {k: list(v) for k, v in tr.examples.items()}
    if va is not None:
        for kind, n in va.counts.items():
            counts[kind] += n
            shown[kind] = (shown[kind] + va.examples[kind])[:N_EXAMPLES]

    train_h = np.frombuffer(tr.hashes, dtype=np.int64)
    train_len = np.frombuffer(tr.lengths, dtype=np.uint32)
    repeat = _repeats(train_h)
    counts["duplicates"] = int(repeat.sum())
    duplicated_share = float(train_len[repeat].sum()) / max(tr.characters, 1)
    uniq, first, n_seen = np.unique(train_h, return_index=True, return_counts=True)
    top = np.argsort(-n_seen, kind="stable")[:N_MOST_REPEATED]
    top = top[n_seen[top] > 1]

    leaked = np.zeros(0, dtype=bool)
    leakage_share = 0.0
    if va is not None:
        valid_h = np.frombuffer(va.hashes, dtype=np.int64)
        valid_len = np.frombuffer(va.lengths, dtype=np.uint32)
        leaked = np.isin(valid_h, uniq) & (valid_len >= LEAK_MIN_CHARS)
        leakage_share = float(valid_len[leaked].sum()) / max(va.characters, 1)
    counts["leakage"] = int(leaked.sum())

    most_repeated: list[dict[str, Any]] = []
    if examples:
        wanted = {
            "duplicates": [int(i) for i in np.flatnonzero(repeat)[:N_EXAMPLES]],
            "most_repeated": [int(first[i]) for i in top],
            "leakage": [int(i) for i in np.flatnonzero(leaked)[:N_EXAMPLES]],
        }
        lines = _read_lines(train_files, wanted["duplicates"] + wanted["most_repeated"])
        shown["duplicates"] = [lines[i] for i in wanted["duplicates"]]
        most_repeated = [
            {"text": lines[int(first[i])]["text"], "count": int(n_seen[i])} for i in top
        ]
        if valid_files:
            leaks = _read_lines(valid_files, wanted["leakage"])
            shown["leakage"] = [leaks[i] for i in wanted["leakage"]]
    shown.setdefault("leakage", [])
    suggested, why = suggest_tokenizer(tr.characters, len(tr.distinct))
    sizes = {"train": tr.sizes()}
    if va is not None:
        sizes["valid"] = va.sizes() | {"unseen_characters": len(va.distinct - tr.distinct)}
    return TextCheckReport(
        files={"text": [str(p) for p in train_files], "valid_text": [str(p) for p in valid_files]},
        counts={k: counts[k] for k in KINDS},
        examples={k: shown.get(k, []) for k in KINDS},
        duplicated_share=duplicated_share,
        leakage_share=leakage_share,
        most_repeated=most_repeated,
        sizes=sizes,
        tokenizer={"suggested": suggested, "why": why},
    )


def _read_lines(files: list[Path], ordinals: list[int]) -> dict[int, dict[str, Any]]:
    """The non-blank lines of these numbers (0-based, over the files in order), read in one
    more pass that stops after the last: {ordinal: {"file", "line", "text"}}."""
    wanted, found = set(ordinals), {}
    last, n = max(wanted, default=-1), 0
    for path in files:
        if n > last:
            break
        with _open(path) as f:
            for line, _, raw, _ in _pieces(f):
                text = raw.decode("utf-8", "replace")
                if not text.strip():
                    continue
                if n in wanted:
                    found[n] = {"file": str(path), "line": line, "text": text[:200]}
                n += 1
                if n > last:
                    break
    return found


def log_text_check(train: str, valid: str, log: Any, bar: bool = False) -> TextCheckReport:
    """What `aiayn train` says of a language model's text at the start of a fresh run: one
    line, a warning where the check found more than a modest share of repeated lines."""
    t0 = time.monotonic()
    report = check_text_corpus(train, valid or None, examples=False, bar=bar)
    size = report.sizes["train"]
    facts = (
        f"{size['characters']:,} characters, {size['distinct_characters']} distinct "
        f"({report.tokenizer['suggested']} fits)"
    )
    if report.serious:
        flags = f"--text {train}" + (f" --valid-text {valid}" if valid else "")
        log.warning(
            "text check: %s; %s (%.1f s); `aiayn data check %s` shows examples (docs/data.md)",
            report.summary(),
            facts,
            time.monotonic() - t0,
            flags,
        )
    else:
        log.info("text check: %s; %s (%.1f s)", report.summary(), facts, time.monotonic() - t0)
    return report
