"""Training curves: a run's metrics.jsonl read back (`read_metrics`) and drawn against the
training step (`plot_training_log`: loss, perplexity, learning rate, and BLEU and the length
ratio when validation logged them). `aiayn plot-log` writes the figure (glassbox.viz's
`write_figure`).

Figures use matplotlib's object API on the Agg canvas (no pyplot, no global backend switch), so
they work headless and never touch a caller's own matplotlib state.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from matplotlib.figure import Figure

from aiayn.errors import AiaynError

log = logging.getLogger(__name__)


def read_metrics(path: str | Path) -> tuple[list[dict], int]:
    """Records of a metrics.jsonl, and how many lines were not JSON objects (skipped).

    A resumed run may log a step twice: the later record wins.
    """
    records: dict[tuple[bool, float], dict] = {}
    bad = 0
    with open(path, "rb") as f:  # a line that is not UTF-8 (a torn write) is one bad line
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:  # not JSON, or not UTF-8 (UnicodeDecodeError)
                bad += 1
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int | float):
                bad += 1
                continue
            is_valid = any(k.startswith("valid_") for k in rec)
            records[(is_valid, rec["step"])] = rec
    return sorted(records.values(), key=lambda r: r["step"]), bad


# panel title, [(key, label)], y axis: "log", "linear", or "auto" (log when the values span
# more than SPREAD_FOR_LOG: a diverged run's loss spike flattens a linear panel)
SPREAD_FOR_LOG = 1e3
CURVES = [
    ("loss", [("loss", "train (label-smoothed)"), ("valid_loss", "valid")], "auto"),
    ("perplexity", [("ppl", "train"), ("valid_ppl", "valid")], "log"),
    ("learning rate", [("lr", "lr")], "linear"),
    ("BLEU", [("valid_bleu", "valid BLEU")], "linear"),
    # hypothesis / reference length and BLEU's brevity penalty: below 1 = translations too short
    (
        "length",
        [("valid_length_ratio", "hyp / ref length"), ("valid_bp", "brevity penalty")],
        "linear",
    ),
]


def plot_training_log(run_dir: str | Path) -> Figure:
    """Loss, perplexity, learning rate and (when logged) BLEU and the length ratio against the
    training step."""
    path = Path(run_dir)
    path = path / "metrics.jsonl" if path.is_dir() else path
    if not path.exists():
        raise AiaynError(f"no metrics log at {path} (aiayn train writes RUN_DIR/metrics.jsonl)")
    records, bad = read_metrics(path)
    if bad:
        log.warning("%s: skipped %d lines that are not metric records", path, bad)
    panels = []
    for title, keys, y_axis in CURVES:
        series = []
        for key, label in keys:
            pts = [(r["step"], r[key]) for r in records if _finite(r.get(key))]
            if pts:
                series.append((label, pts))
        if series:
            panels.append((title, series, y_axis))
    if not panels:
        raise AiaynError(f"{path}: no loss, perplexity, learning rate or BLEU records to plot")
    n_cols = 2 if len(panels) > 2 else len(panels)
    n_rows = math.ceil(len(panels) / n_cols)
    fig = Figure(figsize=(6 * n_cols, 3.8 * n_rows), layout="constrained")
    fig.suptitle(f"training curves: {path.parent.name or path}")
    axes = fig.subplots(n_rows, n_cols, squeeze=False).flatten()
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, series, y_axis) in zip(axes, panels, strict=False):
        for label, pts in series:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        low, high = min(y for _, p in series for _, y in p), max(y for _, p in series for _, y in p)
        spread = low > 0 and high / low > SPREAD_FOR_LOG
        if low > 0 and (y_axis == "log" or (y_axis == "auto" and spread)):
            ax.set_yscale("log")
        if title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


# Past this a value is left out as inf and nan are: matplotlib's axis margins overflow float64
# (no training run logs it: an fp32 loss ends at 3.4e38)
PLOT_MAX = 1e300


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < PLOT_MAX
