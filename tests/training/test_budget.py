"""budget.py: cosine_budget runs fitted to max_steps or to max_minutes, re-fitted when they
slow down, and a short fitted run's training curve (log_interval)."""

from __future__ import annotations

import json
import logging

import pytest
from copy_task import assert_mean_of_checkpoints, tiny

from aiayn.store.checkpoints import list_checkpoints
from aiayn.store.model_dir import load_model_dir
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.loop import train
from aiayn.training.run import LOG_POINTS, log_interval
from aiayn.training.schedule import BudgetPlan, learning_rate


def test_budget_schedule_reaches_zero_at_the_total_and_survives_a_resume(corpus, tok, tmp_path):
    """Without a time budget the total is max_steps, fixed once: a resume with a larger
    max_steps keeps it, ends there at a rate of ~0 and averages the planned checkpoints."""
    out = tmp_path / "run"
    over = {
        "train.lr_schedule": "cosine_budget",
        "train.lr": 1e-3,
        "train.warmup_steps": 10,
        "train.average_last": 3,
        "train.valid_every": 1000,
        "train.save_every": 20,
    }
    first = train(tiny(corpus, out, **over, **{"train.max_steps": 60, "train.max_epochs": 1}),
                  tokenizer=tok, progress=False)  # fmt: skip
    assert first.stopped == "max_epochs" and first.step < 48  # before the averaging span
    saved = json.loads((list_checkpoints(out)[-1] / "train_state.json").read_text())
    assert saved["total_steps"] == 60 and saved["fit_step"] == 0 and saved["warmup_end"] == 6
    assert not (out / "averaged").exists()  # logged: stopped before the schedule's end
    second = train(tiny(corpus, out, **over, **{"train.max_steps": 500}), progress=False)
    assert second.stopped == "total_steps" and second.step == 60
    steps = [int(c.name[5:]) for c in list_checkpoints(out)]
    assert steps[-3:] == [52, 56, 60]  # average_steps(60, 3): the last 20% of the schedule
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if "lr" in r][-1]["lr"] == pytest.approx(0.0, abs=1e-12)
    tc = tiny(corpus, out, **over).train
    plan = BudgetPlan(total=60, fit_step=0, warmup_end=6)  # warmup: 10% of the total
    assert learning_rate(6, tc, 32, plan) == pytest.approx(1e-3)
    assert learning_rate(33, tc, 32, plan) == pytest.approx(5e-4)
    assert learning_rate(60, tc, 32, plan) == pytest.approx(0.0, abs=1e-12)
    averaged = load_model_dir(out / "averaged")  # a model directory, with its tokenizer
    assert Tokenizer.load(out / "averaged").vocab_size == averaged.cfg.vocab_size
    assert_mean_of_checkpoints(out, (52, 56, 60))


def test_budget_schedule_is_fitted_to_max_minutes(corpus, tok, tmp_path):
    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 1e-3, "train.warmup_steps": 5,
            "train.max_minutes": 0.05, "train.max_steps": 10**6, "train.valid_every": 10,
            "train.average_last": 2}  # fmt: skip
    result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    state = json.loads((list_checkpoints(out)[-1] / "train_state.json").read_text())
    total = state["total_steps"]
    # measured from step 1 over 10 steps (or 0.3 s on a slow machine), then fitted to 3 s
    assert 1 <= state["fit_step"] <= 11 and state["fit_step"] < total < 10**6
    assert result.stopped in ("total_steps", "max_minutes")  # a busy machine may overrun
    if result.stopped == "total_steps":
        assert result.step == total and (out / "averaged" / "model.safetensors").is_file()


def test_a_budget_shorter_than_the_warmup_still_decays_to_its_end_and_averages(
    corpus, tok, tmp_path
):
    """6 seconds with warmup_steps = 1000, far more steps than the budget holds: the speed is
    measured from the first steps, the warmup shrinks to 10% of the fitted total, and the run
    decays to 0 at its end and writes averaged/ from checkpoints planned after the fit. Its
    training curve has ~LOG_POINTS records up to its last step, though log_every is 1000."""
    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 1e-3, "train.warmup_steps": 1000,
            "train.max_minutes": 0.1, "train.max_steps": 10**6, "train.valid_every": 1000,
            "train.save_every": 1000, "train.average_last": 3, "train.log_every": 1000}  # fmt: skip
    result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    state = json.loads((list_checkpoints(out)[-1] / "train_state.json").read_text())
    total, fit_step, warmup_end = state["total_steps"], state["fit_step"], state["warmup_end"]
    # A busy machine may overrun the 5% margin by a few steps; the averaging still happens.
    assert result.stopped in ("total_steps", "max_minutes") and result.step > 0.8 * total
    # warmup: a tenth of the fitted total (or, if measuring outlasted that, a tenth of the
    # rest after the fit); a re-fit may have moved the total a little since
    assert fit_step < warmup_end <= 0.25 * total and warmup_end < 1000
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["lr"] for r in records if "lr" in r]
    assert max(rates) == pytest.approx(1e-3, rel=0.2)  # the peak is reached ...
    assert rates[-1] < 0.1 * max(rates)  # ... and the rate decays to ~0 at the end
    logged = [r["step"] for r in records if "loss" in r]
    assert len(logged) >= LOG_POINTS // 2 and logged[-1] == result.step, logged
    planned = [int(c.name[5:]) for c in list_checkpoints(out)]
    assert len(planned) >= 2 and planned[0] > fit_step
    if result.stopped == "total_steps":
        assert len(planned) == 3 and planned[-1] == total
    load_model_dir(out / "averaged")


def test_log_interval_gives_a_short_fitted_run_a_curve():
    assert log_interval(50, 0) == 50  # no fitted schedule: log_every as set
    assert log_interval(50, 100_000) == 50  # a long run: log_every as set
    assert log_interval(50, 540) == 540 // LOG_POINTS  # a 20-minute CPU budget: ~40 records
    assert log_interval(50, 26) == 1  # a few dozen steps: every step
    assert log_interval(0, 540) == 0  # no training records asked for: none


def test_a_run_slower_than_its_measured_speed_refits_its_end_and_still_averages(
    corpus, tok, tmp_path, caplog
):
    """The speed is measured over the first 20 steps, before any validation; then a costly
    validation (BLEU over 40 greedy translations) every 25 steps slows the run down. The total
    is re-fitted (the log says so, the plan in train_state.json records it) and the run still
    ends on its schedule, with averaged/."""

    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 1e-3, "train.warmup_steps": 1000,
            "train.max_minutes": 0.1, "train.max_steps": 10**6, "train.valid_every": 25,
            "train.bleu_samples": 40, "train.save_every": 1000,
            "train.average_last": 3}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="aiayn.training.budget"):
        result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    refits = [r.getMessage() for r in caplog.records if "now ends at step" in r.getMessage()]
    state = json.loads((list_checkpoints(out)[-1] / "train_state.json").read_text())
    assert refits and state["refit_step"] > state["fit_step"] and 0 < state["refit_progress"] < 1
    # On schedule; a machine slowed further after the last re-fit (another job on the other
    # core) may stop it at max_minutes a few steps short, still with averaged/ written.
    if result.stopped == "max_minutes":
        assert result.step >= 0.9 * state["total_steps"]
    else:
        assert result.stopped == "total_steps" and result.step == state["total_steps"]
    load_model_dir(out / "averaged")
