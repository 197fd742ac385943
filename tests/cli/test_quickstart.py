"""`aiayn quickstart`, shortened: every artefact is written and the model directory is usable.

The full run (50,000 pairs, 3.5 minutes, >= 95% exact match) is a benchmark: see
docs/lab/quickstart.md. Here the training budget is seconds, so only the plumbing is checked.
"""

import json

from aiayn.cli.main import main
from aiayn.translate.translator import Translator


def test_quickstart_writes_metrics_picture_and_a_usable_model(tmp_path, capsys):
    out = tmp_path / "qs"
    code = main(["quickstart", "--out", str(out), "--minutes", "0.05",
                 "--n-train", "600", "--n-test", "20"])  # fmt: skip
    assert code == 0
    report = capsys.readouterr().out
    assert "exact match" in report and "cross-attention picture" in report
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("exact_match", "bleu", "chrf", "train_seconds"):
        assert isinstance(metrics[key], float | int), key
    assert 0.0 <= metrics["exact_match"] <= 100.0
    assert metrics["test_pairs"] == 20
    png = (out / "cross_attention.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert len((out / "translations.txt").read_text().splitlines()) == 20
    translator = Translator.load(out / "model")
    assert len(translator.translate(["forty-two", ""])) == 2
    # held-out numbers never occur in training
    train_src = set((out / "data" / "train.en").read_text().splitlines())
    test_src = (out / "data" / "test.en").read_text().splitlines()
    assert not train_src & set(test_src)
    # A rerun resumes the finished run (its budget spent) and says so.
    assert main(["quickstart", "--out", str(out), "--minutes", "0.05",
                 "--n-train", "600", "--n-test", "20"]) == 0  # fmt: skip
    again = json.loads((out / "metrics.json").read_text())
    assert again["resumed_from_step"] == metrics["steps"] > 0
    assert f"resumed {out / 'model'} at step {metrics['steps']}" in capsys.readouterr().out


def test_quickstart_rejects_bad_arguments(tmp_path, capsys):
    assert main(["quickstart", "--out", str(tmp_path), "--minutes", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--minutes must be > 0" in err
