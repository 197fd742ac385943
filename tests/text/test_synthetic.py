"""synthetic.py: the built-in numbers/dates corpus (num2words + babel) and `aiayn data synth`."""

from __future__ import annotations

import datetime
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from num2words import num2words

from aiayn.cli.main import main
from aiayn.errors import DataError
from aiayn.text.corpus import DataStats, read_parallel
from aiayn.text.synthetic import (
    DATE_WIDTHS,
    FIRST_DATE,
    LANGUAGES,
    LAST_DATE,
    SPLITS,
    date_words,
    number_words,
    split_pools,
    synth_pairs,
    synth_values,
)

SAT = datetime.date(2026, 11, 21)


def digits(v: int) -> int:
    return len(str(v))


# --- known pairs: the real rules of num2words and babel ------------------------------------------


@pytest.mark.parametrize(
    ("value", "lang", "words"),
    [
        (342, "en", "three hundred and forty-two"),
        (342, "de", "dreihundertzweiundvierzig"),  # units before tens: attention must reorder
        (342, "fr", "trois cent quarante-deux"),
        (21, "de", "einundzwanzig"),
        (71, "fr", "soixante et onze"),
        (80, "fr", "quatre-vingts"),
        (80, "es", "ochenta"),
        (0, "en", "zero"),
        (999_999, "de", "neunhundertneunundneunzigtausendneunhundertneunundneunzig"),
    ],
)
def test_known_numbers(value, lang, words):
    assert number_words(value, lang) == words


@pytest.mark.parametrize(
    ("lang", "width", "text"),
    [
        ("en", "full", "Saturday, November 21, 2026"),
        ("de", "full", "Samstag, 21. November 2026"),
        ("fr", "full", "samedi 21 novembre 2026"),
        ("es", "full", "sábado, 21 de noviembre de 2026"),
        ("en", "long", "November 21, 2026"),
        ("de", "medium", "21.11.2026"),
        ("ru", "long", "21 ноября 2026 г."),  # CLDR's narrow no-break space becomes a space
    ],
)
def test_known_dates(lang, width, text):
    assert date_words(SAT, lang, width) == text


def test_pairs_are_the_rendered_values_in_both_languages():
    values = synth_values("numbers", 50, seed=3)
    pairs = synth_pairs("numbers", "de", "en", 50, seed=3)
    assert pairs == [(number_words(v, "de"), number_words(v, "en")) for v in values]
    days = [datetime.date.fromordinal(v) for v in synth_values("dates", 30, seed=3)]
    for day, pair in zip(days, synth_pairs("dates", "fr", "es", 30, seed=3), strict=True):
        assert pair in {(date_words(day, "fr", w), date_words(day, "es", w)) for w in DATE_WIDTHS}


# --- every language, both tasks ---------------------------------------------------------------


def test_trimmed_converters_match_num2words_in_every_language():
    # The speed-up in synthetic._cardinal must not change a single word: oracle = num2words().
    rng = np.random.default_rng(0)
    sample = [0, 1, 10, 100, 1000, 10**5, 999_999]
    sample += [int(rng.integers(10 ** (k - 1), 10**k)) for k in range(1, 7) for _ in range(15)]
    for lang in LANGUAGES:
        for v in sample:
            assert number_words(v, lang) == " ".join(num2words(v, lang=lang).split()), (lang, v)


@pytest.mark.parametrize("task", ["numbers", "dates"])
def test_every_language_gives_clean_single_lines(task):
    for lang in LANGUAGES:
        pairs = synth_pairs(task, "en", lang, 60, seed=1, split="test")
        for src, tgt in pairs:
            for line in (src, tgt):
                assert line and line == line.strip()
                assert not any(c in line for c in "\n\r\t\u2028\u2029\x0b\x0c\x85\u00a0\u202f")


# --- determinism ------------------------------------------------------------------------------


def test_deterministic_for_a_seed():
    a = synth_pairs("numbers", "en", "de", 500, seed=7, split="train")
    assert a == synth_pairs("numbers", "en", "de", 500, seed=7, split="train")
    assert a != synth_pairs("numbers", "en", "de", 500, seed=8, split="train")
    b = synth_pairs("dates", "en", "de", 300, seed=7, split="valid")
    assert b == synth_pairs("dates", "en", "de", 300, seed=7, split="valid")
    # The seed picks the values, the languages only render them: en-de and fr-es share numbers.
    assert [number_words(v, "fr") for v in synth_values("numbers", 500, seed=7)] == [
        s for s, _ in synth_pairs("numbers", "fr", "es", 500, seed=7)
    ]


# --- splits: disjoint by value, whatever the seed ------------------------------------------------


@pytest.mark.parametrize("task", ["numbers", "dates"])
def test_split_pools_partition_the_value_space(task):
    pools = split_pools(task)
    per_split = {s: np.concatenate(pools[s]) for s in SPLITS}
    every = np.concatenate(list(per_split.values()))
    if task == "numbers":
        assert np.array_equal(np.sort(every), np.arange(10**6))
        assert [len(p) for p in pools["valid"]] == [1, 9, 90, 900, 9000, 90000]
        assert [len(p) for p in pools["train"]] == [8, 72, 720, 7200, 72000, 720000]
    else:
        days = LAST_DATE.toordinal() - FIRST_DATE.toordinal() + 1
        assert np.array_equal(np.sort(every), np.arange(days) + FIRST_DATE.toordinal())
        assert len(per_split["test"]) == round(0.1 * days)


@settings(max_examples=8, deadline=None)
@given(task=st.sampled_from(["numbers", "dates"]), seeds=st.lists(st.integers(0, 2**31), min_size=3,
       max_size=3))  # fmt: skip
def test_splits_disjoint_by_value_across_seeds(task, seeds):
    # Different seeds per split on purpose: a held-out value never reaches training anyway.
    got = {s: set(synth_values(task, 3000, seed, s)) for s, seed in zip(SPLITS, seeds, strict=True)}
    assert not got["train"] & got["valid"]
    assert not got["train"] & got["test"]
    assert not got["valid"] & got["test"]


# --- how values are drawn ------------------------------------------------------------------------


def test_digit_counts_are_balanced():
    # Each pair draws its digit count uniformly from 1..6: count ~ Binomial(6000, 1/6), mean 1000,
    # sd 28.9. Tolerance +-150 (5.2 sd) for each of the six counts.
    counts = Counter(digits(v) for v in synth_values("numbers", 6000, seed=11))
    assert sorted(counts) == [1, 2, 3, 4, 5, 6]
    for k, c in counts.items():
        assert abs(c - 1000) <= 150, (k, c)


def test_train_draws_without_replacement_then_in_even_passes():
    values = synth_values("numbers", 6000, seed=5)
    long = [v for v in values if digits(v) >= 4]
    assert len(long) == len(set(long))  # pools of 7,200+ values: no repeat in ~1000 draws
    # Train pools of 8, 72 and 720 values are used in passes: every value equally often (+-1).
    for k, pool_size in [(1, 8), (2, 72), (3, 720)]:
        seen = Counter(v for v in values if digits(v) == k)
        assert len(seen) == pool_size and max(seen.values()) - min(seen.values()) <= 1


def test_held_out_splits_never_repeat_and_pass_on_what_a_class_lacks():
    values = synth_values("numbers", 1200, seed=2, split="test")
    assert len(set(values)) == 1200
    counts = Counter(digits(v) for v in values)
    # Test pools hold 1, 9 and 90 values of 1, 2 and 3 digits: each gives all it has and the
    # remaining ~500 of their 200-each share goes to 4-6 digits (about 367 each).
    assert (counts[1], counts[2], counts[3]) == (1, 9, 90)
    assert min(counts[k] for k in (4, 5, 6)) > 300
    dates = synth_values("dates", 7305, seed=2, split="valid")  # the whole valid pool
    assert len(set(dates)) == 7305
    with pytest.raises(DataError, match="valid split has 7,305"):
        synth_values("dates", 7306, seed=2, split="valid")


def test_dates_span_the_range_and_vary_the_format():
    values = synth_values("dates", 5000, seed=4)
    years = [datetime.date.fromordinal(v).year for v in values]
    assert min(years) < 1910 and max(years) > 2090
    en = [s for s, _ in synth_pairs("dates", "en", "de", 300, seed=4)]
    full = sum(s.split(",")[0] in {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
                                   "Saturday", "Sunday"} for s in en)  # fmt: skip
    short_month = sum(s[:3].isalpha() and s[3] == " " for s in en)  # medium: "Mar 4, 1905"
    assert 60 < full < 140 and 60 < short_month < 140  # each width ~1/3 of 300


@pytest.mark.parametrize(
    "call",
    [
        lambda: synth_pairs("numbers", "en", "xx", 1),
        lambda: synth_pairs("letters", "en", "de", 1),
        lambda: synth_pairs("numbers", "en", "de", 1, split="dev"),
        lambda: synth_pairs("numbers", "en", "de", -1),
        lambda: synth_pairs("numbers", "en", "de", 1, seed=-1),
        lambda: number_words(10**6, "en"),
        lambda: date_words(SAT, "en", "short"),
    ],
)
def test_bad_requests_are_data_errors(call):
    with pytest.raises(DataError):
        call()


# --- the command line ---------------------------------------------------------------------------


def test_cli_writes_line_aligned_files_every_reader_accepts(tmp_path, capsys):
    out = tmp_path / "corpus"
    argv = ["data", "synth", "--task", "numbers", "--src", "en", "--tgt", "de", "--n", "600",
            "--valid", "50", "--test", "70", "--seed", "9", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "train: 600 pairs" in capsys.readouterr().out
    for split, n in [("train", 600), ("valid", 50), ("test", 70)]:
        src, tgt = out / f"{split}.en", out / f"{split}.de"
        src_lines = src.read_text("utf-8").split("\n")
        assert src_lines[-1] == "" and len(src_lines) == n + 1  # one line per pair, final newline
        stats = DataStats()
        pairs = list(read_parallel(src, tgt, stats))
        assert stats.dropped == 0
        assert pairs == synth_pairs("numbers", "en", "de", n, seed=9, split=split)
    manifest = json.loads((out / "synth.json").read_text())
    assert manifest["pairs"] == {"train": 600, "valid": 50, "test": 70}


def test_cli_dates_and_zero_held_out(tmp_path):
    out = tmp_path / "d"
    argv = ["data", "synth", "--task", "dates", "--src", "fr", "--tgt", "es", "--n", "40",
            "--valid", "0", "--test", "0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["synth.json", "train.es", "train.fr"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--src", "xx", "--tgt", "de"], "unsupported language 'xx'; supported: ar, az,"),
        (["--src", "en", "--tgt", "klingon"], "unsupported language 'klingon'"),
        (["--src", "en", "--tgt", "en"], "both 'en'"),
        # refused before train.* is written (they were written, then --valid was refused)
        (["--src", "en", "--tgt", "de", "--valid", "-1"], "must be >= 0, got -1"),
        # a billion pairs would be built in memory (~1 TB): refused before any work
        (["--src", "en", "--tgt", "de", "--n", "1000000000"], "at most 2,000,000 a split"),
    ],
)
def test_cli_bad_language_is_one_line_exit_2(tmp_path, capsys, flags, message):
    out = tmp_path / "never"
    argv = ["data", "synth", "--task", "numbers", "--n", "10", "--out", str(out), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("aiayn data: error:")
    assert not out.exists()


def test_cli_refuses_to_replace_a_users_files_without_force(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.en").write_text("my own corpus\n")
    argv = ["data", "synth", "--task", "numbers", "--src", "en", "--tgt", "de", "--n", "20",
            "--valid", "0", "--test", "0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already has train.en" in err and "--force" in err
    assert sorted(p.name for p in out.iterdir()) == ["train.en"]  # nothing was written
    assert (out / "train.en").read_text() == "my own corpus\n"
    assert main([*argv, "--force"]) == 0
    assert (out / "train.en").read_text() != "my own corpus\n"
