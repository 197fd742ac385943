"""How well a classifier does: accuracy, macro-F1, per-class precision / recall / F1, the
confusion matrix, and 95% bootstrap intervals (pure functions of the labels; NumPy).

    confusion      counts[true][predicted]
    scores         accuracy, macro-F1 and each class's precision, recall, F1 and support
    bootstrap      percentile intervals of accuracy and macro-F1 over resampled examples
                   (as `aiayn evaluate` gives for BLEU: Koehn, 2004)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray


def confusion(y_true: Sequence[int], y_pred: Sequence[int], n_classes: int) -> NDArray[np.int64]:
    """(n_classes, n_classes) counts: row = the true class, column = the predicted one."""
    t, p = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    if t.shape != p.shape:
        raise ValueError(f"{t.size} true labels but {p.size} predictions")
    return np.bincount(t * n_classes + p, minlength=n_classes * n_classes).reshape(
        n_classes, n_classes
    )


def _f1_from(conf: NDArray[np.int64]) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
    """Per-class precision, recall, F1 (0 where undefined, as scikit-learn's zero_division=0)."""
    tp = np.diagonal(conf, axis1=-2, axis2=-1).astype(np.float64)
    predicted, actual = conf.sum(-2), conf.sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, tp / predicted, 0.0)
        recall = np.where(actual > 0, tp / actual, 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    return precision, recall, f1


def scores(conf: NDArray[np.int64], labels: Sequence[str]) -> dict[str, Any]:
    """Accuracy, macro-F1 (the unweighted mean over classes: a rare class counts as much as a
    common one) and each class's precision, recall, F1 and support."""
    total = int(conf.sum())
    precision, recall, f1 = _f1_from(conf)
    return {
        "examples": total,
        "accuracy": float(np.trace(conf) / total) if total else 0.0,
        "macro_f1": float(f1.mean()),
        "per_class": {
            name: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(conf[i].sum()),
            }
            for i, name in enumerate(labels)
        },
    }


def bootstrap(
    y_true: Sequence[int],
    y_pred: Sequence[int],
    n_classes: int,
    samples: int = 1000,
    seed: int = 12345,
) -> dict[str, tuple[float, float]]:
    """95% percentile intervals of accuracy and macro-F1 over `samples` resamples of the
    examples (drawn with replacement, seeded: the same call gives the same interval)."""
    t, p = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    if t.size == 0:
        return {"accuracy": (0.0, 0.0), "macro_f1": (0.0, 0.0)}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, t.size, size=(samples, t.size))
    cells = t[draws] * n_classes + p[draws]  # (samples, n): each draw's confusion cell
    offsets = (np.arange(samples) * n_classes * n_classes)[:, None]
    conf = np.bincount((cells + offsets).ravel(), minlength=samples * n_classes * n_classes)
    conf = conf.reshape(samples, n_classes, n_classes)
    accuracy = np.trace(conf, axis1=1, axis2=2) / t.size
    macro_f1 = _f1_from(conf)[2].mean(-1)

    def interval(x: NDArray[Any]) -> tuple[float, float]:
        lo, hi = np.percentile(x, [2.5, 97.5])
        return float(lo), float(hi)

    return {"accuracy": interval(accuracy), "macro_f1": interval(macro_f1)}
