"""`aiayn data check`: what is wrong with a parallel corpus, before it costs an hour of training.

Each training pair gets at most one count per kind (a pair may have several kinds):

    empty            a side is empty or whitespace only
    control          a side holds a control character (Unicode Cc other than tab) or U+FFFD,
                     the mark of text decoded with the wrong encoding
    long             a side is longer than `max_chars` characters
    copies           the target is the source (compared normalised), and it has letters
    misaligned       the pair's length ratio is more than MISALIGNED_RATIO times off the
                     corpus' median ratio (neither side empty, the longer at least
                     RATIO_MIN_CHARS characters)
    script           under half of a side's letters are in its language's script (the language
                     is the file suffix: train.de -> de; unknown suffixes are not checked)
    duplicates       the pair repeats an earlier pair exactly (surrounding whitespace aside)
    near_duplicates  it repeats an earlier pair once case, punctuation and spacing are
                     normalised, without being an exact repeat
and each validation or test pair:
    overlap          the pair (normalised) is also a training pair, or a validation pair
                     (for test): the score would measure memory
    overlap_sources  only its source (normalised) is also a training (or validation) source

Memory is bounded by a few numbers per line (hashes in NumPy arrays), never the text, so a
corpus of millions of lines checks in one streaming pass, plus a second one for examples and
for `write_clean` (which drops every pair with a kind, near duplicates aside, and every training
pair whose source is a validation or test source).
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from array import array
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.atomic import atomic_dir
from aiayn.errors import DataError
from aiayn.runtime.progress import counted, progress
from aiayn.text.corpus import count_lines, raw_pairs

PAIR_KINDS = (
    "empty",
    "control",
    "long",
    "copies",
    "misaligned",
    "script",
    "duplicates",
    "near_duplicates",
)
EVAL_KINDS = ("overlap", "overlap_sources")
KINDS = PAIR_KINDS + EVAL_KINDS
MAX_CHARS = 1000  # a side longer than this is more likely a paragraph or a broken line
MISALIGNED_RATIO = 3.0
RATIO_MIN_CHARS = 20  # shorter pairs vary too much in length ratio to judge
N_EXAMPLES = 3

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffd]")
_PUNCT = re.compile(r"[^\w\s]|_")

# The script of a letter is the first word of its Unicode name ("LATIN SMALL LETTER E WITH
# ACUTE"); ISO 639-1 codes by the script(s) their letters are written in.
_CODES_BY_SCRIPTS = {
    ("LATIN",): "af az bs ca cs cy da de en eo es et eu fi fr ga gl ha hr hu id is it la lb lt "
    "lv mt ms nb nl nn no pl pt ro sk sl so sq sv sw tl tr uz vi xh yo zu",
    ("CYRILLIC",): "be bg kk ky mk mn ru tg uk",
    ("CYRILLIC", "LATIN"): "sr",
    ("GREEK",): "el",
    ("ARABIC",): "ar fa ps ur",
    ("HEBREW",): "he yi",
    ("DEVANAGARI",): "hi mr ne sa",
    ("BENGALI",): "bn",
    ("TAMIL",): "ta",
    ("TELUGU",): "te",
    ("THAI",): "th",
    ("GEORGIAN",): "ka",
    ("ARMENIAN",): "hy",
    ("ETHIOPIC",): "am",
    ("KHMER",): "km",
    ("SINHALA",): "si",
    ("CJK",): "zh",
    ("CJK", "HIRAGANA", "KATAKANA"): "ja",
    ("HANGUL", "CJK"): "ko",
}
SCRIPTS: dict[str, frozenset[str]] = {
    code: frozenset(scripts)
    for scripts, codes in _CODES_BY_SCRIPTS.items()
    for code in codes.split()
}


def language_of(path: str | Path) -> str | None:
    """The language code of a file named like `train.de` (None if the suffix is not one)."""
    code = Path(path).suffix.lstrip(".").lower()
    return code if code in SCRIPTS else None


def normalise(text: str) -> str:
    """Case-folded, punctuation removed, spacing collapsed: "Hello,  World!" -> "hello world"."""
    return " ".join(_PUNCT.sub(" ", text.casefold()).split())


@lru_cache(maxsize=65536)
def _script(ch: str) -> str:
    return unicodedata.name(ch, "?").split(" ", 1)[0]


def fits_script(text: str, scripts: frozenset[str]) -> bool:
    """Whether at least half of the letters of `text` are in `scripts` (True with < 3 letters:
    too few to judge). ASCII text is all Latin, checked without looking at each letter."""
    if text.isascii():
        return "LATIN" in scripts or sum(c.isalpha() for c in text) < 3
    letters = [c for c in text if c.isalpha()]
    if len(letters) < 3:
        return True
    return 2 * sum(_script(c) in scripts for c in letters) >= len(letters)


@dataclass
class _Side:
    """One file pair's per-line numbers, in arrays (8 bytes a line for each hash)."""

    pair: array = field(default_factory=lambda: array("q"))  # exact pair hash
    norm: array = field(default_factory=lambda: array("q"))  # normalised pair hash
    source: array = field(default_factory=lambda: array("q"))  # normalised source hash
    log_ratio: array = field(default_factory=lambda: array("f"))  # log target/source length
    judged: array = field(default_factory=lambda: array("b"))  # long enough to judge the ratio
    flags: dict[str, list[int]] = field(default_factory=dict)  # per-line kinds: line indices


@dataclass
class CheckReport:
    """Counts per kind, a few examples each, and (for `write_clean`) the lines to drop."""

    files: dict[str, str]
    pairs: int
    languages: dict[str, str | None]
    counts: dict[str, int]
    examples: dict[str, list[dict[str, Any]]]
    drop: np.ndarray  # (pairs,) bool: training lines `write_clean` leaves out

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "pairs": self.pairs,
            "languages": self.languages,
            "counts": self.counts,
            "examples": self.examples,
        }

    def summary(self) -> str:
        """One line: the kinds found, e.g. "3 duplicates, 1 copies" ("nothing found" if none)."""
        found = [f"{n} {kind}" for kind, n in self.counts.items() if n]
        return ", ".join(found) if found else "nothing found"


def _scan(
    src: str | Path, tgt: str | Path | None, max_chars: int, training: bool, bar: bool = False
) -> _Side:
    """One streaming pass over a file pair, or a TSV (DataError for missing, empty, unequal or
    non-UTF-8 files): hashes for every line, and the line indices of the per-line kinds;
    `bar`: a progress bar over the pairs (their count read first: a pass at disk speed)."""
    side = _Side(flags={k: [] for k in ("empty", "control", "long", "copies", "script")})
    scripts = [SCRIPTS.get(language_of(p) or "") if p else None for p in (src, tgt)]
    pairs = raw_pairs(src, tgt)  # checks the files before they are counted
    total = count_lines(src) if bar else None
    with progress(total=total, unit="pair", desc=f"check {Path(src).name}", disable=not bar) as pb:
        for i, (s, t) in enumerate(counted(pairs, pb)):
            s, t = s.strip(), t.strip()
            ns, nt = normalise(s), normalise(t)
            side.pair.append(hash((s, t)))
            side.norm.append(hash((ns, nt)))
            side.source.append(hash(ns))
            side.log_ratio.append(math.log((len(t) + 1) / (len(s) + 1)))
            side.judged.append(bool(s and t) and max(len(s), len(t)) >= RATIO_MIN_CHARS)
            if not training:
                continue
            kinds = side.flags
            if not s or not t:
                kinds["empty"].append(i)
            if _CONTROL.search(s) or _CONTROL.search(t):
                kinds["control"].append(i)
            if len(s) > max_chars or len(t) > max_chars:
                kinds["long"].append(i)
            if ns == nt and any(c.isalpha() for c in ns):
                kinds["copies"].append(i)
            if any(
                sc and text and not fits_script(text, sc)
                for sc, text in zip(scripts, (s, t), strict=True)
            ):
                kinds["script"].append(i)
    return side


def _repeats(hashes: np.ndarray) -> np.ndarray:
    """(N,) bool: True where the hash occurred on an earlier line."""
    first = np.zeros(len(hashes), dtype=bool)
    first[np.unique(hashes, return_index=True)[1]] = True
    return ~first


def check_corpus(
    src: str | Path,
    tgt: str | Path | None,
    evals: dict[str, tuple[str | Path, str | Path | None]] | None = None,
    *,
    max_chars: int = MAX_CHARS,
    examples: bool = True,
    bar: bool = False,
) -> CheckReport:
    """Check a training corpus, two files or a TSV (`tgt` None), and validation/test pairs
    `evals` (e.g. {"valid": (s, t)}) for overlap with it.

    Returns counts of every kind (module docstring), with up to N_EXAMPLES examples each
    (`examples=False` skips the second pass that reads them); `bar` shows a progress bar for
    each file pair scanned (`aiayn data check`, and training's own on a terminal). Bad input
    (a missing, empty or non-UTF-8 file, files of different line counts) is a DataError.
    """
    train = _scan(src, tgt, max_chars, training=True, bar=bar)
    n = len(train.pair)
    masks = {k: np.zeros(n, dtype=bool) for k in PAIR_KINDS}
    for kind, lines in train.flags.items():
        masks[kind][lines] = True
    pair_h, norm_h, src_h = (
        np.frombuffer(a, dtype=np.int64) for a in (train.pair, train.norm, train.source)
    )
    ratio = np.frombuffer(train.log_ratio, dtype=np.float32)
    judged = np.frombuffer(train.judged, dtype=np.int8).astype(bool)
    masks["duplicates"] = _repeats(pair_h)
    masks["near_duplicates"] = _repeats(norm_h) & ~masks["duplicates"]
    if judged.any():  # the median of the pairs long enough to judge: the language pair's ratio
        median = float(np.median(ratio[judged]))
        masks["misaligned"] = judged & (np.abs(ratio - median) > math.log(MISALIGNED_RATIO))
    counts = {k: int(m.sum()) for k, m in masks.items()} | {k: 0 for k in EVAL_KINDS}
    found: dict[str, list[tuple[str, int]]] = {
        k: [("train", int(i)) for i in np.flatnonzero(m)[:N_EXAMPLES]] for k, m in masks.items()
    }
    found |= {k: [] for k in EVAL_KINDS}
    drop = np.zeros(n, dtype=bool)
    for kind, m in masks.items():
        if kind != "near_duplicates":
            drop |= m
    seen_norm, seen_src = norm_h, src_h  # what an evaluation set is compared with
    files = {"src": str(src), "tgt": str(tgt or "")}
    for name, (es, et) in (evals or {}).items():
        files |= {f"{name}_src": str(es), f"{name}_tgt": str(et or "")}
        ev = _scan(es, et, max_chars, training=False, bar=bar)
        e_norm = np.frombuffer(ev.norm, dtype=np.int64)
        e_src = np.frombuffer(ev.source, dtype=np.int64)
        pair_in = np.isin(e_norm, seen_norm)
        src_in = np.isin(e_src, seen_src) & ~pair_in
        counts["overlap"] += int(pair_in.sum())
        counts["overlap_sources"] += int(src_in.sum())
        found["overlap"] += [(name, int(i)) for i in np.flatnonzero(pair_in)[:N_EXAMPLES]]
        found["overlap_sources"] += [(name, int(i)) for i in np.flatnonzero(src_in)[:N_EXAMPLES]]
        drop |= np.isin(src_h, e_src)  # the cleaned training corpus leaks no evaluation source
        seen_norm, seen_src = np.concatenate([seen_norm, e_norm]), np.concatenate([seen_src, e_src])
    found = {k: v[:N_EXAMPLES] for k, v in found.items()}
    paths: dict[str, tuple[str | Path, str | Path | None]] = {"train": (src, tgt), **(evals or {})}
    shown = _read_examples(found, paths) if examples else {k: [] for k in found}
    languages = {"src": language_of(src), "tgt": language_of(tgt) if tgt else None}
    return CheckReport(files, n, languages, counts, shown, drop)


def _read_examples(
    found: dict[str, list[tuple[str, int]]],
    paths: dict[str, tuple[str | Path, str | Path | None]],
) -> dict[str, list[dict[str, Any]]]:
    """The text of the example lines, read in one more pass over each file pair that has any."""
    wanted = {(name, i) for refs in found.values() for name, i in refs}
    text: dict[tuple[str, int], tuple[str, str]] = {}
    for name, (s_path, t_path) in paths.items():
        last = max((i for nm, i in wanted if nm == name), default=-1)
        for i, pair in enumerate(raw_pairs(s_path, t_path)):
            if i > last:
                break
            if (name, i) in wanted:
                text[(name, i)] = pair
    return {
        kind: [
            {
                "file": name,
                "line": i + 1,
                "src": text[(name, i)][0][:200],
                "tgt": text[(name, i)][1][:200],
            }
            for name, i in refs
        ]
        for kind, refs in found.items()
    }


def write_clean(report: CheckReport, out_dir: str | Path) -> dict[str, Any]:
    """Write the training pairs `report` did not drop into the new (or empty) directory
    `out_dir`, under the training files' names; the directory appears whole or not at all."""
    src, tgt = Path(report.files["src"]), Path(report.files["tgt"])
    if not report.files["tgt"]:
        raise DataError("--write needs two files (--src and --tgt), not a TSV")
    if src.name == tgt.name:
        raise DataError(f"--write: {src} and {tgt} have the same name; rename one")
    kept = 0
    with (
        atomic_dir(out_dir) as tmp,
        (tmp / src.name).open("w", encoding="utf-8") as fs,
        (tmp / tgt.name).open("w", encoding="utf-8") as ft,
    ):
        for i, (s, t) in enumerate(raw_pairs(src, tgt)):
            if not report.drop[i]:
                fs.write(s.strip() + "\n")
                ft.write(t.strip() + "\n")
                kept += 1
        for f in (fs, ft):  # on disk before the directory is renamed into place
            f.flush()
            os.fsync(f.fileno())
    out = Path(out_dir)
    return {
        "src": str(out / src.name),
        "tgt": str(out / tgt.name),
        "kept": kept,
        "dropped": report.pairs - kept,
    }
