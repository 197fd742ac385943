"""A `cosine_budget` run's schedule, fitted to its time budget while it runs: the speed is
measured over the first steps, the end and the warmup are fitted, and the end is re-fitted
when the machine's speed changes (the pure rules are in aiayn.training.schedule).
"""

from __future__ import annotations

import logging

from aiayn.runtime.distributed import all_sum
from aiayn.training.run import Run
from aiayn.training.schedule import (
    FIT_MIN_STEPS,
    FIT_SHARE,
    REFIT_SHARE,
    cosine_start,
    fit_total_steps,
    fit_warmup_end,
    refit_moves,
)
from aiayn.training.takeoff import budget_words

log = logging.getLogger(__name__)


def fit_budget(run: Run) -> bool:
    """Fix cosine_budget's plan once (True when it was fixed now): the total, max_steps
    without a time budget, else the step where the measured speed uses up max_minutes; and
    the warmup, at most WARMUP_SHARE of that total.

    The speed is measured from the session's second step (the first pays one-off costs) while
    the rate warms up, over valid_every steps, or over FIT_SHARE of the budget if that comes
    first (at least FIT_MIN_STEPS steps, unless twice that share has passed). Validating and
    saving are taken out of the steps' speed; the validations still due are planned for at
    their measured cost (`_speed`). Rank 0's figures decide for every rank.
    """
    tc, st, d = run.tc, run.state, run.d
    if tc.max_minutes <= 0:
        _fix_plan(run, tc.max_steps)
        return True
    if st.step <= run.first_step:
        return False
    if run.fit_mark is None:
        run.fit_mark = _mark(run)
        return False
    steps, seconds = st.step - run.fit_mark[0], run.elapsed() - run.fit_mark[1]
    budget_s = 60 * tc.max_minutes
    due = (
        steps >= FIT_MIN_STEPS and (steps >= tc.valid_every or seconds >= FIT_SHARE * budget_s)
    ) or (steps >= 1 and seconds >= 2 * FIT_SHARE * budget_s)
    mine = [float(due), *_speed(run, run.fit_mark)] if d.main else [0.0] * 4
    any_due, rate, valid_s, elapsed = all_sum(mine, d)
    if not any_due:
        return False
    _fix_plan(
        run,
        fit_total_steps(st.step, rate, elapsed, budget_s, tc.max_steps, tc.valid_every, valid_s),
    )
    if d.main:
        log.info(
            "%.3g steps/s over steps %d-%d (%.1f s per validation): warmup to step %d, the "
            "schedule ends at step %d (%.1f of %.1f minutes used); averaging the checkpoints "
            "of steps %s",
            rate,
            run.fit_mark[0],
            st.step,
            valid_s,
            st.warmup_end,
            st.total_steps,
            elapsed / 60,
            tc.max_minutes,
            run.planned_averages() or "none",
        )
        # What the budget buys, said as soon as it is known (a short budget still runs: a
        # quick look is a fair wish, but it must not be a surprise at the end).
        _advise(run, st.total_steps, rate, always=True)
    return True


def _advise(run: Run, total: int, rate: float, *, always: bool = False) -> None:
    """Say what `total` steps buy (aiayn.training.takeoff), at the fit (`always`) or when a
    re-fit crosses what the model needs. Translators only: the steps a model needs were
    measured in BLEU, and no such evidence exists for a language model."""
    if run.tc.task != "translate":
        return
    short, words = budget_words(run.cfg.model, total, rate, run.tc.max_minutes)
    if always or short != run.budget_short:
        (log.warning if short else log.info)("%s", words)
    run.budget_short = short


def _mark(run: Run) -> tuple[int, float, float]:
    return run.state.step, run.elapsed(), run.aside_s


def _speed(run: Run, mark: tuple[int, float, float]) -> list[float]:
    """Steps per second since `mark`, validating and saving taken out; seconds per
    validation so far in this session (0 before the first); elapsed seconds."""
    steps = run.state.step - mark[0]
    seconds = run.elapsed() - mark[1] - (run.aside_s - mark[2])
    n, valid_total = run.valid_cost
    return [steps / max(seconds, 1e-9), valid_total / max(n, 1), run.elapsed()]


def _fix_plan(run: Run, total: int) -> None:
    """Record the fitted schedule in the state (it is saved with every checkpoint)."""
    st = run.state
    st.total_steps, st.fit_step = total, st.step
    st.warmup_end = fit_warmup_end(total, run.tc.warmup_steps, st.step)
    run.refit_mark = _mark(run)


def refit_budget(run: Run) -> bool:
    """Move cosine_budget's end when the machine turns out slower or faster than measured
    (True when it moved). Every REFIT_SHARE of the fitted run, in the cosine and before the
    averaged checkpoints' span, the speed since the last move (or the fit) re-fits the total;
    a change `refit_moves` accepts is applied, the cosine going on from its current rate
    (`BudgetPlan.progress`), so nothing jumps. Measuring since the last move, not over the
    last window only, averages out the step-to-step noise (batches of other lengths) and
    still catches a lasting slowdown.

    The checks fall on the same steps on every rank; rank 0's figures decide.
    """
    tc, st, d = run.tc, run.state, run.d
    if tc.max_minutes <= 0:
        return False
    if run.refit_mark is None:  # a resumed session: measure from its second step
        if st.step > run.first_step:
            run.refit_mark = _mark(run)
        return False
    every = max(FIT_MIN_STEPS, int(REFIT_SHARE * (st.total_steps - st.fit_step)))
    planned = run.planned_averages()
    start = cosine_start(run.plan(), tc.warmup_steps)
    mark_step = run.refit_mark[0]
    if (
        st.step - mark_step < every
        or (st.step - st.fit_step) % every
        or st.step <= start
        or (planned and st.step >= planned[0])
    ):
        return False
    rate, valid_s, elapsed = all_sum(_speed(run, run.refit_mark) if d.main else [0.0] * 3, d)
    total = fit_total_steps(
        st.step, rate, elapsed, 60 * tc.max_minutes, tc.max_steps, tc.valid_every, valid_s
    )
    if not refit_moves(st.total_steps, total):
        return False
    progress = run.plan().progress(st.step, start)
    old = st.total_steps
    st.total_steps, st.refit_step, st.refit_progress = total, st.step, progress
    run.refit_mark = _mark(run)
    if d.main:
        log.info(
            "%.3g steps/s over steps %d-%d (%.1f s per validation): the schedule now ends at "
            "step %d, not %d; averaging the checkpoints of steps %s",
            rate,
            mark_step,
            st.step,
            valid_s,
            total,
            old,
            run.planned_averages() or "none",
        )
        _advise(run, total, rate)  # the move may cross what the model needs: say so again
    return True
