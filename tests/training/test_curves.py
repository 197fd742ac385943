"""curves.py: a run's metrics log read (junk and resumed steps) and drawn as training curves,
and `aiayn plot-log`."""

import json
import warnings

import pytest

from aiayn.cli.main import main
from aiayn.errors import AiaynError
from aiayn.training.curves import plot_training_log, read_metrics

PNG = b"\x89PNG\r\n\x1a\n"


def write_log(path, records, junk=False):
    with open(path / "metrics.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        if junk:
            f.write('{"step": 7, "loss": 1.0\n[1, 2]\n')  # a torn last line and a non-record


def panel_titles(fig):
    return [ax.get_title() for ax in fig.axes if ax.get_visible()]


def test_plot_log_tolerates_missing_keys_and_junk(tmp_path):
    write_log(tmp_path, [
        {"step": 10, "loss": 5.0, "ppl": 90.0, "lr": 1e-4, "tokens_per_s": 100},
        {"step": 20, "loss": 4.0, "lr": 2e-4},  # no ppl
        {"step": 20, "valid_loss": 4.5, "valid_ppl": 60.0},
        {"step": 30, "loss": 3.5, "ppl": float("nan")},  # NaN is skipped, not plotted
    ], junk=True)  # fmt: skip
    with (tmp_path / "metrics.jsonl").open("ab") as f:
        f.write(b'{"step": 40, "loss": \xff\xfe 3.0}\n')  # not UTF-8: was a traceback
    records, bad = read_metrics(tmp_path / "metrics.jsonl")
    assert bad == 3 and len(records) == 4
    fig = plot_training_log(tmp_path)
    assert panel_titles(fig) == ["loss", "perplexity", "learning rate"]  # no BLEU logged
    loss_ax = fig.axes[0]
    assert [line.get_label() for line in loss_ax.get_lines()] == ["train (label-smoothed)", "valid"]
    assert list(loss_ax.get_lines()[0].get_xdata()) == [10, 20, 30]


def test_plot_log_with_bleu_and_a_resumed_run(tmp_path):
    write_log(tmp_path, [
        {"step": 100, "loss": 3.0, "ppl": 20.0, "lr": 1e-3},
        {"step": 200, "loss": 2.0, "ppl": 7.0, "lr": 9e-4},
        {"step": 200, "valid_loss": 2.5, "valid_ppl": 12.0, "valid_bleu": 10.0,
         "valid_length_ratio": 0.93, "valid_bp": 0.926},
        {"step": 200, "loss": 2.1, "ppl": 8.0, "lr": 9e-4},  # resumed from step 100: step 200 again
    ])  # fmt: skip
    fig = plot_training_log(tmp_path / "metrics.jsonl")
    assert panel_titles(fig) == ["loss", "perplexity", "learning rate", "BLEU", "length"]
    assert [line.get_label() for line in fig.axes[4].get_lines()] == [
        "hyp / ref length",
        "brevity penalty",
    ]
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [3.0, 2.1]  # the later record wins


def test_plot_log_draws_a_diverged_loss_on_a_log_axis_without_numpy_warnings(tmp_path):
    """A loss spike of 1e308 was matplotlib's overflow RuntimeWarning, the other points a flat
    line; past PLOT_MAX a value is left out as inf is, and a spread loss gets a log axis."""
    write_log(tmp_path, [{"step": i, "loss": v, "lr": 1e-6 * (i + 1)}
                         for i, v in enumerate([5.0, 4.0, 1e308, 3e38, 3.0])])  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot_training_log(tmp_path)
        fig.savefig(tmp_path / "curves.png")
    loss_ax, lr_ax = fig.axes  # no perplexity logged
    assert list(loss_ax.get_lines()[0].get_ydata()) == [5.0, 4.0, 3e38, 3.0]
    assert loss_ax.get_yscale() == "log"
    assert lr_ax.get_yscale() == "linear"  # a warmup's 1,000x rise keeps its straight line
    write_log(tmp_path, [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 3.0}])
    assert plot_training_log(tmp_path).axes[0].get_yscale() == "linear"


def test_plot_log_errors_and_cli(tmp_path, capsys):
    with pytest.raises(AiaynError, match="no metrics log"):
        plot_training_log(tmp_path)
    write_log(tmp_path, [{"step": 1, "tokens_per_s": 5.0}])
    with pytest.raises(AiaynError, match="no loss"):
        plot_training_log(tmp_path)
    write_log(tmp_path, [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}])
    assert main(["plot-log", str(tmp_path)]) == 0
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG)
    assert main(["plot-log", str(tmp_path / "nowhere")]) == 2
    assert "no metrics log" in capsys.readouterr().err
    # an --out whose suffix is no image format was matplotlib's ValueError traceback
    assert main(["plot-log", str(tmp_path), "--out", str(tmp_path / "curves.de")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ".de is not an image format" in err
    assert main(["plot-log", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["plot-log", str(tmp_path), "--out", str(tmp_path / "c.svg")]) == 0
    assert (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")
