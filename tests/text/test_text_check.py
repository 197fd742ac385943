"""text_check.py and `aiayn data check --text`: every planted problem is found at its line, a
clean text has none, the sizes are read_text's, and bad input is one line with exit status 2."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

import aiayn.text.text_check as text_check
from aiayn.cli.main import main
from aiayn.errors import DataError
from aiayn.text.text_check import KINDS, check_text_corpus, log_text_check, suggest_tokenizer

CLEAN = [f"Line number {i} of a text that says something new each time." for i in range(30)]


def write(path, lines, end="\n"):
    path.write_bytes(b"".join((ln if isinstance(ln, bytes) else ln.encode()) + end.encode()
                              for ln in lines))  # fmt: skip
    return path


@pytest.fixture
def planted(tmp_path):
    """A training text with one problem per kind at a known line, and a validation text that
    repeats one long training line and one short one."""
    lines: list[str | bytes] = list(CLEAN[:10])
    where = {}
    for kind, line in [
        ("binary", b"a NUL\x00 byte"),
        ("not_utf8", b"Latin-1 caf\xe9 here"),
        ("control", "a bell\x07 rings"),
        ("duplicates", CLEAN[3]),
    ]:
        lines.append(line)
        where[kind] = len(lines)
    lines += ["", "   ", "Yes.", "Yes.", "Yes."]  # blank lines are no duplicates; "Yes." twice
    train = write(tmp_path / "train.txt", lines)
    valid = write(tmp_path / "valid.txt", ["Something not in training at all.", CLEAN[5], "Yes."])
    return train, valid, where


def test_every_planted_problem_is_found_at_its_line(planted):
    train, valid, where = planted
    report = check_text_corpus(train, valid)
    assert set(report.counts) == set(KINDS)
    expected = {"empty": 0, "binary": 1, "not_utf8": 1, "control": 1, "duplicates": 3}
    assert report.counts == expected | {"leakage": 1}, report.counts  # "Yes." is too short
    for kind, line in where.items():
        assert [e["line"] for e in report.examples[kind]][:1] == [line], kind
    before = sum(len(c) + 1 for c in CLEAN[:10]) + len(b"a NUL\x00 byte\n")
    assert report.examples["not_utf8"][0]["byte"] == before + len(b"Latin-1 caf")
    assert report.examples["leakage"] == [{"file": str(valid), "line": 2, "text": CLEAN[5]}]
    assert report.most_repeated == [{"text": "Yes.", "count": 3}, {"text": CLEAN[3], "count": 2}]
    repeated = len(CLEAN[3]) + 2 * len("Yes.")
    assert report.duplicated_share == pytest.approx(repeated / report.sizes["train"]["characters"])
    assert report.leakage_share == pytest.approx(len(CLEAN[5]) / (valid.stat().st_size))
    summary = report.summary()
    assert "3 duplicates (" in summary and "1 leakage (" in summary and "1 binary" in summary
    assert report.serious


def test_a_clean_text_reports_nothing_and_its_sizes_are_read_texts(tmp_path):
    from aiayn.text.lm_data import read_text

    text = "\ufeff" + "\r\n".join(CLEAN) + "\r\n\r\nThe end, without a newline: é"
    path = tmp_path / "clean.txt"
    path.write_bytes(text.encode())
    report = check_text_corpus(str(path), None)
    assert report.counts == dict.fromkeys(KINDS, 0) and report.summary() == "nothing found"
    assert not report.serious and report.duplicated_share == 0 and report.most_repeated == []
    read = read_text(path)
    size = report.sizes["train"]
    assert size["characters"] == len(read) and size["distinct_characters"] == len(set(read))
    assert size["bytes"] == path.stat().st_size and size["lines"] == 32
    assert size["blank_lines"] == 1 and "valid" not in report.sizes


def test_empty_files_folders_and_comma_separated_files(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    write(folder / "a.txt", CLEAN[:5])
    write(folder / "b.txt", ["  ", ""])  # whitespace only: empty
    (folder / "c.txt").write_bytes(b"")
    (folder / "notes.md").write_text("not a *.txt file\n")
    report = check_text_corpus(folder)
    assert report.files["text"] == [str(folder / n) for n in ("a.txt", "b.txt", "c.txt")]
    assert report.counts["empty"] == 2
    assert [e["file"] for e in report.examples["empty"]] == report.files["text"][1:]
    both = check_text_corpus(f"{folder / 'a.txt'}, {folder / 'a.txt'}")
    assert both.counts["duplicates"] == 5 and both.sizes["train"]["files"] == 2
    with pytest.raises(DataError, match="no such file"):
        check_text_corpus(tmp_path / "missing.txt")


def test_long_lines_are_read_in_pieces_without_false_problems(tmp_path, monkeypatch):
    """Pieces of PIECE_BYTES never cut a character in two (no false `not_utf8`), and line
    numbers count lines, not pieces."""
    monkeypatch.setattr(text_check, "PIECE_BYTES", 7)
    lines = ["ééé€€€😀😀 a long line of wide characters", "short", "€" * 20, "ok"]
    path = write(tmp_path / "wide.txt", [*lines, b"bad \xff here"])
    report = check_text_corpus(path)
    assert report.counts["not_utf8"] == 1 and report.examples["not_utf8"][0]["line"] == 5
    assert report.examples["not_utf8"][0]["byte"] == sum(len(s.encode()) + 1 for s in lines) + 4
    assert report.sizes["train"]["lines"] == 5
    bad = len("bad \ufffd here\n")  # the undecodable byte read as U+FFFD
    assert report.sizes["train"]["characters"] == sum(len(s) + 1 for s in lines) + bad


def test_unseen_validation_characters_and_the_tokenizer_that_fits(tmp_path):
    train = write(tmp_path / "t.txt", CLEAN)
    valid = write(tmp_path / "v.txt", ["Ünïcö"])
    report = check_text_corpus(train, valid)
    assert report.sizes["valid"]["unseen_characters"] == 3  # Ü ï ö
    assert report.tokenizer["suggested"] == "char"
    assert suggest_tokenizer(10_000, 3000)[0] == "byte"
    assert suggest_tokenizer(5_000_000, 3000)[0] == "bpe"


def test_training_logs_one_line(planted, tmp_path, caplog):
    train, valid, _ = planted
    log = logging.getLogger("test_text_check")
    with caplog.at_level(logging.INFO, logger="test_text_check"):
        log_text_check(str(train), str(valid), log)
        clean = write(tmp_path / "clean.txt", CLEAN)
        report = log_text_check(str(clean), "", log)
    warn, info = caplog.records
    assert warn.levelno == logging.WARNING and "aiayn data check --text" in warn.getMessage()
    assert "--valid-text" in warn.getMessage() and "1 binary" in warn.getMessage()
    assert info.levelno == logging.INFO and "text check: nothing found" in info.getMessage()
    assert report.examples["duplicates"] == []  # counts only: no second pass


def test_cli_text_and_json(planted, capsys):
    train, valid, _ = planted
    assert main(["data", "check", "--text", str(train), "--valid-text", str(valid)]) == 0
    out = capsys.readouterr().out
    assert "in train.txt: " in out and "leakage" in out and "tokenizer: char" in out
    assert "not_utf8                1   e.g. train.txt line 12 byte" in out
    assert "most repeated: 'Yes.' x3" in out
    assert main(["data", "check", "--text", str(train), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["counts"]["duplicates"] == 3 and got["files"]["valid_text"] == []
    assert set(got) >= {"sizes", "tokenizer", "most_repeated", "duplicated_share"}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--text", "{d}/missing.txt"], "missing.txt: no such file or folder"),
        (["--text", "{d}/train.txt", "--src", "x.de"], "--src is for a parallel corpus"),
        (["--valid-text", "{d}/train.txt"], "--valid-text needs --text"),
        ([], "give --src and --tgt"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(planted, capsys, argv, message):
    d = planted[0].parent
    assert main(["data", "check", *(a.format(d=d) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_no_torch():
    """`aiayn data check` answers without torch's ~1.6 s import."""
    probe = "import sys, aiayn.text.text_check; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", probe]).returncode == 0
