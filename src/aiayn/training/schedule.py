"""Learning-rate schedules (§5.3) and the fit of a schedule to a time budget.

    noam_lr          lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)   (equation 3)
    inverse_sqrt_lr  the same shape with a given peak; cosine_lr a warmup then a cosine
    budget_lr        `cosine_budget`: warmup and cosine fitted to the steps a budget reaches

The budget functions are pure: from measured speeds to the step a run ends at, where its
warmup ends and which checkpoints are averaged (aiayn.training.budget applies them to a run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aiayn.config import TrainConfig


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Equation 3: linear warmup for `warmup` steps, then decay with 1/sqrt(step)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt_lr(step: int, warmup: int, peak: float) -> float:
    """fairseq's inverse_sqrt: linear warmup to `peak`, then peak · sqrt(warmup / step)."""
    step = max(step, 1)
    return peak * min(step / max(warmup, 1), math.sqrt(max(warmup, 1) / step))


def cosine_lr(step: int, warmup: int, total: int, peak: float, floor: float = 0.0) -> float:
    """Linear warmup to `peak`, then half a cosine down to `floor` at step `total`."""
    step = max(step, 1)
    if step <= warmup:
        return peak * step / max(warmup, 1)
    progress = min(1.0, (step - warmup) / max(total - warmup, 1))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class BudgetPlan:
    """cosine_budget's fitted schedule (kept in TrainState, so a resume follows it)."""

    total: int = 0  # the step the rate reaches 0 (0 = not fitted yet)
    fit_step: int = 0  # the step it was fitted at
    warmup_end: int = 0  # the fitted warmup's last step (0: from before it was recorded)
    refit_step: int = 0  # the last step the total was re-fitted at (0 = never) ...
    refit_progress: float = 0.0  # ... and the cosine's progress there, kept on re-fitting

    def progress(self, step: int, start: int) -> float:
        """How far along the cosine (0 at `start`, 1 at `total`) step `step` is. From a
        re-fit on, the rest of the way is spread evenly over the steps to the new total, so
        the rate goes on from where it was, never jumping (steps before it are past: the
        plan no longer gives their rates)."""
        if self.refit_step > start and step >= self.refit_step:
            rest = (step - self.refit_step) / max(self.total - self.refit_step, 1)
            return min(1.0, self.refit_progress + (1.0 - self.refit_progress) * rest)
        return min(1.0, max(0.0, (step - start) / max(self.total - start, 1)))


def budget_lr(step: int, peak: float, warmup: int, plan: BudgetPlan, decay: float = 1.0) -> float:
    """cosine_budget's rate: warmup, then half a cosine from `peak` to 0 at `plan.total`;
    with `decay` < 1 the rate stays at the top until the last `decay` of the cosine's way
    (`plan.progress`) and the half cosine fits in that part (warmup-stable-decay).

    Until the total is fitted (total = 0), and up to `fit_step`, the rate warms up linearly
    at the configured slope, peak / warmup. From there it goes on linearly to `peak` at
    `warmup_end` (the fitted warmup, often shorter), then follows the cosine. `fit_warmup_end`
    puts `warmup_end` after `fit_step`; were it not, the cosine would start at once from the
    rate reached: the rate never jumps. `warmup_end = 0` with a total is a checkpoint from
    before it was recorded, whose warmup was the configured one.
    """
    step = max(step, 1)
    if plan.total <= 0 or step <= plan.fit_step:
        return peak * min(1.0, step / max(warmup, 1))
    reached = peak * min(1.0, plan.fit_step / max(warmup, 1))
    warmup_end = plan.warmup_end or warmup
    if step <= warmup_end:
        rise = (step - plan.fit_step) / max(warmup_end - plan.fit_step, 1)
        return reached + (peak - reached) * rise
    top, start = (peak, warmup_end) if warmup_end > plan.fit_step else (reached, plan.fit_step)
    fall = max(0.0, plan.progress(step, start) - (1.0 - decay)) / decay
    return 0.5 * top * (1.0 + math.cos(math.pi * fall))


def cosine_start(plan: BudgetPlan, warmup: int) -> int:
    """The step cosine_budget's cosine starts from (see `budget_lr`)."""
    return max(plan.warmup_end or warmup, plan.fit_step)


def learning_rate(
    step: int, tc: TrainConfig, d_model: int, plan: BudgetPlan | None = None
) -> float:
    """The rate for optimizer step `step` under `tc.lr_schedule`; `plan` is cosine_budget's
    fitted schedule (TrainState's; while its total is 0 the rate is still warming up)."""
    if tc.lr_schedule == "noam":
        return noam_lr(step, d_model, tc.warmup_steps, tc.lr)
    if tc.lr_schedule == "inverse_sqrt":
        return inverse_sqrt_lr(step, tc.warmup_steps, tc.lr)
    if tc.lr_schedule == "cosine":
        return cosine_lr(step, tc.warmup_steps, tc.max_steps, tc.lr, tc.min_lr)
    if tc.lr_schedule == "cosine_budget":
        return budget_lr(step, tc.lr, tc.warmup_steps, plan or BudgetPlan(), tc.budget_decay)
    return tc.lr


# Of the time left when the speed is measured, the share planned for: validations and saves
# that fell outside the measuring window, and a slower machine later on, fit in the rest.
BUDGET_MARGIN = 0.95
FIT_MIN_STEPS = 10  # the shortest measuring window, in steps (re-fits correct its noise)
# The window ends after this share of the budget (or valid_every steps, if that comes first):
# well inside the fitted warmup, so the fit never waits for a warmup the budget cannot afford.
FIT_SHARE = 0.05
WARMUP_SHARE = 0.1  # the fitted warmup is at most this share of the fitted total
# Every this share of the fitted run, the speed since the last re-fit (or the fit) re-fits
# the total (a machine that slows down, other work on it), if it moved by more than a
# tolerance: step times vary by a few percent with the batches' lengths. The tolerance is
# smaller for an earlier end (refit_moves).
REFIT_SHARE = 0.05
REFIT_TOLERANCE = 0.02
REFIT_SHORTEN_TOLERANCE = 0.005
AVERAGE_SPAN = 0.2  # averaged checkpoints are spread over the last 20% of the schedule


def fit_total_steps(
    step: int,
    steps_per_s: float,
    elapsed_s: float,
    budget_s: float,
    max_steps: int,
    valid_every: int = 0,
    valid_s: float = 0.0,
) -> int:
    """The step at which a run going at `steps_per_s` uses up its budget (with a margin).

    Args:
        step: optimizer steps done so far.
        steps_per_s: measured speed of the steps themselves.
        elapsed_s: wall-clock seconds used so far (of every session of the run).
        budget_s: the whole budget (train.max_minutes * 60).
        max_steps: a cap (train.max_steps).
        valid_every, valid_s: a validation every `valid_every` steps costs `valid_s` seconds
            (0: not counted; the margin covers it).
    Returns:
        The last step whose steps and validations from `step` on fit in margin * (budget_s -
        elapsed_s), within [step, max_steps].
    """
    left_s = BUDGET_MARGIN * max(budget_s - elapsed_s, 0.0)
    step_s = 1.0 / max(steps_per_s, 1e-9)

    def cost(total: int) -> float:  # the validations counted one by one: they come in lumps
        n_valid = total // valid_every - step // valid_every if valid_every > 0 else 0
        return (total - step) * step_s + n_valid * valid_s

    spread = step_s + (valid_s / valid_every if valid_every > 0 else 0.0)
    total = min(step + int(left_s / spread), max_steps)
    while total > step and cost(total) > left_s:
        total -= 1
    while total < max_steps and cost(total + 1) <= left_s:
        total += 1
    return max(step, total)


def refit_moves(total_steps: int, refitted: int) -> bool:
    """Whether a re-fit moves the schedule's end from `total_steps` to `refitted`.

    An end later by over REFIT_TOLERANCE, or earlier by over REFIT_SHORTEN_TOLERANCE. The
    rule is lopsided because the two errors cost differently. An end set too early leaves a
    few steps' time unused. An end set too late is cut off by max_minutes before the
    schedule's end: the rate has not reached 0, and the last planned checkpoints are never
    written. Seen on Multi30k, 20 minutes, with the 2% tolerance both ways: the other core
    became busy after the fit, no re-fit moved the end (996) after step 150, and max_minutes
    stopped the run at step 991.
    """
    if refitted > total_steps:
        return refitted - total_steps > REFIT_TOLERANCE * total_steps
    return total_steps - refitted > REFIT_SHORTEN_TOLERANCE * total_steps


def fit_warmup_end(total_steps: int, warmup: int, fit_step: int = 0) -> int:
    """The fitted warmup's last step: the configured warmup, but at most WARMUP_SHARE of
    `total_steps` (a 5-minute budget must not spend itself warming up). If measuring the speed
    took the run past that (a slow machine, a short budget), the rate goes on rising from
    `fit_step` to the peak over WARMUP_SHARE of the steps left."""
    end = min(warmup, int(WARMUP_SHARE * total_steps))
    if end > fit_step:
        return end
    return min(total_steps, fit_step + max(1, int(WARMUP_SHARE * (total_steps - fit_step))))


def average_steps(total_steps: int, n: int, after: int = 0, decay: float = 1.0) -> list[int]:
    """The `n` evenly spaced steps, ending at `total_steps`, whose checkpoints are averaged.

    They span the last AVERAGE_SPAN of the schedule, where the rate is low and the weights
    move little, so their mean is a smoother model (§6.1 averages the last 5 checkpoints).
    With a warmup-stable-decay schedule (`decay` < 1, see `budget_lr`) the span shrinks with
    the fall, to AVERAGE_SPAN * decay: where the rate has come down as far as a full cosine's
    has at its span's start (under 10% of the peak), not where it is still near it. (At 20
    minutes, averaging over the last 20% at decay 0.25, from 90% of the peak, gave a model
    worse than the last checkpoint on two corpora.) All lie after step `after` (where the
    total was fitted: earlier steps are past), closer together when the span would reach back
    before it.
    """
    gap = max(1, int(AVERAGE_SPAN * decay * total_steps) // max(n, 1))
    if total_steps - (n - 1) * gap <= after:
        gap = max(1, (total_steps - after - 1) // max(n - 1, 1))
    return [s for s in (total_steps - i * gap for i in reversed(range(n))) if s > max(after, 0)]
