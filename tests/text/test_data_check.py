"""data_check.py and `aiayn data check`: every planted problem is found, a clean corpus has none,
the cleaned corpus leaves them out, and bad input is one line with exit status 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aiayn.cli.main import main
from aiayn.text.check import KINDS, check_corpus, fits_script, language_of, normalise

ANIMALS = ["cat", "dog", "bird", "horse", "cow", "fish", "mouse", "goat"]
TIERE = ["Katze", "Hund", "Vogel", "Pferd", "Kuh", "Fisch", "Maus", "Ziege"]
PLACES = [("mat", "Matte"), ("chair", "Stuhl"), ("table", "Tisch"), ("bed", "Bett"),
          ("roof", "Dach")]  # fmt: skip


def clean_pairs() -> list[tuple[str, str]]:
    """40 distinct English -> German pairs of ordinary lengths."""
    return [
        (f"The {a} number {i} sits on the {p}.", f"Die {t} Nummer {i} sitzt auf dem {q}.")
        for i, ((a, t), (p, q)) in enumerate(
            (animal, place) for animal in zip(ANIMALS, TIERE, strict=True) for place in PLACES
        )
    ]


def write_pairs(directory: Path, stem: str, pairs: list[tuple[str, str]]) -> tuple[Path, Path]:
    src, tgt = directory / f"{stem}.en", directory / f"{stem}.de"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return src, tgt


# One planted problem per kind, each at a known training line (1-based), plus the evaluation
# pairs that overlap the training corpus.
PLANTED = {
    "duplicates": ("The cat number 0 sits on the mat.", "Die Katze Nummer 0 sitzt auf dem Matte."),
    "near_duplicates": (
        "the CAT number 1 sits on the chair",
        "die Katze Nummer 1 sitzt auf dem Stuhl!!",
    ),
    "copies": ("Hello there, my friend.", "Hello there, my friend."),
    "empty": ("A sentence with no translation.", "   "),
    "control": ("A bell\x07 rings here.", "Eine Glocke läutet hier."),
    "long": ("word " * 250, "Wort " * 250),
    "misaligned": ("The dog barks at night.", "Der Hund bellt. " * 12),
    "script": ("The house is big and old.", "Дом большой и старый."),
}


@pytest.fixture
def planted(tmp_path):
    pairs = clean_pairs()
    where = {}
    for kind, pair in PLANTED.items():
        pairs.append(pair)
        where[kind] = len(pairs)
    train = write_pairs(tmp_path, "train", pairs)
    valid_pairs = [
        (
            "The cat number 2 sits on the table.",
            "Die Katze Nummer 2 sitzt auf dem Tisch.",
        ),  # the training pair of line 3: overlap
        ("The dog number 5 sits on the mat.", "Ganz anders übersetzt."),  # source only
        ("A new sentence for validation only.", "Ein neuer Satz nur zur Validierung."),
    ]
    valid = write_pairs(tmp_path, "valid", valid_pairs)
    return train, valid, where


def test_every_planted_problem_is_found_at_its_line(planted):
    (src, tgt), valid, where = planted
    report = check_corpus(src, tgt, {"valid": valid})
    assert report.pairs == 48 and report.languages == {"src": "en", "tgt": "de"}
    assert set(report.counts) == set(KINDS)
    expected = {kind: 1 for kind in PLANTED} | {"overlap": 1, "overlap_sources": 1}
    assert report.counts == expected, report.counts
    for kind, line in where.items():
        assert [(e["file"], e["line"]) for e in report.examples[kind]] == [("train", line)], kind
    assert [(e["file"], e["line"]) for e in report.examples["overlap"]] == [("valid", 1)]
    assert [(e["file"], e["line"]) for e in report.examples["overlap_sources"]] == [("valid", 2)]
    assert report.examples["control"][0]["src"] == PLANTED["control"][0]


def test_the_progress_bar_changes_nothing_found(planted, monkeypatch, capsys):
    """`aiayn data check` shows a bar over the pairs (1M pairs took 18 s without a word); it
    counts every pair, updated every BAR_EVERY, and the report is the one without it."""
    import aiayn.runtime.progress as progress

    (src, tgt), valid, _ = planted
    monkeypatch.setattr(progress, "BAR_EVERY", 7)  # updates inside the file and a remainder
    monkeypatch.setattr(progress, "interactive", lambda: True)  # a bar, as on a terminal
    with_bar = check_corpus(src, tgt, {"valid": valid}, bar=True)
    err = capsys.readouterr().err
    assert "check train.en: 100%" in err and "48/48" in err and "3/3" in err
    plain = check_corpus(src, tgt, {"valid": valid})
    assert capsys.readouterr().err == ""
    assert with_bar.counts == plain.counts and with_bar.examples == plain.examples


def test_a_clean_corpus_reports_nothing(tmp_path):
    src, tgt = write_pairs(tmp_path, "train", clean_pairs())
    valid = write_pairs(tmp_path, "valid", [("A new sentence.", "Ein neuer Satz.")])
    test = write_pairs(tmp_path, "test", [("Another new one.", "Noch ein neuer.")])
    report = check_corpus(src, tgt, {"valid": valid, "test": test})
    assert report.counts == {kind: 0 for kind in KINDS} and report.summary() == "nothing found"
    assert not report.drop.any()


def test_test_pairs_are_checked_against_validation_too(tmp_path):
    src, tgt = write_pairs(tmp_path, "train", clean_pairs())
    shared = [("A shared sentence.", "Ein geteilter Satz.")]
    valid = write_pairs(tmp_path, "valid", shared)
    test = write_pairs(tmp_path, "test", shared)
    report = check_corpus(src, tgt, {"valid": valid, "test": test})
    assert report.counts["overlap"] == 1 and report.examples["overlap"][0]["file"] == "test"


def test_helpers():
    assert normalise("  Hello,  WORLD!  ") == "hello world"
    assert language_of("data/train.de") == "de" and language_of("train.src") is None
    assert fits_script("Grüße aus Köln", frozenset({"LATIN"}))
    assert not fits_script("Привет мир", frozenset({"LATIN"}))
    assert fits_script("Moskau heißt Москва", frozenset({"LATIN"}))  # a name in another script
    assert fits_script("東京へ行きます", frozenset({"CJK", "HIRAGANA", "KATAKANA"}))


def test_cli_json_and_write_a_cleaned_corpus(planted, tmp_path, capsys):
    (src, tgt), (vsrc, vtgt), _ = planted
    out = tmp_path / "clean"
    args = ["data", "check", "--src", str(src), "--tgt", str(tgt), "--valid-src", str(vsrc),
            "--valid-tgt", str(vtgt), "--json", "--write", str(out)]  # fmt: skip
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["counts"]["duplicates"] == 1 and got["written"]["kept"] == 48 - 9
    kept = list(zip((out / "train.en").read_text().splitlines(),
                    (out / "train.de").read_text().splitlines(), strict=True))  # fmt: skip
    assert len(kept) == 48 - 9  # 8 planted (near duplicates kept) + the valid source's pair
    assert PLANTED["near_duplicates"] in kept and PLANTED["copies"] not in kept
    assert not any(s == "The cat number 2 sits on the table." for s, _ in kept)  # overlap
    assert main(args) == 2  # refuses to write into a directory that holds files
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--write {out} exists and is not empty" in err
    assert main(["data", "check", "--src", str(src), "--tgt", str(tgt)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("48 training pairs (en -> de): ") and "misaligned" in text


@pytest.mark.parametrize("problem", ["missing", "directory", "pipe", "utf8", "lines"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, problem):
    src, tgt = write_pairs(tmp_path, "train", clean_pairs())
    message = {
        "missing": "corpus file not found",
        "directory": "is a directory, not a file",
        "pipe": "is not a regular file (a pipe or a device",  # `--tgt <(zcat ...)`: read twice
        "utf8": "line 3 is not valid UTF-8",
        "lines": "has 40 lines but",
    }[problem]
    if problem == "missing":
        tgt = tmp_path / "nope.de"
    elif problem == "directory":
        tgt = tmp_path
    elif problem == "pipe":
        tgt = tmp_path / "fifo"
        os.mkfifo(tgt)  # opened for reading, a FIFO nobody writes would block forever
    elif problem == "utf8":
        tgt.write_bytes(tgt.read_bytes().replace(b"Nummer 2 ", b"Nummer \xff "))
    else:
        tgt.write_text("".join(f"{i}\n" for i in range(41)))
    assert main(["data", "check", "--src", str(src), "--tgt", str(tgt)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
