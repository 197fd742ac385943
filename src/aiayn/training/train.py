"""Training (§5): label-smoothed cross-entropy, Adam with the warmup schedule, the loop.

    loss      label_smoothed_loss: (1 - ε) NLL + ε · mean over V of -log p   (ε = 0.1, §5.4)
    optimiser Adam(β1 = 0.9, β2 = 0.98, ε = 1e-9) (§5.3)
    schedule  lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)   (equation 3)

`train(cfg)` runs a whole resumable run into `cfg.train.out_dir` (see docs/training.md):
a model directory (config.json, model.safetensors = the best weights, tokenizer.model,
run_config.json, metrics.jsonl) plus `checkpoints/step_*/` with the full training state.
Launched by `torchrun`, it trains with DistributedDataParallel; rank 0 writes every file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from aiayn.atomic import atomic_write_json, atomic_write_text
from aiayn.config import RUN_CONFIG_FILE, Config, TrainConfig, to_dict
from aiayn.errors import ConfigError
from aiayn.nn.model import Transformer
from aiayn.runtime.device import Precision, choose_precision
from aiayn.runtime.distributed import Dist, all_sum, init_distributed, stop_on_signals
from aiayn.store import checkpoint as ckpt_io
from aiayn.store.checkpoint import (
    AVERAGED_DIR,
    METRICS_FILE,
    TrainState,
    check_resumable,
    data_fingerprint,
    find_resume,
    restore_checkpoint,
    rng_tensors,
)
from aiayn.text.data import (
    HELDOUT_FILES,
    Batch,
    Example,
    Heldout,
    RunData,
    StepLoader,
    batch_plan,
    collate,
    hold_out,
    load_data,
    read_parallel,
)
from aiayn.text.tokenizer import Tokenizer
from aiayn.translate import metrics
from aiayn.translate.metrics import Score

log = logging.getLogger(__name__)

# --- the loss (§5.4) ---------------------------------------------------------------------------


def label_smoothed_loss(
    logits_PV: Tensor, target_P: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-PAD targets.

    Shapes: P target positions (a batch's B x T flattened), V vocabulary.

    The smoothed target puts 1 - ε on the true class and spreads ε uniformly over all V
    classes (PyTorch's definition; the Annotated Transformer spreads it over V - 2), so
    `loss_sum == F.cross_entropy(logits, target, label_smoothing=ε, ignore_index=pad,
    reduction="sum")`. The NLL (no smoothing) gives perplexity.
    """
    logp_PV = F.log_softmax(logits_PV.float(), dim=-1)
    # A 0/1 weight rather than boolean indexing: indexing must learn how many rows survive,
    # which stops the host until a GPU has caught up.
    keep_P = (target_P != pad_id).to(logp_PV.dtype)
    nll_P = -logp_PV.gather(-1, target_P.clamp(min=0)[:, None]).squeeze(-1)
    uniform_P = -logp_PV.mean(dim=-1)
    loss_P = (1.0 - epsilon) * nll_P + epsilon * uniform_P
    return (loss_P * keep_P).sum(), (nll_P * keep_P).sum()


# --- learning-rate schedules: pure functions of the step (1-based) ----------------------------


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


def budget_lr(step: int, peak: float, warmup: int, plan: BudgetPlan) -> float:
    """cosine_budget's rate: warmup, then half a cosine from `peak` to 0 at `plan.total`.

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
    return 0.5 * top * (1.0 + math.cos(math.pi * plan.progress(step, start)))


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
        return cosine_lr(step, tc.warmup_steps, tc.max_steps, tc.lr)
    if tc.lr_schedule == "cosine_budget":
        return budget_lr(step, tc.lr, tc.warmup_steps, plan or BudgetPlan())
    return tc.lr


# --- fitting the schedule to a budget (lr_schedule = "cosine_budget") -------------------------

# Of the time left when the speed is measured, the share planned for: validations and saves
# that fell outside the measuring window, and a slower machine later on, fit in the rest.
BUDGET_MARGIN = 0.95
FIT_MIN_STEPS = 10  # the shortest measuring window, in steps (re-fits correct its noise)
# The window ends after this share of the budget (or valid_every steps, if that comes first):
# well inside the fitted warmup, so the fit never waits for a warmup the budget cannot afford.
FIT_SHARE = 0.05
WARMUP_SHARE = 0.1  # the fitted warmup is at most this share of the fitted total
# Every this share of the fitted run, the speed since the last re-fit (or the fit) re-fits
# the total (a machine that slows down, other work on it), if it moved by more than
# REFIT_TOLERANCE: step times vary by a few percent with the batches' lengths.
REFIT_SHARE = 0.05
REFIT_TOLERANCE = 0.02
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


def fit_warmup_end(total_steps: int, warmup: int, fit_step: int = 0) -> int:
    """The fitted warmup's last step: the configured warmup, but at most WARMUP_SHARE of
    `total_steps` (a 5-minute budget must not spend itself warming up). If measuring the speed
    took the run past that (a slow machine, a short budget), the rate goes on rising from
    `fit_step` to the peak over WARMUP_SHARE of the steps left."""
    end = min(warmup, int(WARMUP_SHARE * total_steps))
    if end > fit_step:
        return end
    return min(total_steps, fit_step + max(1, int(WARMUP_SHARE * (total_steps - fit_step))))


def average_steps(total_steps: int, n: int, after: int = 0) -> list[int]:
    """The `n` evenly spaced steps, ending at `total_steps`, whose checkpoints are averaged.

    They span the last AVERAGE_SPAN of the schedule, where the rate is low and the weights
    move little, so their mean is a smoother model (§6.1 averages the last 5 checkpoints).
    All lie after step `after` (where the total was fitted: earlier steps are past), closer
    together when the span would reach back before it.
    """
    gap = max(1, int(AVERAGE_SPAN * total_steps) // max(n, 1))
    if total_steps - (n - 1) * gap <= after:
        gap = max(1, (total_steps - after - 1) // max(n - 1, 1))
    return [s for s in (total_steps - i * gap for i in reversed(range(n))) if s > max(after, 0)]


# --- validation -----------------------------------------------------------------------------------


@torch.no_grad()
def validate(
    model: Transformer, data: list[Example], tc: TrainConfig, d: Dist, precision: Precision
) -> dict[str, float]:
    """Mean label-smoothed loss and perplexity (exp of mean NLL) over the validation set."""
    was_training = model.training
    model.eval()
    plan = batch_plan(data, tc.max_tokens, shuffle=False)
    totals = torch.zeros(3, dtype=torch.float64, device=d.device)  # loss, NLL, tokens
    for idx in plan[d.rank :: d.world]:
        b = collate(data, idx, model.cfg.pad_id).to(d.device)
        with precision.autocast():
            logits_BTV = model(b.src_BS, b.tgt_in_BT)
        loss, nll = label_smoothed_loss(
            logits_BTV.flatten(0, 1), b.tgt_out_BT.flatten(), tc.label_smoothing, model.cfg.pad_id
        )
        totals[:2] += torch.stack([loss.double(), nll.double()])
        totals[2] += b.n_tgt_tokens  # counted on the host by collate
    loss_sum, nll_sum, n = all_sum(totals, d)
    model.train(was_training)
    return {"valid_loss": loss_sum / n, "valid_ppl": math.exp(min(nll_sum / n, 50.0))}


def validation_bleu(
    model: Transformer,
    tok: Tokenizer,
    data: list[Example],
    refs: list[str],
    n: int,
    precision: Precision,
) -> Score:
    """Corpus BLEU (sacreBLEU, detokenized) of greedy translations of the first `n` pairs."""
    from aiayn.search.decode import greedy_decode

    hyps: list[str] = []
    for start in range(0, min(n, len(data)), 32):
        idx = list(range(start, min(start + 32, n, len(data))))
        with precision.autocast():
            src_BS = collate(data, idx, model.cfg.pad_id).src_BS
            ids = greedy_decode(model, src_BS.to(precision.device))
        hyps.extend(tok.decode(x) for x in ids)
    return metrics.bleu(hyps, refs[: len(hyps)])


# --- one optimizer step --------------------------------------------------------------------------


def train_step(
    net: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: list[Batch],
    *,
    tokens: int,
    lr: float,
    pad_id: int,
    tc: TrainConfig,
    d: Dist,
    precision: Precision,
) -> Tensor:
    """Forward/backward over this rank's micro-batches (already on the device), then one Adam
    step.

    Each micro-batch's summed loss is divided by the step's *global* target-token count
    (times world, because DDP averages gradients over ranks), so the gradient is the mean
    over every target token of the step, however it is split over ranks and micro-batches.
    Returns this rank's summed (smoothed loss, NLL) as a tensor on the device: nothing here
    waits for the GPU, the log reads the totals every `log_every` steps.
    """
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    totals = torch.zeros(2, device=d.device)
    for a, b in enumerate(batches):
        last = a == len(batches) - 1
        with nullcontext() if d.world == 1 or last else net.no_sync():  # type: ignore[operator]
            with precision.autocast():
                logits_BTV = net(b.src_BS, b.tgt_in_BT)
            loss, nll = label_smoothed_loss(
                logits_BTV.flatten(0, 1), b.tgt_out_BT.flatten(), tc.label_smoothing, pad_id
            )
            (loss * (d.world / tokens)).backward()
        totals += torch.stack([loss.detach(), nll.detach()])
    if tc.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(net.parameters(), tc.clip_norm)
    opt.step()
    return totals


# --- the tokenizer of a run -------------------------------------------------------------------


def prepare_tokenizer(
    cfg: Config,
    out: Path,
    resume: Path | None,
    given: Tokenizer | None,
    d: Dist,
    heldout: Heldout | None = None,
) -> Tokenizer:
    """The run's tokenizer: reloaded on resume, else given or trained on the training text
    (without the pairs `heldout` leaves out of training)."""
    if resume is not None:
        return Tokenizer.load(out)
    if d.main:
        tok = given
        if tok is None:
            tc = cfg.train
            if not tc.src:
                raise ConfigError("train.src is empty: give a training corpus (two files or a TSV)")
            pairs = read_parallel(tc.src, tc.tgt or None, heldout=heldout)
            texts = (side for pair in pairs for side in pair)
            log.info(
                "training a %d-piece %s tokenizer on %s", tc.vocab_size, tc.spm_model_type, tc.src
            )
            tok = Tokenizer.train(texts, tc.vocab_size, tc.spm_model_type)
        out.mkdir(parents=True, exist_ok=True)
        tok.save(out)
    if d.world > 1:
        dist.barrier()
    return tok if d.main else Tokenizer.load(out)  # type: ignore[return-value]


# --- the loop ------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    stopped: str  # max_steps | max_epochs | max_minutes | total_steps | early_stopping | signal
    train_loss: float  # mean smoothed loss per target token over the last log window
    best: float | None


class _Run:
    """The mutable parts of one training run, so the loop reads top to bottom."""

    def __init__(
        self,
        cfg: Config,
        tok: Tokenizer,
        data: RunData,
        model: Transformer,
        opt: torch.optim.Optimizer,
        state: TrainState,
        d: Dist,
        out: Path,
        precision: Precision,
    ) -> None:
        self.cfg, self.tc, self.tok, self.data = cfg, cfg.train, tok, data
        self.model, self.opt, self.state, self.d, self.out = model, opt, state, d, out
        self.precision = precision
        self.t_start, self.elapsed0 = time.monotonic(), state.elapsed_s
        self.window = self._zeros()  # loss sum, nll sum, tokens since the last log (on device)
        self.window_t = time.monotonic()
        self.last_loss = float("nan")
        self.last_saved = state.step
        self.last_validated = state.step
        self.first_step = state.step  # where this session started (a resume, or 0)
        # Where the speed is measured from, for the fit and then for re-fits: (step, elapsed,
        # aside_s); validations and saves (aside_s, this session's seconds) are taken out of
        # the steps' speed and counted on their own (valid_cost: in-loop validations, seconds)
        self.fit_mark: tuple[int, float, float] | None = None
        self.refit_mark: tuple[int, float, float] | None = None
        self.aside_s = 0.0
        self.valid_cost = (0, 0.0)

    def elapsed(self) -> float:
        return self.elapsed0 + time.monotonic() - self.t_start

    def metric(self, record: dict[str, Any]) -> None:
        if self.d.main:
            record = {
                "step": self.state.step,
                "epoch": self.state.epoch,
                "tokens": self.state.tokens,
                **record,
                "elapsed_s": round(self.elapsed(), 3),
            }
            with (self.out / METRICS_FILE).open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def log_train(self, lr: float) -> dict[str, float]:
        loss_sum, nll_sum, n = all_sum(self.window, self.d)
        now = time.monotonic()
        rec = {
            "loss": loss_sum / n,
            "ppl": math.exp(min(nll_sum / n, 50.0)),
            "lr": lr,
            "tokens_per_s": n / max(now - self.window_t, 1e-9),
        }
        self.last_loss = rec["loss"]
        self.metric(rec)
        self.window, self.window_t = self._zeros(), now
        return rec

    def add_step(self, totals: Tensor, tokens: int) -> None:
        """Add one step's (loss, NLL) device totals and its tokens to the log window.

        Each rank adds tokens / world, so the sum over ranks is the step's total."""
        self.window[:2] += totals
        self.window[2] += tokens / self.d.world

    def _zeros(self) -> Tensor:
        return torch.zeros(3, dtype=torch.float64, device=self.d.device)

    def validate(self) -> bool:
        """Validation metrics, the best checkpoint and early stopping; True = stop now."""
        tc, st = self.tc, self.state
        rec = validate(self.model, self.data.valid, tc, self.d, self.precision)
        if tc.bleu_samples > 0:  # rank 0 decodes; the sum hands its figures to every rank
            bleu = (
                validation_bleu(
                    self.model,
                    self.tok,
                    self.data.valid,
                    self.data.valid_refs,
                    tc.bleu_samples,
                    self.precision,
                )
                if self.d.main
                else None
            )
            got = [bleu.score, bleu.length_ratio or 0.0, bleu.brevity_penalty or 0.0] if bleu \
                else [0.0, 0.0, 0.0]  # fmt: skip
            rec["valid_bleu"], rec["valid_length_ratio"], rec["valid_bp"] = all_sum(got, self.d)
        value = rec["valid_bleu"] if tc.best_metric == "bleu" else rec["valid_loss"]
        higher_is_better = tc.best_metric == "bleu"
        better = st.best is None or (value > st.best if higher_is_better else value < st.best)
        if better:
            st.best, st.best_step, st.bad_validations = value, st.step, 0
            if self.d.main:
                # the run directory's model = the best so far
                ckpt_io.save_model_dir(self.model, self.out)
        else:
            st.bad_validations += 1
        self.last_validated = st.step
        self.metric({**rec, "best": st.best, "best_step": st.best_step})
        log.info("step %d: %s", st.step, " ".join(f"{k}={v:.4g}" for k, v in rec.items()))
        return tc.patience > 0 and st.bad_validations >= tc.patience

    def save(self) -> None:
        self.state.elapsed_s = self.elapsed()
        if self.d.main:
            ckpt_io.save_checkpoint(
                self.out, self.model, self.opt, self.state.to_json(), rng_tensors(self.d.device)
            )
            ckpt_io.prune_checkpoints(self.out, self.tc.keep_last)
            if not self.data.valid:  # no validation set: the run's model is the latest one
                ckpt_io.save_model_dir(self.model, self.out)
        self.last_saved = self.state.step

    def planned_averages(self) -> list[int]:
        """The steps whose checkpoints are averaged at the end; [] before the total is fixed."""
        st = self.state
        if self.tc.average_last < 1 or st.total_steps < 1:
            return []
        after = max(st.fit_step, st.refit_step)  # planned when the total was last fixed
        return average_steps(st.total_steps, self.tc.average_last, after=after)

    def plan(self) -> BudgetPlan:
        st = self.state
        return BudgetPlan(st.total_steps, st.fit_step, st.warmup_end, st.refit_step,
                          st.refit_progress)  # fmt: skip

    def save_due(self) -> bool:
        """A checkpoint every `save_every` steps, but only the averaged ones once their span
        starts, so that keep_last (>= average_last) keeps every one of them."""
        step, planned = self.state.step, self.planned_averages()
        if planned and step >= planned[0]:
            return step in planned
        return self.tc.save_every > 0 and step % self.tc.save_every == 0

    def should_stop(self, flag: dict[str, int]) -> str | None:
        tc, st = self.tc, self.state
        local = [
            float(flag["signal"] != 0),
            float(tc.max_minutes > 0 and self.elapsed() > 60 * tc.max_minutes),
        ]
        sig, late = all_sum(local, self.d)  # every rank must stop at the same step
        if sig:
            return "signal"
        if late:
            return "max_minutes"
        if st.total_steps and st.step >= st.total_steps:  # cosine_budget's rate reached 0
            return "total_steps"
        if st.step >= tc.max_steps:
            return "max_steps"
        if tc.max_epochs and st.epoch >= tc.max_epochs:
            return "max_epochs"
        return None


def _bar_total(tc: TrainConfig, loader: StepLoader, epoch: int) -> int | None:
    """The step the run will stop at, when it is known in advance: max_steps, or fewer when
    max_epochs ends it first. A wall-clock budget makes it unknown: no total, no false ETA
    (the bar then shows the minutes left instead)."""
    if tc.max_minutes > 0:
        return None
    total = tc.max_steps
    if tc.max_epochs > 0:
        total = min(total, tc.max_epochs * (len(loader.plan(epoch)) // loader.per_step))
    return total


def train(cfg: Config, *, tokenizer: Tokenizer | None = None, progress: bool = True) -> TrainResult:
    """Train (or resume) the run described by `cfg` into `cfg.train.out_dir`.

    Args:
        cfg: the whole Config; `model.vocab_size` is replaced by the tokenizer's.
        tokenizer: use this one instead of training SentencePiece on the training text
            (ignored on resume: the run's own tokenizer is loaded; and with
            `train.init_from`, whose tokenizer is used).
        progress: show a tqdm bar (rank 0 only).
    Returns:
        A TrainResult: the final step, why training stopped, the last logged loss, the best
        validation value.
    """
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    if cfg.train.deterministic:
        # cuBLAS is deterministic only with a fixed workspace; set before its first use.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    try:
        return _train(cfg, tokenizer, progress)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _train(cfg: Config, tokenizer: Tokenizer | None, progress: bool) -> TrainResult:
    run, net = _prepare(cfg, tokenizer)
    stopped = _loop(run, net, progress)
    _finish(run, stopped, progress)
    return TrainResult(run.out, run.state.step, stopped, run.last_loss, run.state.best)


def check_recipe(tc: TrainConfig) -> None:
    """Refuse combinations of TrainConfig values that cannot work, before anything is written."""
    if tc.accum_steps < 1 or tc.max_tokens < 1:
        raise ConfigError("train.accum_steps and train.max_tokens must be at least 1")
    if tc.best_metric == "bleu" and tc.bleu_samples < 1:
        raise ConfigError("train.best_metric = 'bleu' needs train.bleu_samples >= 1")
    if tc.average_last == 0:
        return
    if tc.lr_schedule != "cosine_budget":
        raise ConfigError("train.average_last needs train.lr_schedule = 'cosine_budget'")
    if tc.average_last < 2:
        raise ConfigError(f"train.average_last={tc.average_last}: average at least 2 (0 = off)")
    if tc.average_last > tc.keep_last:
        raise ConfigError(
            f"train.average_last={tc.average_last} exceeds train.keep_last={tc.keep_last}: "
            "the averaged checkpoints must all be kept"
        )


def _prepare(cfg: Config, tokenizer: Tokenizer | None) -> tuple[_Run, torch.nn.Module]:
    """Everything before the first step: checks, tokenizer, data, model, optimizer, resume.

    The device and every config value are checked before anything is written."""
    tc, d = cfg.train, init_distributed(cfg.train.device)
    precision = choose_precision(tc.dtype, d.device, "train.dtype")
    check_recipe(tc)
    out = Path(tc.out_dir)
    resume = find_resume(out)
    if tc.init_from:  # continued training: the architecture and vocabulary are the model's
        cfg = dataclasses.replace(cfg, model=ckpt_io.load_model_config(tc.init_from))
        tokenizer = Tokenizer.load(tc.init_from)
    heldout = _hold_out(tc, out, d) if tc.src and not tc.valid_src else None
    tok = prepare_tokenizer(cfg, out, resume, tokenizer, d, heldout)
    if heldout is not None and d.main and resume is None:
        # After the tokenizer's barrier: every rank has looked at out_dir (find_resume), so
        # none can take the files being written for foreign ones.
        for name, side in zip(HELDOUT_FILES, (0, 1), strict=True):
            atomic_write_text(out / name, "".join(pair[side] + "\n" for pair in heldout.pairs))
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(  # the vocabulary's size and ids
        cfg.model, vocab_size=tok.vocab_size, pad_id=tok.pad_id, bos_id=tok.bos_id,
        eos_id=tok.eos_id))  # fmt: skip
    if tc.max_len > cfg.model.max_len:
        raise ConfigError(f"train.max_len={tc.max_len} exceeds model.max_len={cfg.model.max_len}")
    fingerprint = data_fingerprint(tc)
    if resume is not None:
        check_resumable(out, cfg, fingerprint)
    data = load_data(tc, tok, d, heldout)
    if d.main and resume is None:  # once per run: a resume has the same data (data_sha256)
        _log_data_check(tc)
    torch.manual_seed(tc.seed)  # seeds the GPU's generator too
    random.seed(tc.seed)
    precision.apply()
    if d.main:
        log.info("device %s, precision: %s", d.device, precision.why)
    # On the device before the optimizer exists: restored Adam moments follow the parameters.
    model = Transformer(cfg.model).to(d.device)
    if tc.init_from and resume is None:  # a resumed run has its own weights
        start = ckpt_io.load_model_dir(tc.init_from, d.device, expect=Transformer)
        model.load_state_dict(start.state_dict())
        log.info("starting from the weights of %s", tc.init_from)
    opt = torch.optim.Adam(
        model.parameters(),
        lr=0.0,
        betas=tc.adam_betas,
        eps=tc.adam_eps,
        weight_decay=tc.weight_decay,
    )
    state = restore_checkpoint(resume, model, opt, d) if resume is not None else TrainState()
    if d.main:  # `runtime` records how this session computes; resume checks only model/train
        run_config = {
            **to_dict(cfg),
            "data_sha256": fingerprint,
            "runtime": {**precision.to_json(), "world_size": d.world},
        }
        if heldout is not None:
            run_config["heldout_valid"] = {
                "src": HELDOUT_FILES[0], "tgt": HELDOUT_FILES[1], "pairs": len(heldout.pairs),
                "corpus_lines": heldout.corpus_lines, "drawn": len(heldout.lines),
                "seed": tc.seed, "left_out_of_training": data.held_out,
            }  # fmt: skip
        atomic_write_json(out / RUN_CONFIG_FILE, run_config)
    model.train()
    net: torch.nn.Module = model
    if d.world > 1:  # the positional tables are constant buffers: nothing to broadcast per step
        net = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[d.device.index] if d.device.type == "cuda" else None,
            broadcast_buffers=False,
        )
    if tc.compile:
        net = torch.compile(net)  # type: ignore[assignment]
    return _Run(cfg, tok, data, model, opt, state, d, out, precision), net


def _log_data_check(tc: TrainConfig) -> None:
    """Say what `aiayn data check` finds in the corpus (counts only: one streaming pass)."""
    from aiayn.text.check import check_corpus

    t0 = time.monotonic()
    evals: dict[str, tuple[str | Path, str | Path | None]] = {}
    if tc.valid_src:
        evals["valid"] = (tc.valid_src, tc.valid_tgt or None)
    report = check_corpus(tc.src, tc.tgt or None, evals, examples=False)
    if any(report.counts.values()):
        flags = f"--src {tc.src}" + (f" --tgt {tc.tgt}" if tc.tgt else "")
        if tc.valid_src:
            flags += f" --valid-src {tc.valid_src} --valid-tgt {tc.valid_tgt}"
        log.warning("data check: %s (%.1f s); `aiayn data check %s` shows examples and can "
                    "write a cleaned corpus (docs/data.md)", report.summary(),
                    time.monotonic() - t0, flags)  # fmt: skip
    else:
        log.info("data check: nothing found (%.1f s)", time.monotonic() - t0)


def _hold_out(tc: TrainConfig, out: Path, d: Dist) -> Heldout | None:
    """No validation files: hold a validation set out of the training corpus (`data.hold_out`;
    every rank draws the same). `_prepare` writes it into the run directory (rank 0, a fresh
    run), so that `aiayn evaluate` can use it too."""
    heldout = hold_out(tc.src, tc.tgt or None, tc.seed)
    if not heldout.pairs:
        if d.main:
            log.warning("no validation files, and %d lines are too few to hold 5%% out: "
                        "training without validation", heldout.corpus_lines)  # fmt: skip
        return None
    if d.main:
        log.info(
            "no validation files: held out %d of %d training pairs (seed %d) as %s and %s in %s",
            len(heldout.pairs), heldout.corpus_lines, tc.seed, *HELDOUT_FILES, out,
        )  # fmt: skip
    return heldout


def _loop(run: _Run, net: torch.nn.Module, progress: bool) -> str:
    """Optimizer steps until a stopping rule fires; returns which one."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    tc, d, state = run.tc, run.d, run.state
    loader = StepLoader(run.data.train, tc, d)
    bar = tqdm(
        total=_bar_total(tc, loader, state.epoch),
        initial=state.step,
        unit="step",
        disable=not (progress and d.main),
        dynamic_ncols=True,
    )
    with stop_on_signals() as flag, bar, logging_redirect_tqdm():
        while (stopped := run.should_stop(flag)) is None:
            if tc.lr_schedule == "cosine_budget" and (
                _fit_budget(run) if state.total_steps == 0 else _refit_budget(run)
            ):
                bar.total = state.total_steps
                bar.refresh()
            lr = learning_rate(state.step + 1, tc, run.cfg.model.d_model, run.plan())
            epoch = state.epoch
            if d.world > 1:  # each rank its own dropout masks, a pure function of (rank, step),
                # so a multi-rank resume is exact without gathering every rank's RNG state
                torch.manual_seed(tc.seed + 7919 * d.rank + 104729 * state.step)
            chunk, tokens, (state.epoch, state.batch_in_epoch) = loader.next_step(
                state.epoch, state.batch_in_epoch
            )
            pad_id = run.cfg.model.pad_id
            batches = [collate(run.data.train, idx, pad_id).to(d.device) for idx in chunk]
            totals = train_step(net, run.opt, batches, tokens=tokens, lr=lr, pad_id=pad_id,
                                tc=tc, d=d, precision=run.precision)  # fmt: skip
            state.step, state.tokens = state.step + 1, state.tokens + tokens
            run.add_step(totals, tokens)
            bar.update(1)
            if tc.log_every > 0 and state.step % tc.log_every == 0:
                _show(run, bar, lr)
            t_aside = time.monotonic()  # validation and saving do not count in tokens/s
            due = (
                state.step % tc.valid_every == 0 if tc.valid_every > 0 else state.epoch != epoch
            )  # valid_every = 0: at the end of each epoch
            if run.data.valid and due:
                if run.validate():
                    stopped = "early_stopping"
                n, seconds = run.valid_cost
                run.valid_cost = (n + 1, seconds + time.monotonic() - t_aside)
            if run.save_due():
                run.save()
            run.window_t += time.monotonic() - t_aside
            run.aside_s += time.monotonic() - t_aside
            if stopped:
                break
    return stopped


def _fit_budget(run: _Run) -> bool:
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
    due = (steps >= FIT_MIN_STEPS and (steps >= tc.valid_every or seconds >= FIT_SHARE * budget_s)
           ) or (steps >= 1 and seconds >= 2 * FIT_SHARE * budget_s)  # fmt: skip
    mine = [float(due), *_speed(run, run.fit_mark)] if d.main else [0.0] * 4
    any_due, rate, valid_s, elapsed = all_sum(mine, d)
    if not any_due:
        return False
    _fix_plan(run, fit_total_steps(st.step, rate, elapsed, budget_s, tc.max_steps,
                                   tc.valid_every, valid_s))  # fmt: skip
    if d.main:
        log.info(
            "%.3g steps/s over steps %d-%d (%.1f s per validation): warmup to step %d, the "
            "schedule ends at step %d (%.1f of %.1f minutes used); averaging the checkpoints "
            "of steps %s", rate, run.fit_mark[0], st.step, valid_s, st.warmup_end,
            st.total_steps, elapsed / 60, tc.max_minutes, run.planned_averages() or "none",
        )  # fmt: skip
    return True


def _mark(run: _Run) -> tuple[int, float, float]:
    return run.state.step, run.elapsed(), run.aside_s


def _speed(run: _Run, mark: tuple[int, float, float]) -> list[float]:
    """Steps per second since `mark`, validating and saving taken out; seconds per
    validation so far in this session (0 before the first); elapsed seconds."""
    steps = run.state.step - mark[0]
    seconds = run.elapsed() - mark[1] - (run.aside_s - mark[2])
    n, valid_total = run.valid_cost
    return [steps / max(seconds, 1e-9), valid_total / max(n, 1), run.elapsed()]


def _fix_plan(run: _Run, total: int) -> None:
    """Record the fitted schedule in the state (it is saved with every checkpoint)."""
    st = run.state
    st.total_steps, st.fit_step = total, st.step
    st.warmup_end = fit_warmup_end(total, run.tc.warmup_steps, st.step)
    run.refit_mark = _mark(run)


def _refit_budget(run: _Run) -> bool:
    """Move cosine_budget's end when the machine turns out slower or faster than measured
    (True when it moved). Every REFIT_SHARE of the fitted run, in the cosine and before the
    averaged checkpoints' span, the speed since the last move (or the fit) re-fits the total;
    a change over REFIT_TOLERANCE is applied, the cosine going on from its current rate
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
    total = fit_total_steps(st.step, rate, elapsed, 60 * tc.max_minutes, tc.max_steps,
                            tc.valid_every, valid_s)  # fmt: skip
    if abs(total - st.total_steps) <= REFIT_TOLERANCE * st.total_steps:
        return False
    progress = run.plan().progress(st.step, start)
    old = st.total_steps
    st.total_steps, st.refit_step, st.refit_progress = total, st.step, progress
    run.refit_mark = _mark(run)
    if d.main:
        log.info(
            "%.3g steps/s over steps %d-%d (%.1f s per validation): the schedule now ends at "
            "step %d, not %d; averaging the checkpoints of steps %s",
            rate, mark_step, st.step, valid_s, total, old, run.planned_averages() or "none",
        )  # fmt: skip
    return True


def _show(run: _Run, bar: Any, lr: float) -> None:
    """Log the window's loss and speed: on the progress bar, or as a log line without one."""
    rec, state = run.log_train(lr), run.state
    if bar.disable and run.d.main:  # no bar (no tty, --no-progress): say it in the log
        log.info(
            "step %d epoch %d: loss %.3f ppl %.1f lr %.2e %.0f tok/s",
            state.step,
            state.epoch + 1,
            rec["loss"],
            rec["ppl"],
            lr,
            rec["tokens_per_s"],
        )
    left = {"left": f"{run.tc.max_minutes - run.elapsed() / 60:.1f}min"} \
        if run.tc.max_minutes else {}  # fmt: skip
    bar.set_postfix(
        loss=f"{rec['loss']:.3f}",
        ppl=f"{rec['ppl']:.1f}",
        lr=f"{lr:.2e}",
        tok_s=f"{rec['tokens_per_s']:.0f}",
        ep=state.epoch + 1,
        **left,
    )


def _write_average(run: _Run) -> bool:
    """Average the planned checkpoints that exist into OUT_DIR/averaged (a model directory),
    replacing it whole when a finished run is rerun."""
    planned = run.planned_averages()
    dirs = [c for c in ckpt_io.list_checkpoints(run.out) if int(c.name[5:]) in planned]
    if len(dirs) < 2:
        log.warning(
            "no averaged model: %d of the %d planned checkpoints exist (steps %s); the run "
            "stopped before its schedule's end", len(dirs), run.tc.average_last, planned,
        )  # fmt: skip
        return False
    final = run.out / AVERAGED_DIR
    ckpt_io.write_average(dirs, final, replace=True)
    steps = [int(c.name[5:]) for c in dirs]
    log.info("averaged the checkpoints of steps %s into %s", steps, final)
    return True


# Length penalties tried on validation at the end of a cosine_budget run: the paper's 0.6 and
# larger ones, which undertrained models' short beam outputs needed on Multi30k (issue 15).
ALPHA_GRID = (0.6, 1.0, 1.4, 2.0)
ALPHA_SENTENCES = 300  # validation sentences decoded per α: a bounded cost at a run's end


def _choose_alpha(run: _Run, progress: bool) -> None:
    """Choose the averaged model's length penalty on validation and save it as its [decode]
    default (`run_config.json`, which `translate.saved_decode_config` reads), with the sweep.

    The sweep is `evaluate --alphas`' own (translate.sweep_alpha), at the run's beam size and
    in the precision `aiayn translate` would decode in, on the first ALPHA_SENTENCES pairs.
    """
    from aiayn.runtime.device import choose_precision
    from aiayn.translate.translator import Translator, sweep_alpha

    dc, data = run.cfg.decode, run.data
    if not data.valid_srcs or dc.beam_size < 2 or dc.sample:
        log.info("alpha not chosen: it needs a validation set and beam search (decode.beam_size "
                 ">= 2, not sampling); the averaged model keeps alpha %g", dc.alpha)  # fmt: skip
        return
    where = run.out / AVERAGED_DIR
    model = ckpt_io.load_model_dir(where, run.d.device, expect=Transformer)
    precision = choose_precision("auto", run.d.device, decoding=True)
    translator = Translator(model, run.tok, dc, precision)
    n = min(ALPHA_SENTENCES, len(data.valid_srcs))
    rows = sweep_alpha(translator, dc, data.valid_srcs[:n], data.valid_refs[:n],
                       list(ALPHA_GRID), progress=progress)  # fmt: skip
    best = next(r for r in rows if r["best"])
    path = where / RUN_CONFIG_FILE
    saved = json.loads(path.read_text(encoding="utf-8"))
    saved["decode"] = {**saved.get("decode", {}), "alpha": best["alpha"]}
    saved["alpha_choice"] = {"sentences": n, "beam_size": dc.beam_size, "rows": rows}
    atomic_write_json(path, saved)
    log.info(
        "alpha %g chosen for %s on %d validation sentences (beam %d): BLEU %s",
        best["alpha"], where, n, dc.beam_size,
        ", ".join(f"{r['alpha']:g}: {r['bleu']:.2f}" for r in rows),
    )  # fmt: skip


def _finish(run: _Run, stopped: str, progress: bool = False) -> None:
    """Validate and save the final weights (they compete for "best" too), average and choose
    alpha (cosine_budget with average_last); wait for all ranks."""
    state, out, d = run.state, run.out, run.d
    t_finish = time.monotonic()
    if run.data.valid and stopped != "signal" and run.last_validated != state.step:
        run.validate()
    if run.last_saved != state.step or not ckpt_io.list_checkpoints(out):
        run.save()
    if d.main and not (out / ckpt_io.WEIGHTS_FILE).exists():  # stopped before any validation
        ckpt_io.save_model_dir(run.model, out)
    if d.main and run.tc.average_last and stopped != "signal" and _write_average(run):
        _choose_alpha(run, progress)
    if d.main:
        log.info("stopped (%s) at step %d; run directory %s (finishing took %.0f s)",
                 stopped, state.step, out, time.monotonic() - t_finish)  # fmt: skip
    if d.world > 1:
        dist.barrier()
