"""A classifier's data: the labelled-text reader (every format, columns, bad input), the label
set and stratified split, `check_labelled`'s counts, and `aiayn data check --data`."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from paths import SHARED

from aiayn.cli.main import main
from aiayn.errors import AiaynError, DataError
from aiayn.text.label_check import check_labelled
from aiayn.text.labelled import (
    class_balance,
    label_set,
    read_labelled,
    stratified_split,
    training_pairs,
)

SST2 = Path(os.path.normpath(os.path.join(SHARED, "data", "sst2")))

PAIRS = [
    ("pos", "a lovely film"),
    ("neg", "dull, and far too long"),
    ("pos", 'the "best" of the year'),
    ("neg", "bad"),
]


def write(path: Path, pairs=PAIRS, label="label", text="text") -> Path:
    """`pairs` in the format `path`'s suffix names, with these column (key) names."""
    import csv

    if path.suffix in (".tsv", ".csv"):
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, delimiter="\t" if path.suffix == ".tsv" else ",")
            w.writerow([text, "id", label])  # other columns, in another order, are ignored
            w.writerows([t, i, lab] for i, (lab, t) in enumerate(pairs))
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({label: lab, text: t}) + "\n" for lab, t in pairs))
    else:
        path.write_text("".join(f"{lab} {t}\n" for lab, t in pairs))
    return path


@pytest.mark.parametrize("name", ["d.tsv", "d.csv", "d.jsonl", "d.txt"])
def test_every_format_reads_the_same_pairs_in_order(tmp_path, name):
    assert read_labelled(write(tmp_path / name)) == PAIRS


@pytest.mark.parametrize("name", ["d.tsv", "d.csv", "d.jsonl"])
def test_other_column_names_are_read_when_named(tmp_path, name):
    path = write(tmp_path / name, label="sentiment", text="review")
    assert read_labelled(path, "sentiment", "review") == PAIRS
    with pytest.raises(DataError, match="'label'.*--label-column/--text-column") as e:
        read_labelled(path)  # the default names are not there: say which are, and the flags
    assert "\n" not in str(e.value)
    assert main(["data", "check", "--data", str(path)]) == 2
    out = ["data", "check", "--data", str(path), "--label-column", "sentiment"]
    assert main([*out, "--text-column", "review", "--json"]) == 0


def test_a_missing_column_names_the_columns_there_are(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("label,sentence\npos,fine\n")
    with pytest.raises(DataError, match=r"no 'text' column .*\(columns: label, sentence\)"):
        read_labelled(path)
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"label": "pos", "text": "fine"}\n{"label": "neg"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: no 'text' key \(keys: label\)"):
        read_labelled(jsonl)


def test_an_empty_text_names_its_line_unless_it_is_counted(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("label\ttext\npos\tfine\n\nneg\t   \npos\tgood\n")  # line 3 is blank: skipped
    with pytest.raises(DataError, match=r"d.tsv:4: an empty text \(label 'neg'\)"):
        read_labelled(path)
    pairs = read_labelled(path, strict=False)
    assert [label for label, _ in pairs] == ["pos", "neg", "pos"]
    assert check_labelled(pairs).counts == {"empty": 1}
    plain = tmp_path / "d.txt"
    plain.write_text("1 fine\n0\n")
    with pytest.raises(DataError, match=r"d.txt:2: an empty text \(label '0'\)"):
        read_labelled(plain)


def test_csv_quoting_commas_quotes_and_newlines_in_a_field(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(
        "label,text\r\n"
        'pos,"good, and ""funny"""\r\n'
        'neg,"two\nlines"\r\n'
        "neg,\n"  # line 5: the quoted newline above counts as a line
    )
    with pytest.raises(DataError, match="d.csv:5: an empty text"):
        read_labelled(path)
    assert read_labelled(path, strict=False)[:2] == [
        ("pos", 'good, and "funny"'),
        ("neg", "two\nlines"),
    ]


@pytest.mark.parametrize("name", ["b.csv", "b.tsv"])
def test_an_unclosed_quote_does_not_swallow_the_following_lines(tmp_path, name):
    sep = "," if name.endswith(".csv") else "\t"
    path = tmp_path / name
    path.write_text(f'label{sep}text\npos{sep}"never closed\nneg{sep}next\npos{sep}last\n')
    try:
        assert len(read_labelled(path)) == 3
    except DataError as e:  # or a clear line naming where
        assert f"{name}:2" in str(e)


def test_sst2_plain_lines_split_at_the_first_space(tmp_path):
    path = tmp_path / "stsa.binary.dev"
    path.write_text(
        "1 a stirring , funny and finally transporting re-imagining .\n0  k-19 is dull .\n"
    )
    assert read_labelled(path) == [
        ("1", "a stirring , funny and finally transporting re-imagining ."),
        ("0", "k-19 is dull ."),
    ]


def test_the_real_sst2_files_read_as_two_balanced_labels():
    if not SST2.is_dir():
        pytest.skip(f"SST-2 not found at {SST2} (shared data absent)")
    sizes = {}
    for split in ("train", "dev", "test"):
        pairs = read_labelled(SST2 / f"stsa.binary.{split}")
        assert label_set([label for label, _ in pairs]) == ["0", "1"]
        sizes[split] = len(pairs)
    assert sizes == {"train": 6920, "dev": 872, "test": 1821}


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"label\ttext\x00\x01", "binary file"),
        (b"label\ttext\npos\t\xff\xfe bad\n", r"not UTF-8 \(line 2"),
        (b"", "no labelled text"),
        (b"label\ttext\n\n", "no labelled text"),
        (b"label\ttext\npos\n", "1 columns, the header has 2"),
    ],
)
def test_bad_files_are_one_clear_line(tmp_path, content, error, capsys):
    path = tmp_path / "d.tsv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=error):
        read_labelled(path)
    assert main(["data", "check", "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn data: error: ") and err.count("\n") == 1, err


def test_one_label_is_refused_for_training_and_by_the_check(tmp_path, capsys):
    path = write(tmp_path / "d.tsv", [("pos", f"text {i}") for i in range(5)])
    with pytest.raises(DataError, match="every example has the label 'pos'"):
        training_pairs(str(path), "", 0.1, 0, "label", "text")
    assert main(["data", "check", "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert "every example has the label 'pos'" in err and err.count("\n") == 1
    assert check_labelled(read_labelled(path)).counts == {"one_label": 1}


def test_label_set_is_numeric_where_every_label_is_a_number():
    assert label_set(["10", "2", "1", "2"]) == ["1", "2", "10"]
    assert label_set(["b", "10", "a"]) == ["10", "a", "b"]
    assert class_balance(["a", "b", "b", "b"], ["a", "b"]) == "a: 1 (25.0%), b: 3 (75.0%)"


def test_a_stratified_split_keeps_each_labels_share():
    pairs = [("big", f"b{i}") for i in range(900)] + [("small", f"s{i}") for i in range(100)]
    pairs += [("one", "only one")]  # a label with one example stays in training
    kept, held = stratified_split(pairs, 0.1, seed=3)
    assert sorted(kept + held) == list(range(len(pairs))) and not set(kept) & set(held)
    assert kept == sorted(kept) and held == sorted(held)  # file order
    assert Counter(pairs[i][0] for i in held) == {"big": 90, "small": 10}
    assert Counter(pairs[i][0] for i in kept) == {"big": 810, "small": 90, "one": 1}
    assert stratified_split(pairs, 0.1, seed=3) == (kept, held)  # the seed decides
    assert stratified_split(pairs, 0.1, seed=4)[1] != held
    two = [("a", "x"), ("a", "y"), ("b", "z"), ("b", "w")]
    assert Counter(two[i][0] for i in stratified_split(two, 0.01, 0)[1]) == {"a": 1, "b": 1}


def test_check_labelled_counts_each_finding():
    pairs = [
        ("pos", "Good film"),
        ("pos", "good   film"),  # a duplicate: case and spacing do not count
        ("pos", "good film"),  # and another
        ("neg", "good film"),  # the same text with another label: a conflict
        ("neg", "bad"),
        ("neg", " "),
    ] + [("pos", f"fine {i}") for i in range(20)]
    evals = {
        "valid": [("pos", "BAD"), ("neutral", "meh"), ("pos", "new")],
        "test": [("neg", "fine 3")],
    }
    report = check_labelled(pairs, evals)
    assert report.examples == len(pairs)
    assert report.labels == {"neg": 3, "pos": 23}
    assert report.counts == {
        "empty": 1,
        "duplicate": 2,
        "conflict": 1,
        "leak": 2,
        "unseen_label": 1,
    }
    assert report.samples["conflict"] == ["neg/pos\tgood film"]
    assert report.samples["leak"] == ["valid: pos\tbad", "test: neg\tfine 3"]
    assert report.samples["unseen_label"] == ["valid: neutral\tmeh"]
    assert "texts with two or more labels: 1" in report.summary()
    imbalanced = [("a", f"a{i}") for i in range(100)] + [("b", f"b{i}") for i in range(9)]
    found = check_labelled(imbalanced)
    assert found.counts == {"imbalance": 1} and found.samples["imbalance"] == ["b: 9 vs 100"]
    assert check_labelled([("a", "x"), ("b", "y")]).summary() == "nothing found"
    assert json.loads(json.dumps(report.to_json()))["counts"] == report.counts


def test_data_check_prints_the_balance_and_findings_with_examples(tmp_path, capsys):
    train = write(tmp_path / "train.tsv", [*PAIRS, ("pos", "a lovely film"), ("neg", "meh")])
    valid = write(tmp_path / "valid.jsonl", [("neg", "bad"), ("neutral", "fine")])
    test = write(tmp_path / "test.txt", [("pos", "unseen")])
    argv = ["data", "check", "--data", str(train), "--valid-data", str(valid)]
    assert main([*argv, "--test-data", str(test)]) == 0  # findings are warnings
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "train.tsv: 6 examples, 2 labels: neg: 3 (50.0%), pos: 3 (50.0%)"
    assert out[1] == (
        "valid: valid.jsonl: 2 examples: neg: 1 (50.0%), pos: 0 (0.0%), neutral: 1 (50.0%)"
    )
    assert out[2] == "test: test.txt: 1 examples: neg: 0 (0.0%), pos: 1 (100.0%)"
    assert out[3].startswith("findings: duplicate examples (text and label): 1;")
    dup = next(line for line in out if line.split()[0] == "duplicate")
    assert "'pos\\ta lovely film'" in dup
    assert any(line.split()[0] == "leak" and "valid: neg\\tbad" in line for line in out)
    assert any(line.split()[0] == "unseen_label" for line in out)

    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["labels"] == {"neg": 3, "pos": 3} and got["examples"] == 6
    assert got["counts"] == {"duplicate": 1, "leak": 1, "unseen_label": 1}
    assert got["files"] == {"data": str(train), "valid_data": str(valid)}
    assert got["evaluation_examples"] == {"valid": 2}


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--valid-data", "v.tsv"], "--valid-data and --test-data need --data"),
        (["--data", "t.tsv", "--src", "a"], "leave out --src"),
        (["--data", "t.tsv", "--text", "a"], "leave out --text"),
        (["--data", "nowhere.tsv"], "no such file: nowhere.tsv"),
        (["--data", "."], "is a folder"),
    ],
)
def test_data_check_bad_arguments_are_one_line(tmp_path, monkeypatch, argv, error, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "t.tsv")
    assert main(["data", "check", *argv]) == 2
    err = capsys.readouterr().err
    assert error in err and err.count("\n") == 1, err


def test_data_check_without_any_input_names_every_mode(capsys):
    with pytest.raises(AiaynError, match="--data"):
        from aiayn.cli.data_cmd import run_data_check
        from aiayn.cli.main import build_parser

        run_data_check(build_parser().parse_args(["data", "check"]))


def test_data_check_data_answers_without_torch(tmp_path):
    """`aiayn data` is a command that never imports torch (~1.6 s): --data keeps it so."""
    import subprocess
    import sys

    path = write(tmp_path / "d.tsv")
    code = (
        "import sys; from aiayn.cli.main import main; "
        f"assert main(['data', 'check', '--data', {str(path)!r}, '--json']) == 0; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
