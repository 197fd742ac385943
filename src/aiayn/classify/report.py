"""A classifier's evaluation, for people: the scores and the confusion matrix as text tables,
and the confusion matrix as a picture (`aiayn evaluate --data ... [--confusion out.png]`).

    score_lines       accuracy and macro-F1 (with their 95% intervals), then each class's
                      precision, recall, F1 and support
    confusion_table   the confusion matrix as text: a row per true label, a column per
                      predicted one
    write_confusion   the confusion matrix as an image (PNG unless the suffix names another),
                      written atomically

Figures use matplotlib's object API on the Agg canvas (no pyplot, no global backend switch), so
they work headless and never touch a caller's own matplotlib state.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from aiayn.atomic import atomic_write_bytes
from aiayn.errors import AiaynError

NAME_CHARS = 16  # a label is cut to this many characters in a table's header
MAX_CELL_NOTES = 30  # classes up to which each cell of the picture shows its count
MAX_FIGURE_INCHES = 40.0  # the picture's side, however many classes (4,000 px at 100 dpi)


def _name(label: str, width: int = NAME_CHARS) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def score_lines(result: dict[str, Any]) -> list[str]:
    """Accuracy, macro-F1 and the per-class table of `aiayn.classify.metrics.scores`' result
    (with `intervals`, bootstrap's 95% intervals, when the result has them)."""
    intervals = result.get("intervals") or {}
    lines = [f"{result['examples']:,} examples, {len(result['per_class'])} classes"]
    for key, name in (("accuracy", "accuracy"), ("macro_f1", "macro-F1")):
        line = f"{name:9} {result[key]:.4f}"
        if key in intervals:
            lo, hi = intervals[key]
            line += f"   95% interval {lo:.4f} - {hi:.4f}"
        lines.append(line)
    width = max([5, *(len(_name(c)) for c in result["per_class"])])
    lines.append(f"{'class':{width}} {'precision':>9} {'recall':>7} {'F1':>7} {'support':>8}")
    for label, s in result["per_class"].items():
        lines.append(
            f"{_name(label):{width}} {s['precision']:9.4f} {s['recall']:7.4f} {s['f1']:7.4f} "
            f"{s['support']:8,}"
        )
    return lines


def confusion_table(conf: NDArray[np.int64], labels: Sequence[str]) -> list[str]:
    """The confusion matrix as text lines: row = the true label, column = the predicted one
    (the diagonal holds the correct answers)."""
    names = [_name(label) for label in labels]
    corner = "true \\ predicted"
    row_width = max([len(corner), *map(len, names)])
    cell = max([len(f"{int(conf.max()):,}") if conf.size else 1, *map(len, names)])
    lines = [f"{corner:{row_width}} " + " ".join(f"{n:>{cell}}" for n in names)]
    for name, row in zip(names, conf.tolist(), strict=True):
        lines.append(f"{name:{row_width}} " + " ".join(f"{n:>{cell},}" for n in row))
    return lines


def image_format(path: str | Path, flag: str = "--confusion") -> str:
    """The image format `path`'s suffix names (PNG without one); a suffix matplotlib cannot
    write, or a directory, is an AiaynError, said before any work is done."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    if path.is_dir():
        raise AiaynError(f"{flag} {path} is a directory; give an image file (e.g. confusion.png)")
    fmt = path.suffix.lstrip(".").lower() or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if fmt not in formats:
        raise AiaynError(
            f"{flag} {path}: .{fmt} is not an image format that can be written "
            f"(png, svg, pdf, ...: {', '.join(sorted(formats))})"
        )
    return fmt


def write_confusion(
    conf: NDArray[np.int64], labels: Sequence[str], path: str | Path, title: str = ""
) -> Path:
    """Draw the confusion matrix and write it to `path` whole or not at all.

    Each cell's colour is its share of its row (the true label's examples), so a rare class's
    mistakes show as plainly as a common one's; the cells carry the counts themselves."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fmt = image_format(path)
    n = len(labels)
    side = min(MAX_FIGURE_INCHES, max(4.0, 1.2 + 0.6 * n))
    fig = Figure(figsize=(side + 1.2, side))
    FigureCanvasAgg(fig)  # drawn by Agg, whatever backend the caller's matplotlib has
    ax = fig.add_subplot()
    rows = conf.sum(axis=1, keepdims=True)
    share = np.divide(conf, rows, out=np.zeros(conf.shape), where=rows > 0)
    image = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, label="share of the true label's examples")
    names = [_name(label) for label in labels]
    ax.set_xticks(range(n), names, rotation=90 if n > 6 else 0)
    ax.set_yticks(range(n), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if title:
        ax.set_title(title)
    if n <= MAX_CELL_NOTES:
        for i in range(n):
            for j in range(n):
                ax.text(
                    j,
                    i,
                    f"{int(conf[i, j]):,}",
                    ha="center",
                    va="center",
                    fontsize=9 if n <= 10 else 6,
                    color="white" if share[i, j] > 0.5 else "black",
                )
    fig.tight_layout()
    data = io.BytesIO()
    fig.savefig(data, format=fmt, dpi=100)
    path = Path(path)
    atomic_write_bytes(path, data.getvalue())
    return path
