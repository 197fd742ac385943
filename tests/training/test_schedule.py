"""schedule.py: the paper's learning rate (equation 3) and the other schedules; the budget
schedule's fitted total, warmup, decay, re-fit and averaged steps."""

from __future__ import annotations

import itertools
import math

import pytest

from aiayn.config import TrainConfig
from aiayn.training.schedule import cosine_lr, inverse_sqrt_lr, learning_rate, noam_lr


def test_noam_peaks_at_warmup_and_matches_equation_3():
    d_model, warmup = 512, 4000
    rates = [noam_lr(s, d_model, warmup) for s in range(1, 20001)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == warmup
    assert rates[warmup - 1] == pytest.approx(d_model**-0.5 * warmup**-0.5)
    assert noam_lr(100, d_model, warmup) == pytest.approx(d_model**-0.5 * 100 * warmup**-1.5)
    assert noam_lr(10000, d_model, warmup, 2.0) == pytest.approx(2 * d_model**-0.5 * 0.01)


def test_other_schedules():
    assert inverse_sqrt_lr(50, 100, 1e-3) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(100, 100, 1e-3) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(400, 100, 1e-3) == pytest.approx(5e-4)
    assert cosine_lr(100, 100, 1100, 1e-3) == pytest.approx(1e-3)
    assert cosine_lr(600, 100, 1100, 1e-3) == pytest.approx(5e-4)
    assert cosine_lr(1100, 100, 1100, 1e-3) == pytest.approx(0.0, abs=1e-12)
    tc = TrainConfig(lr_schedule="constant", lr=3e-4)
    assert learning_rate(7, tc, 512) == 3e-4


def test_fit_total_steps_is_the_step_where_the_budget_runs_out():
    from aiayn.training.schedule import BUDGET_MARGIN, fit_total_steps

    # 100 steps done in 60 s of a 600 s budget at 2 steps/s: 540 s left -> 1080 more steps
    assert fit_total_steps(100, 2.0, 60.0, 600.0, 10**6) == 100 + int(BUDGET_MARGIN * 1080)
    assert fit_total_steps(100, 2.0, 60.0, 600.0, 500) == 500  # max_steps caps it
    assert fit_total_steps(100, 2.0, 700.0, 600.0, 10**6) == 100  # over budget: stop now
    # a 50 s validation every 100 steps, counted one by one: the 513 s planned for (95% of
    # 540 s) hold 526 more steps (263 s) and the validations at 200, ..., 600 (250 s)
    assert round(BUDGET_MARGIN * 540) == 513
    assert fit_total_steps(100, 2.0, 60.0, 600.0, 10**6, valid_every=100, valid_s=50.0) == 626


def test_average_steps_are_evenly_spaced_over_the_last_fifth():
    from aiayn.training.schedule import average_steps

    assert average_steps(200, 5) == [168, 176, 184, 192, 200]
    assert average_steps(1000, 4) == [850, 900, 950, 1000]
    assert average_steps(3, 5) == [1, 2, 3]  # a tiny schedule: one step apart, never below 1
    # fitted at step 190 of 200: the last fifth (from 168) is partly past, so closer together
    assert average_steps(200, 5, after=190) == [192, 194, 196, 198, 200]
    assert average_steps(200, 5, after=150) == [168, 176, 184, 192, 200]
    # warmup-stable-decay falling over the last quarter: the span is a quarter as long, so
    # the first averaged checkpoint sees the rate the full cosine's first one sees
    from aiayn.training.schedule import BudgetPlan, budget_lr

    wsd = average_steps(1000, 5, decay=0.25)
    assert wsd == [960, 970, 980, 990, 1000]
    plan = BudgetPlan(1000, 10, 100)
    first_cosine = budget_lr(average_steps(1000, 5)[0], 1e-3, 100, plan)
    first_wsd = budget_lr(wsd[0], 1e-3, 100, plan, decay=0.25)
    assert first_wsd == pytest.approx(first_cosine) and first_cosine < 0.1e-3


def test_a_refit_moves_an_end_earlier_more_readily_than_later():
    """An end set too late is cut off by max_minutes (no rate at 0, planned checkpoints
    missing); one set too early costs a few steps: 0.5% earlier moves it, later needs 2%."""
    from aiayn.training.schedule import refit_moves

    assert not refit_moves(1000, 1000)
    assert not refit_moves(1000, 996) and refit_moves(1000, 994)  # earlier: over 0.5%
    assert not refit_moves(1000, 1020) and refit_moves(1000, 1021)  # later: over 2%
    assert refit_moves(1000, 980)


def test_budget_rate_warms_up_without_waiting_for_the_fit_and_never_jumps():
    from aiayn.training.schedule import BudgetPlan, budget_lr, fit_warmup_end

    peak, warmup = 1e-3, 1000
    # before the fit: the configured slope
    assert budget_lr(20, peak, warmup, BudgetPlan()) == pytest.approx(2e-5)
    # fitted at step 20 to 300 steps: the warmup ends at 30 (10% of the total), not at 1000
    end = fit_warmup_end(300, warmup)
    assert end == 30
    plan = BudgetPlan(300, 20, end)
    rates = [budget_lr(s, peak, warmup, plan) for s in range(1, 301)]
    assert rates[19] == pytest.approx(2e-5) and rates[29] == pytest.approx(peak)
    assert max(rates) == pytest.approx(peak) and rates[-1] == pytest.approx(0.0, abs=1e-15)
    assert all(b <= a for a, b in itertools.pairwise(rates[29:]))  # decays to the end
    steps_up = [b - a for a, b in itertools.pairwise(rates[:30])]
    assert max(steps_up) <= (peak - 2e-5) / 10 + 1e-12  # the fit does not jump the rate
    # the speed measured over 40 steps of a 100-step run (a slow machine): the rate goes on
    # rising to the peak over a tenth of the 60 steps left, then decays
    assert fit_warmup_end(100, warmup, 40) == 46
    late = BudgetPlan(100, 40, fit_warmup_end(100, warmup, 40))
    rates = [budget_lr(s, peak, warmup, late) for s in range(40, 101)]
    assert rates[0] == pytest.approx(4e-5) and rates[6] == pytest.approx(peak) == max(rates)
    # a plan whose warmup ended before the fit (not made any more): decay from the rate reached
    odd = BudgetPlan(100, 40, 10)
    assert budget_lr(41, peak, warmup, odd) <= budget_lr(40, peak, warmup, odd)
    # a checkpoint from before fit_step/warmup_end were saved: the configured warmup, as then
    assert budget_lr(1000, peak, warmup, BudgetPlan(3000)) == pytest.approx(peak)
    assert budget_lr(2000, peak, warmup, BudgetPlan(3000)) == pytest.approx(peak / 2)


def test_budget_decay_holds_the_peak_then_falls_over_its_share():
    from aiayn.training.schedule import BudgetPlan, budget_lr

    peak, warmup = 1e-3, 1000
    plan = BudgetPlan(300, 20, 30)  # cosine from step 30 to 300: 270 steps
    rates = [budget_lr(s, peak, warmup, plan, decay=0.25) for s in range(1, 301)]
    cosine = [budget_lr(s, peak, warmup, plan) for s in range(1, 301)]
    assert rates[:30] == cosine[:30]  # the warmup is the same
    flat_until = 30 + int(0.75 * 270)  # step 232: the last quarter of the cosine's way falls
    assert all(r == pytest.approx(peak) for r in rates[29:flat_until])
    assert rates[265] == pytest.approx(peak / 2, rel=0.02)  # step 266: half way down
    assert rates[-1] == pytest.approx(0.0, abs=1e-15)
    assert all(b <= a for a, b in itertools.pairwise(rates[29:]))
    assert all(r >= c for r, c in zip(rates, cosine, strict=True))  # never below the cosine
    # re-fitted in the fall (a slower machine: the end moves from 300 to 280), no jump
    moved = BudgetPlan(280, 20, 30, refit_step=260, refit_progress=plan.progress(260, 30))
    before, after = (
        budget_lr(260, peak, warmup, plan, 0.25),
        budget_lr(261, peak, warmup, moved, 0.25),
    )
    assert after <= before and before - after < peak / 20
    assert budget_lr(280, peak, warmup, moved, 0.25) == pytest.approx(0.0, abs=1e-15)


def test_a_refit_moves_the_end_and_the_rate_goes_on_from_where_it_was():
    """Re-fitted at step 150 of 300 (the machine slowed: the end is now 250): the rate at 150
    is kept, the cosine's rest is spread over 150-250, and it reaches 0 at the new end."""
    from aiayn.training.schedule import BudgetPlan, budget_lr

    peak, warmup = 1e-3, 30
    before = BudgetPlan(300, 20, 30)
    at = before.progress(150, 30)
    after = BudgetPlan(250, 20, 30, refit_step=150, refit_progress=at)
    assert budget_lr(150, peak, warmup, after) == pytest.approx(budget_lr(150, peak, warmup,
                                                                          before))  # fmt: skip
    rates = [budget_lr(s, peak, warmup, after) for s in range(150, 251)]
    assert all(b < a for a, b in itertools.pairwise(rates))
    assert abs(rates[1] - rates[0]) < 2 * abs(budget_lr(150, peak, warmup, before)
                                              - budget_lr(149, peak, warmup, before))  # fmt: skip
    assert rates[-1] == pytest.approx(0.0, abs=1e-15)
    assert budget_lr(200, peak, warmup, after) == pytest.approx(
        0.5 * peak * (1 + math.cos(math.pi * (at + (1 - at) * 0.5)))
    )
