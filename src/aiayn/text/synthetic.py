"""Built-in translation corpora that need no download: numbers and dates across 42 languages.

The sentences come from real language rules shipped in PyPI packages, not from templates we
wrote: `num2words` spells out cardinals ("three hundred and forty-two" -> German
"dreihundertzweiundvierzig", units before tens, so attention has to reorder) and `babel`
renders dates with each locale's CLDR formats ("Saturday, November 21, 2026" ->
"Samstag, 21. November 2026").

How values are drawn (docs/synthetic.md has the full story):
- numbers: 0..999,999. The number of digits (1..6) is drawn uniformly for each pair, then a
  number with that many digits, so "seven" is as common as "four hundred thousand and ...".
- dates: every day from 1900-01-01 to 2099-12-31, drawn uniformly; each pair uses one CLDR
  width ("full", "long" or "medium") for both sides, drawn uniformly.
- Splits are disjoint *by value*: within each digit class (for dates, the whole range) the
  values are ordered by a fixed 64-bit hash; the first 10% are `valid`, the next 10% `test`,
  the rest `train`. The assignment depends on the value only, never on the seed, so corpora
  made with different seeds never leak a held-out value into training.
- Within a split, values are drawn without replacement. When `train` asks for more values of
  a class than its pool holds (1-digit numbers: 8 values), the pool is used again in a fresh
  order, pass after pass, so every value appears equally often (+-1). `valid`/`test` never
  repeat: a class that runs out gives its remaining share to the classes that still have room.
- The seed decides which values are drawn and in what order, independently of the languages:
  the same seed gives the same numbers for en-de and for en-fr.
"""

from __future__ import annotations

import copy
import datetime
import functools
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
from babel import Locale
from babel.dates import format_date
from num2words import CONVERTER_CLASSES

from aiayn.atomic import atomic_write_text
from aiayn.errors import DataError

log = logging.getLogger(__name__)

TASKS = ("numbers", "dates")
SPLITS = ("train", "valid", "test")
# Languages both packages support, by their num2words code. Left out: `am` (num2words 0.5.14
# fails on most numbers), `kz` and `tet` (no babel locale), regional variants (en_IN, pt_BR...).
LANGUAGES = (
    "ar",
    "az",
    "be",
    "bn",
    "ca",
    "ce",
    "cs",
    "cy",
    "da",
    "de",
    "en",
    "eo",
    "es",
    "fa",
    "fi",
    "fr",
    "he",
    "hu",
    "id",
    "is",
    "it",
    "ja",
    "kn",
    "ko",
    "lt",
    "lv",
    "nl",
    "no",
    "pl",
    "pt",
    "ro",
    "ru",
    "sk",
    "sl",
    "sr",
    "sv",
    "te",
    "tg",
    "th",
    "tr",
    "uk",
    "vi",
)
# num2words writes Serbian in Latin script; babel's plain `sr` is Cyrillic.
_BABEL_LOCALE = {"sr": "sr_Latn"}
DATE_WIDTHS = ("full", "long", "medium")  # "short" is all digits (11/21/26): nothing to translate
MAX_DIGITS = 6
FIRST_DATE = datetime.date(1900, 1, 1)
LAST_DATE = datetime.date(2099, 12, 31)
HELD_OUT_FRACTION = 0.1  # of each class, for valid and again for test (at least one value each)
# A split is built in memory (~1 KB a pair, ~40 s a million on a 2-core CPU): bounded, and at
# twice the ~1M distinct numbers (dates: ~73k) further pairs only repeat.
MAX_PAIRS = 2_000_000


# --- rendering: one value -> one line of text -------------------------------------------------


def _one_line(text: str) -> str:
    # CLDR uses NARROW NO-BREAK SPACE (ru, uk, be): plain spaces keep files simple to read and
    # to tokenize; str.split() also removes every line break, so one value is one line.
    line = " ".join(text.split())
    if not line:
        raise DataError(f"generated an empty sentence from {text!r}")
    return line


@functools.cache
def _cardinal(lang: str) -> Callable[[int], str]:
    """num2words' converter for `lang`, with its number-word table cut down to <= 10**6.

    Most num2words converters look up each number by scanning `cards`, a table of words for
    every power of ten up to 10**600 in descending order, and skip every entry larger than the
    value. Cutting the entries above 10**6 therefore gives the same words for 0..999,999, and
    is about 10x faster for German or French (measured in docs/synthetic.md). The copy is
    checked against the untouched converter and discarded if any word differs.
    """
    full = CONVERTER_CLASSES[lang]
    cards = getattr(full, "cards", None)
    if not isinstance(cards, dict) or not cards:
        return full.to_cardinal
    fast = copy.copy(full)
    fast.cards = type(cards)((k, v) for k, v in cards.items() if k <= 10**MAX_DIGITS)
    probes = (0, 7, 15, 21, 99, 100, 101, 342, 1000, 1001, 21_000, 100_000, 999_999)
    if any(fast.to_cardinal(v) != full.to_cardinal(v) for v in probes):
        log.warning("num2words %s: trimmed converter differs; using the full one", lang)
        return full.to_cardinal
    return fast.to_cardinal


@functools.cache
def _locale(lang: str) -> Locale:
    return Locale.parse(_BABEL_LOCALE.get(lang, lang))


def number_words(value: int, lang: str) -> str:
    """`value` written out in words in `lang`, e.g. `number_words(342, "de")` ->
    "dreihundertzweiundvierzig". Valid for 0 <= value < 10**6."""
    check_language(lang)
    if not 0 <= value < 10**MAX_DIGITS:  # the trimmed tables in _cardinal stop at 10**6
        raise DataError(f"numbers run from 0 to {10**MAX_DIGITS - 1:,}, got {value:,}")
    return _one_line(_cardinal(lang)(value))


def date_words(day: datetime.date, lang: str, width: str = "full") -> str:
    """`day` in `lang`'s CLDR date format of `width` ("full", "long" or "medium").

    e.g. `date_words(date(2026, 11, 21), "de")` -> "Samstag, 21. November 2026".
    """
    check_language(lang)
    if width not in DATE_WIDTHS:
        raise DataError(f"unknown date width {width!r}; choose one of {', '.join(DATE_WIDTHS)}")
    return _one_line(format_date(day, format=width, locale=_locale(lang)))


# --- validation ---------------------------------------------------------------------------------


def check_language(lang: str) -> None:
    """Raise a one-line `DataError` naming the supported languages unless `lang` is one."""
    if lang not in LANGUAGES:
        raise DataError(f"unsupported language {lang!r}; supported: {', '.join(LANGUAGES)}")


def _check_request(task: str, n: int, split: str, seed: int) -> None:
    if task not in TASKS:
        raise DataError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if n < 0:
        raise DataError(f"the number of pairs must be >= 0, got {n}")
    if n > MAX_PAIRS:
        raise DataError(
            f"asked for {n:,} {split} pairs; at most {MAX_PAIRS:,} a split (built in memory, "
            "~1 KB a pair; past that the pairs only repeat the task's distinct values)"
        )
    if seed < 0:
        raise DataError(f"the seed must be >= 0, got {seed}")


# --- splitting by value ------------------------------------------------------------------------


def _hash64(values: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64 of `values ^ salt`: a fixed, platform-independent 64-bit hash (vectorised)."""
    z = values.astype(np.uint64) ^ np.uint64(salt)
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _classes(task: str) -> list[np.ndarray]:
    """All values of `task`, one array per class: numbers by digit count; dates in one class."""
    if task == "numbers":
        return [np.arange(0 if k == 1 else 10 ** (k - 1), 10**k) for k in range(1, MAX_DIGITS + 1)]
    return [np.arange(FIRST_DATE.toordinal(), LAST_DATE.toordinal() + 1)]


@functools.cache
def split_pools(task: str) -> dict[str, tuple[np.ndarray, ...]]:
    """The values each split may use: `{split: (pool of class 0, pool of class 1, ...)}`.

    Within each class the values are ordered by a fixed hash; the first
    `max(1, round(HELD_OUT_FRACTION * size))` go to `valid`, as many again to `test`, the rest
    to `train`. Depends only on the task, never on a seed. Dates are proleptic ordinals
    (`datetime.date.toordinal`).
    """
    pools: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for values in _classes(task):
        ordered = values[np.argsort(_hash64(values, salt=TASKS.index(task) + 1), kind="stable")]
        k = max(1, round(HELD_OUT_FRACTION * len(values)))
        pools["valid"].append(np.sort(ordered[:k]))
        pools["test"].append(np.sort(ordered[k : 2 * k]))
        pools["train"].append(np.sort(ordered[2 * k :]))
    return {s: tuple(p) for s, p in pools.items()}


# --- drawing values ---------------------------------------------------------------------------


def _class_labels(rng: np.random.Generator, n: int, sizes: list[int], repeat: bool) -> np.ndarray:
    """One class per pair, uniform; without `repeat`, over-full classes pass pairs to others."""
    labels = rng.integers(0, len(sizes), size=n)
    if repeat:
        return labels
    while True:
        counts = np.bincount(labels, minlength=len(sizes))
        room = [c for c in range(len(sizes)) if counts[c] < sizes[c]]
        excess = [np.flatnonzero(labels == c)[sizes[c] :] for c in range(len(sizes))]
        moved = np.concatenate(excess)
        if moved.size == 0:
            return labels
        labels[moved] = rng.choice(room, size=moved.size)


def _take(rng: np.random.Generator, pool: np.ndarray, k: int) -> np.ndarray:
    """k values of `pool`: without replacement, then in further passes each in a fresh order."""
    passes, rest = divmod(k, len(pool))
    parts = [rng.permutation(pool) for _ in range(passes)]
    parts.append(rng.choice(pool, size=rest, replace=False))
    return np.concatenate(parts)


def synth_values(task: str, n: int, seed: int = 0, split: str = "train") -> list[int]:
    """The values behind `synth_pairs`: numbers, or dates as ordinals. Deterministic.

    Args:
        task: "numbers" or "dates".
        n: how many values.
        seed: any non-negative int; same seed, same values, whatever the languages.
        split: "train", "valid" or "test"; the three never share a value.

    Returns:
        n ints in draw order.
    """
    _check_request(task, n, split, seed)
    pools = split_pools(task)[split]
    if split != "train" and n > sum(len(p) for p in pools):
        raise DataError(
            f"asked for {n:,} {split} {task}; held-out values never repeat and the {split} "
            f"split has {sum(len(p) for p in pools):,}"
        )
    rng = np.random.default_rng([seed, TASKS.index(task), SPLITS.index(split)])
    labels = _class_labels(rng, n, [len(p) for p in pools], repeat=split == "train")
    values = np.empty(n, dtype=np.int64)
    for c, pool in enumerate(pools):
        where = np.flatnonzero(labels == c)
        if where.size > len(pool):
            msg = "%s/%s class %d: %d values from a pool of %d, used in passes"
            log.info(msg, task, split, c, where.size, len(pool))
        values[where] = _take(rng, pool, where.size)
    return values.tolist()


def _date_widths(task: str, n: int, seed: int, split: str) -> list[str]:
    # A separate stream, so the values do not depend on how widths are drawn.
    rng = np.random.default_rng([seed, TASKS.index(task), SPLITS.index(split), 1])
    return [DATE_WIDTHS[i] for i in rng.integers(0, len(DATE_WIDTHS), size=n)]


def render(task: str, values: list[int], lang: str, widths: list[str] | None = None) -> list[str]:
    """Values from `synth_values` as sentences in `lang` (dates need one width per value)."""
    check_language(lang)
    if task == "numbers":
        if values and not (min(values) >= 0 and max(values) < 10**MAX_DIGITS):
            raise DataError(f"numbers run from 0 to {10**MAX_DIGITS - 1:,}")
        cardinal = _cardinal(lang)
        return [_one_line(cardinal(v)) for v in values]
    if widths is None or len(widths) != len(values):
        raise DataError("dates need one width per value")
    loc = _locale(lang)
    return [
        _one_line(format_date(datetime.date.fromordinal(v), format=w, locale=loc))
        for v, w in zip(values, widths, strict=True)
    ]


def synth_pairs(
    task: str, src: str, tgt: str, n: int, seed: int = 0, split: str = "train"
) -> list[tuple[str, str]]:
    """n translation pairs (source sentence, target sentence) of `task` from `src` to `tgt`.

    Example: `synth_pairs("numbers", "en", "de", 1, seed=0)` -> one pair such as
    `("three hundred and forty-two", "dreihundertzweiundvierzig")`.
    Deterministic for (task, n, seed, split); splits are disjoint by value (module docstring).
    Raises `DataError` with a one-line message for an unknown task, split or language.
    """
    check_language(src)
    check_language(tgt)
    values = synth_values(task, n, seed, split)
    widths = _date_widths(task, n, seed, split) if task == "dates" else None
    return list(
        zip(render(task, values, src, widths), render(task, values, tgt, widths), strict=True)
    )


def write_corpus(
    out_dir: str | Path,
    task: str,
    src: str,
    tgt: str,
    n_train: int,
    n_valid: int = 1000,
    n_test: int = 1000,
    seed: int = 0,
    overwrite: bool = False,
) -> dict[str, tuple[Path, Path, int]]:
    """Write line-aligned parallel files `out_dir/{train,valid,test}.{src,tgt}` (UTF-8, one
    sentence per line) and `out_dir/synth.json` (how they were made). A split asked for 0
    pairs is not written. Existing files of the same names are refused (a DataError before
    anything is written) unless `overwrite`; then they are replaced atomically.

    Returns:
        `{split: (src_path, tgt_path, n_pairs)}` for every split written.
    """
    import importlib.metadata as md
    import json

    check_language(src)
    check_language(tgt)
    if src == tgt:
        raise DataError(f"source and target language are both {src!r}; the files would collide")
    # Every split is checked before any is written (--valid -1 was refused after train.*).
    for split, n in zip(SPLITS, (n_train, n_valid, n_test), strict=True):
        _check_request(task, n, split, seed)
    out_dir = Path(out_dir)
    if not overwrite:
        names = [
            f"{split}.{lang}"
            for split, n in zip(SPLITS, (n_train, n_valid, n_test), strict=True)
            if n
            for lang in (src, tgt)
        ] + ["synth.json"]
        taken = [name for name in names if (out_dir / name).exists()]
        if taken:
            raise DataError(
                f"{out_dir} already has {', '.join(taken)}: choose another --out, "
                "or --force to replace them"
            )
    written: dict[str, tuple[Path, Path, int]] = {}
    for split, n in zip(SPLITS, (n_train, n_valid, n_test), strict=True):
        pairs = synth_pairs(task, src, tgt, n, seed, split) if n else []
        if not pairs:
            continue
        paths = (out_dir / f"{split}.{src}", out_dir / f"{split}.{tgt}")
        for path, side in zip(paths, zip(*pairs, strict=True), strict=True):
            atomic_write_text(path, "\n".join(side) + "\n")
        written[split] = (*paths, len(pairs))
    manifest = {
        "task": task,
        "src": src,
        "tgt": tgt,
        "seed": seed,
        "pairs": {s: w[2] for s, w in written.items()},
        "versions": {p: md.version(p) for p in ("num2words", "babel")},
    }
    atomic_write_text(out_dir / "synth.json", json.dumps(manifest, indent=2) + "\n")
    return written
