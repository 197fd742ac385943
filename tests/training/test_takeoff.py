"""takeoff.py: what a budget buys, said once the speed is measured and again at the run's end."""

from __future__ import annotations

import logging

import pytest
from copy_task import tiny

from aiayn.config import ModelConfig
from aiayn.training.loop import train
from aiayn.training.takeoff import (
    MEASURED,
    USABLE_BLEU,
    budget_words,
    end_words,
    minutes_for,
    steps_needed,
)


def _cfg(d_model: int) -> ModelConfig:
    return ModelConfig(vocab_size=100, d_model=d_model, n_heads=4)


def test_the_steps_needed_come_from_the_measured_runs_of_the_nearest_size():
    """d_model 256: every run of 512 steps or more was usable, and 287 steps were not; a size
    without runs is judged by the nearest measured one, and says so."""
    need = steps_needed(_cfg(256))
    runs = [o for o in MEASURED if o.d_model == 256]
    assert need.steps == 512 and need.exact and need.d_model == 256
    assert all(o.usable for o in runs if o.steps >= need.steps)
    assert any(not o.usable and o.steps < need.steps for o in runs)
    small = steps_needed(_cfg(32))
    assert not small.exact and small.d_model == 128
    assert "none of 32 measured" in small.whose(32)
    big = steps_needed(_cfg(1024))
    assert big.d_model == 256 and "a larger model needs at least as many" in big.evidence


def test_a_budget_too_short_for_the_model_says_how_long_to_give():
    """The case that asked for it: 20 minutes at 0.23 steps/s, ~290 steps of a d_model 256
    model, which translated only from ~512 steps on."""
    short, words = budget_words(_cfg(256), 290, 0.23, 20)
    assert short and words.startswith("BUDGET TOO SHORT: at 0.23 steps/s, 20 minutes give ~290")
    want = minutes_for(512, 290 / 20)
    assert f"Give at least {want} minutes" in words and 512 * 20 / 290 < want <= 40
    enough, words = budget_words(_cfg(256), 920, 0.77, 20)
    assert not enough and "enough for models of this size" in words


def test_the_end_says_whether_the_model_translates_and_what_to_give_next():
    usable, words = end_words(_cfg(256), 524, 40.0, 22.2)
    assert usable and "validation BLEU 22.2" in words
    usable, words = end_words(_cfg(256), 287, 20.0, 1.2)
    assert not usable and f"below the {USABLE_BLEU:g}" in words
    assert f"give at least {minutes_for(512, 287 / 20)} minutes" in words
    # past the measured take-off and still not translating: twice the steps
    usable, words = end_words(_cfg(256), 600, 20.0, 3.0)
    assert not usable and f"give at least {minutes_for(1200, 30)} minutes" in words
    assert end_words(_cfg(256), 50, 1.0, None)[0]  # nothing to judge by: no advice


def test_a_budget_run_warns_as_soon_as_its_speed_is_measured_and_again_at_its_end(
    corpus, tok, tmp_path, caplog
):
    """A 3-second budget of the tiny copy model gives a few dozen steps, far below the
    measured take-off: the warning comes with the fitted plan, long before the end, and the
    end says what the validation BLEU reached and what to give next."""
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 1e-3, "train.warmup_steps": 5,
            "train.max_minutes": 0.05, "train.max_steps": 10**6, "train.valid_every": 10,
            "train.bleu_samples": 8}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="aiayn"):
        result = train(tiny(corpus, tmp_path / "run", **over), tokenizer=tok, progress=False)
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    fitted = next(i for i, (_, m) in enumerate(messages) if "the schedule ends at step" in m)
    level, warning = messages[fitted + 1]
    assert level == logging.WARNING and warning.startswith("BUDGET TOO SHORT: at ")
    assert "nearest measured size (d_model 128; none of 32 measured)" in warning
    level, end = next((lv, m) for lv, m in messages if "validation BLEU" in m)
    assert f"in {result.step:,} steps" in end and result.step < 675
    if "below the" in end:
        assert level == logging.WARNING and "Next time give at least" in end
    else:
        assert level == logging.INFO and "its outputs read as translations" in end


@pytest.mark.parametrize("d_model", [64, 128, 256, 512])
def test_every_size_gets_a_figure(d_model):
    assert steps_needed(_cfg(d_model)).steps > 0
