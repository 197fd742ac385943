"""`aiayn classify` and `aiayn evaluate --data` end to end, on a tiny classifier trained here
(a few seconds): the output against `Classifier` in process, every bad input one line and exit
2, and the commands of other kinds of model refusing a classifier (and it them)."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.classify.classifier import Classifier
from aiayn.cli import classify_cmd
from aiayn.cli.main import main
from aiayn.config import ModelConfig
from aiayn.config_files import load_config
from aiayn.nn.encoder_only import EncoderMLM
from aiayn.nn.model import Transformer
from aiayn.nn.variants import DecoderLM
from aiayn.store.model_dir import save_model_dir
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.loop import train

WORDS = {  # the label is the list the one telling word comes from
    "pos": ["great", "lovely", "superb", "charming"],
    "neg": ["awful", "dull", "boring", "tedious"],
    "mixed": ["uneven", "patchy", "middling", "so-so"],
}
FILLER = ["the", "film", "was", "a", "story", "with", "plot", "and", "cast", "very", "quite"]


def labelled(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(list(WORDS))
        words = rng.choices(FILLER, k=rng.randint(2, 12))  # lengths vary: batches sort them
        words.insert(rng.randrange(len(words) + 1), rng.choice(WORDS[label]))
        out.append((label, " ".join(words)))
    return out


def write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("label\ttext\n" + "".join(f"{y}\t{t}\n" for y, t in pairs))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A 3-class classifier (a few seconds of training), its test set and texts, and a
    translator, a language model and a masked LM with its vocabulary (untrained)."""
    root = tmp_path_factory.mktemp("classify_cli")
    data = write_tsv(root / "train.tsv", labelled(600, seed=0))
    cfg = load_config(
        "classify",
        [
            f"train.data={data}",
            f"train.out_dir={root / 'cls'}",
            "train.max_minutes=0",
            "train.max_steps=80",
            "train.lr_schedule=constant",
            "train.lr=3e-3",
            "train.vocab_size=300",
            "train.valid_every=40",
            "train.save_every=40",
            "train.device=cpu",
            "train.dtype=fp32",
            "train.threads=1",
            "model.d_model=32",
            "model.d_ff=64",
            "model.n_layers=1",
            "model.n_heads=2",
            "model.dropout=0.0",
        ],
    )
    train(cfg, progress=False)
    test = labelled(60, seed=1)
    dirs = {
        "cls": root / "cls",
        "test": write_tsv(root / "test.tsv", test),
        "texts": root / "texts.txt",
    }
    dirs["texts"].write_text("".join(t + "\n" for _, t in test))
    tok = Tokenizer.load(root / "cls")
    small = ModelConfig(
        vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=32
    )
    for name, model in (
        ("tr", Transformer(small)),
        ("lm", DecoderLM(small)),
        ("mlm", EncoderMLM(small)),
    ):
        save_model_dir(model, root / name)
        tok.save(root / name)
        dirs[name] = root / name
    return dirs


@pytest.fixture(scope="module")
def classifier(trained) -> Classifier:
    return Classifier.open(trained["cls"], device="cpu", dtype="fp32")


def texts_of(trained) -> list[str]:
    return trained["texts"].read_text().splitlines()


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    got = capsys.readouterr()
    return code, got.out, got.err


def test_the_classifier_learned_its_task(trained, classifier):
    assert classifier.labels == ["mixed", "neg", "pos"]
    pairs = [line.split("\t") for line in trained["test"].read_text().splitlines()[1:]]
    best = [top[0][0] for top in classifier.classify([t for _, t in pairs])]
    assert sum(b == y for b, (y, _) in zip(best, pairs, strict=True)) / len(pairs) > 0.8


def test_classify_writes_one_label_a_line_in_order(trained, classifier, capsys, monkeypatch):
    monkeypatch.setattr(classify_cmd, "CHUNK_LINES", 7)  # several chunks, the last one short
    texts = texts_of(trained)
    code, out, err = run(
        ["classify", "--model", trained["cls"], "--input", trained["texts"]], capsys
    )
    assert code == 0 and err == ""  # no bar where stderr is not a terminal
    expected = [top[0][0] for top in classifier.classify(texts)]
    assert out.splitlines() == expected and len(expected) == len(texts) == 60


def test_json_probabilities_sum_to_one_and_equal_the_classifiers(trained, classifier, capsys):
    texts = texts_of(trained)
    code, out, _ = run(
        ["classify", "--model", trained["cls"], "--input", trained["texts"], "--json"], capsys
    )
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(rows) == len(texts)
    probs = classifier.probabilities(texts)
    for row, p in zip(rows, probs.tolist(), strict=True):
        assert list(row["probabilities"]) == classifier.labels
        got = list(row["probabilities"].values())
        assert sum(got) == pytest.approx(1.0, abs=1e-5)
        assert got == pytest.approx(p, abs=1e-6)
        assert row["label"] == classifier.labels[max(range(3), key=got.__getitem__)]


def test_top_k_lists_the_likeliest_best_first(trained, classifier, capsys):
    texts = texts_of(trained)
    argv = ["classify", "--model", trained["cls"], "--input", trained["texts"], "--top-k", "2"]
    code, out, _ = run([*argv, "--json"], capsys)
    expected = classifier.classify(texts, top_k=2)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(rows) == len(texts)
    for row, top in zip(rows, expected, strict=True):
        assert row["label"] == top[0][0] == row["probabilities"][0][0]
        assert [lab for lab, _ in row["probabilities"]] == [lab for lab, _ in top]
        assert [p for _, p in row["probabilities"]] == pytest.approx([p for _, p in top])
    code, out, _ = run(argv, capsys)  # plain: tab-separated label and probability pairs
    first = out.splitlines()[0].split("\t")
    assert code == 0 and first[0::2] == [lab for lab, _ in expected[0]]
    assert [float(p) for p in first[1::2]] == pytest.approx([p for _, p in expected[0]], abs=1e-4)


def test_stdin_and_an_output_file(trained, classifier, capsys, monkeypatch, tmp_path):
    texts = texts_of(trained)[:5]
    stdin = io.TextIOWrapper(io.BytesIO("".join(t + "\r\n" for t in texts).encode()))
    monkeypatch.setattr(sys, "stdin", stdin)
    out = tmp_path / "labels.txt"
    code, printed, _ = run(
        ["classify", "--model", trained["cls"], "--input", "-", "--output", out], capsys
    )
    assert code == 0 and printed == ""
    assert out.read_text().splitlines() == [top[0][0] for top in classifier.classify(texts)]


def test_the_console_command_reads_stdin(trained, classifier):
    texts = texts_of(trained)[:3]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "classify",
            "--model",
            str(trained["cls"]),
            "--input",
            "-",
            "--device",
            "cpu",
        ],
        input="\n".join(texts),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [top[0][0] for top in classifier.classify(texts)]


def test_evaluate_data_scores_as_the_classifier_does_in_process(
    trained, classifier, capsys, tmp_path
):
    pairs = [line.split("\t") for line in trained["test"].read_text().splitlines()[1:]]
    predicted = classifier.probabilities([t for _, t in pairs]).argmax(-1).tolist()
    index = {label: i for i, label in enumerate(classifier.labels)}
    accuracy = sum(p == index[y] for p, (y, _) in zip(predicted, pairs, strict=True)) / len(pairs)
    png = tmp_path / "confusion.png"
    argv = ["evaluate", "--model", trained["cls"], "--data", trained["test"]]
    code, out, _ = run([*argv, "--json", "--confusion", png, "--bootstrap", "200"], capsys)
    result = json.loads(out)
    assert code == 0 and result["examples"] == len(pairs) == 60
    assert result["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    lo, hi = result["intervals"]["accuracy"]
    assert lo <= result["accuracy"] <= hi
    lo, hi = result["intervals"]["macro_f1"]
    assert lo <= result["macro_f1"] <= hi
    assert result["bootstrap"] == {"samples": 200, "seed": 12345, "level": 0.95}
    matrix = torch.tensor(result["confusion"]["matrix"])
    assert result["confusion"]["labels"] == classifier.labels and int(matrix.sum()) == 60
    assert int(matrix.trace()) == round(accuracy * 60)
    assert set(result["per_class"]) == set(classifier.labels)
    assert png.read_bytes()[:4] == b"\x89PNG" and result["confusion_image"] == str(png)

    code, out, _ = run([*argv, "--bootstrap", "0"], capsys)  # the text report
    lines = out.splitlines()
    assert code == 0 and lines[0] == "60 examples, 3 classes"
    assert lines[1] == f"accuracy  {accuracy:.4f}"  # no interval asked for
    assert "confusion matrix (rows: true label, columns: predicted)" in lines
    table = lines[lines.index("confusion matrix (rows: true label, columns: predicted)") + 1 :]
    assert table[0].split()[-3:] == classifier.labels and len(table) == 4


def test_other_column_names_are_named_with_flags(trained, capsys, tmp_path):
    rows = trained["test"].read_text().splitlines()[1:]
    pairs = [row.split("\t") for row in rows]
    csv = tmp_path / "test.csv"  # quoted texts, other column names, in another order
    csv.write_text("review,sentiment\n" + "".join(f'"{t}",{y}\n' for y, t in pairs))
    argv = ["evaluate", "--model", trained["cls"], "--data", csv, "--json", "--bootstrap", "0"]
    code, out, err = run([*argv, "--label-column", "sentiment", "--text-column", "review"], capsys)
    assert code == 0, err
    assert json.loads(out)["examples"] == 60
    code, _, err = run(argv, capsys)
    assert code == 2 and "no 'label' or 'text' column" in err and err.count("\n") == 1


def bad_inputs(trained: dict[str, Path], tmp: Path) -> list[tuple[list, str]]:
    cls, texts, test = trained["cls"], trained["texts"], trained["test"]
    gap = tmp / "gap.txt"
    gap.write_text("a good film\nfine\n  \nlast\n")
    other = write_tsv(
        tmp / "other.tsv", [("pos", "fine film"), ("sarcastic", "oh great"), ("ironic", "sure")]
    )
    empty = tmp / "empty.tsv"
    empty.write_text("label\ttext\npos\tfine\nneg\t\n")
    (tmp / "dir").mkdir(exist_ok=True)
    c = ["classify", "--model", cls, "--input"]
    e = ["evaluate", "--model", cls, "--data", test]
    return [
        ([*c, gap], "gap.txt: line 3 is empty; every line is one text to classify"),
        ([*c, texts, "--top-k", "0"], "--top-k must be at least 1"),
        ([*c, texts, "--top-k", "4"], "--top-k 4: the classifier has 3 labels"),
        ([*c, texts, "--output", texts], "is the input file"),
        ([*c, texts, "--output", tmp / "dir"], "is a directory"),
        ([*c, tmp / "nowhere.txt"], "No such file or directory"),
        (["classify", "--model", tmp / "nowhere", "--input", texts], "model directory not found"),
        ([*c, texts, "--device", "cuda:7"], "cuda"),
        (
            ["evaluate", "--model", cls, "--data", other],
            "labels the classifier does not know: 'ironic', 'sarcastic' (its labels: mixed, neg, "
            "pos)",
        ),
        (["evaluate", "--model", cls, "--data", empty], "empty.tsv:3: an empty text"),
        (["evaluate", "--model", cls, "--data", tmp / "nowhere.tsv"], "no such file"),
        ([*e, "--confusion", tmp / "c.foo"], ".foo is not an image format"),
        ([*e, "--confusion", tmp / "dir"], "is a directory"),
        ([*e, "--bootstrap", "-1"], "--bootstrap must be in [0, 100,000]"),
        ([*e, "--src", texts, "--ref", texts], "--data scores a classifier"),
        (
            ["evaluate", "--model", cls, "--text", texts, "--bootstrap", "9"],
            "--confusion and --bootstrap score a classifier: give --data",
        ),
    ]


def test_every_bad_input_is_one_line_and_exit_2(trained, capsys, tmp_path):
    for argv, message in bad_inputs(trained, tmp_path):
        code, _, err = run(argv, capsys)
        assert code == 2, (argv, err)
        assert message in err and err.count("\n") == 1, (argv, err)
        assert err.startswith(f"aiayn {argv[0]}: error: "), err
    assert not (tmp_path / "c.foo").exists()


def test_a_failed_run_leaves_no_output_file(trained, capsys, tmp_path):
    gap = tmp_path / "gap.txt"
    gap.write_text("fine\n\n")
    out = tmp_path / "labels.txt"
    code, _, _ = run(
        ["classify", "--model", trained["cls"], "--input", gap, "--output", out], capsys
    )
    assert code == 2 and list(tmp_path.iterdir()) == [gap]


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        ("tr", "holds a translator, not a classifier (aiayn translate"),
        ("lm", "holds a language model, not a classifier (aiayn generate"),
        ("mlm", "holds a masked language model (a pre-trained encoder), not a classifier"),
    ],
)
def test_another_kind_of_model_is_one_line_naming_its_commands(trained, kind, what, capsys):
    for argv in (
        ["classify", "--model", trained[kind], "--input", trained["texts"]],
        ["evaluate", "--model", trained[kind], "--data", trained["test"]],
    ):
        code, _, err = run(argv, capsys)
        assert code == 2 and what in err and err.count("\n") == 1, err


def test_a_classifier_given_to_the_other_commands_says_what_it_is(trained, capsys):
    cls, texts = trained["cls"], trained["texts"]
    for argv, what in (
        (["generate", "--model", cls, "--prompt", "hi"], "not a language model"),
        (["evaluate", "--model", cls, "--text", texts], "not a language model"),
        (["translate", "--model", cls, "--input", texts], "not a translator"),
        (["evaluate", "--model", cls, "--src", texts, "--ref", texts], "not a translator"),
    ):
        code, _, err = run(argv, capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert f"holds a classifier, {what} (aiayn classify, aiayn evaluate --data)" in err, err


def test_an_onnx_export_classifies_and_evaluates_as_the_model_does(
    trained, classifier, capsys, tmp_path
):
    pytest.importorskip("onnxruntime", reason="onnxruntime not installed (pip install .[test])")
    pytest.importorskip("onnx", reason="onnx not installed (pip install .[test])")
    out = tmp_path / "exported"
    code, _, err = run(["export", "onnx", "--model", trained["cls"], "--out", out], capsys)
    assert code == 0, err
    texts = texts_of(trained)
    code, printed, err = run(
        ["classify", "--model", out, "--input", trained["texts"], "--json"], capsys
    )
    assert code == 0, err
    rows = [list(json.loads(line)["probabilities"].values()) for line in printed.splitlines()]
    torch.testing.assert_close(
        torch.tensor(rows), classifier.probabilities(texts), atol=1e-5, rtol=0
    )
    argv = ["evaluate", "--model", out, "--data", trained["test"], "--json", "--bootstrap", "0"]
    code, printed, _ = run(argv, capsys)
    code_in, printed_in, _ = run([*argv[:2], trained["cls"], *argv[3:]], capsys)
    assert code == code_in == 0
    assert json.loads(printed)["accuracy"] == json.loads(printed_in)["accuracy"]
    code, _, err = run(
        ["classify", "--model", out, "--input", trained["texts"], "--dtype", "bf16"], capsys
    )
    assert code == 2 and "runs on the CPU in fp32" in err and err.count("\n") == 1
