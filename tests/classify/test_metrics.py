"""The classifier's metrics against scikit-learn's on random labels, the bootstrap's intervals,
and their report (the text tables and the confusion picture)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import (
    accuracy_score,
    confusion_matrix,
    f1_score,
    precision_recall_fscore_support,
)

from aiayn.classify.metrics import bootstrap, confusion, scores
from aiayn.classify.report import confusion_table, score_lines, write_confusion
from aiayn.errors import AiaynError


def random_labels(seed: int, n: int, n_classes: int) -> tuple[list[int], list[int]]:
    """True labels and predictions that agree more often than chance; the last class is
    never predicted, so its precision is undefined (0, as zero_division=0 says)."""
    rng = np.random.default_rng(seed)
    t = rng.integers(0, n_classes, n)
    p = np.where(rng.random(n) < 0.6, t, rng.integers(0, n_classes, n))
    p = np.where(p == n_classes - 1, 0, p)
    return t.tolist(), p.tolist()


@pytest.mark.parametrize(("seed", "n", "n_classes"), [(0, 50, 2), (1, 300, 3), (2, 1000, 7)])
def test_scores_equal_scikit_learns(seed, n, n_classes):
    t, p = random_labels(seed, n, n_classes)
    labels = [f"c{i}" for i in range(n_classes)]
    every = list(range(n_classes))
    conf = confusion(t, p, n_classes)
    np.testing.assert_array_equal(conf, confusion_matrix(t, p, labels=every))
    got = scores(conf, labels)
    assert got["examples"] == n
    assert got["accuracy"] == pytest.approx(accuracy_score(t, p), abs=1e-12)
    macro = f1_score(t, p, average="macro", labels=every, zero_division=0)
    assert got["macro_f1"] == pytest.approx(macro, abs=1e-12)
    precision, recall, f1, support = precision_recall_fscore_support(
        t, p, labels=every, zero_division=0
    )
    for i, name in enumerate(labels):
        row = got["per_class"][name]
        assert row["precision"] == pytest.approx(precision[i], abs=1e-12)
        assert row["recall"] == pytest.approx(recall[i], abs=1e-12)
        assert row["f1"] == pytest.approx(f1[i], abs=1e-12)
        assert row["support"] == support[i]
    assert got["per_class"][labels[-1]]["precision"] == 0.0  # never predicted


def test_a_class_in_neither_labels_nor_predictions_scores_zero_as_scikit_learn():
    t, p = [0, 1, 1, 0], [0, 1, 0, 0]
    got = scores(confusion(t, p, 3), ["a", "b", "c"])
    expected = f1_score(t, p, average="macro", labels=[0, 1, 2], zero_division=0)
    assert got["macro_f1"] == pytest.approx(expected) and got["per_class"]["c"]["support"] == 0


def test_bootstrap_intervals_hold_the_estimate_and_repeat_exactly():
    t, p = random_labels(3, 500, 4)
    point = scores(confusion(t, p, 4), list("abcd"))
    first = bootstrap(t, p, 4, samples=300)
    for key in ("accuracy", "macro_f1"):
        lo, hi = first[key]
        assert 0.0 <= lo < point[key] < hi <= 1.0
        assert hi - lo < 0.2  # 500 examples: a few points either side, not the whole range
    assert bootstrap(t, p, 4, samples=300) == first  # seeded: the same call, the same interval
    assert bootstrap(t, p, 4, samples=300, seed=7) != first
    assert bootstrap([], [], 2) == {"accuracy": (0.0, 0.0), "macro_f1": (0.0, 0.0)}
    perfect = bootstrap([0, 1, 1, 0], [0, 1, 1, 0], 2, samples=50)
    assert perfect["accuracy"] == (1.0, 1.0)


def test_the_text_report_lines():
    conf = np.array([[12345, 1], [2, 30]])
    result = scores(conf, ["negative", "positive"])
    result["intervals"] = {"accuracy": [0.99, 1.0], "macro_f1": [0.9, 0.95]}
    lines = score_lines(result)
    assert lines[0] == "12,378 examples, 2 classes"
    assert lines[1].startswith("accuracy  0.9998   95% interval 0.9900 - 1.0000")
    assert lines[3].split() == ["class", "precision", "recall", "F1", "support"]
    assert lines[4].split()[0] == "negative" and lines[4].split()[-1] == "12,346"
    table = confusion_table(conf, ["negative", "a-very-long-label-name-indeed"])
    assert table[0].split()[-1] == "a-very-long-lab…"  # cut to keep the columns narrow
    assert table[1].split()[1:] == ["12,345", "1"] and table[2].split()[-2:] == ["2", "30"]
    assert len({len(line) for line in table}) == 1  # aligned


def test_the_confusion_picture_is_written_whole_or_refused(tmp_path):
    conf = np.array([[5, 1, 0], [0, 3, 2], [0, 0, 0]])  # a class with no examples: no NaN
    path = write_confusion(conf, ["a", "b", "c"], tmp_path / "conf.png", "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left beside it
    many = np.eye(40, dtype=np.int64) * 3
    svg = write_confusion(many, [f"label {i}" for i in range(40)], tmp_path / "many.svg")
    assert svg.read_text().lstrip().startswith("<?xml")
    with pytest.raises(AiaynError, match=r"\.foo is not an image format"):
        write_confusion(conf, ["a", "b", "c"], tmp_path / "conf.foo")
    with pytest.raises(AiaynError, match="is a directory"):
        write_confusion(conf, ["a", "b", "c"], tmp_path)
