"""The mutable state of one training run (`Run`): counters, logging, validation, saving and
the stopping rules, so that the loop in aiayn.training.loop reads top to bottom.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.config import Config
from aiayn.nn.model import Transformer, _ModelBase
from aiayn.nn.variants import DecoderLM, EncoderClassifier, EncoderMLM
from aiayn.runtime.device import Precision
from aiayn.runtime.distributed import Dist, all_sum
from aiayn.store.checkpoints import prune_checkpoints, save_checkpoint
from aiayn.store.model_dir import save_model_dir
from aiayn.store.run_dir import METRICS_FILE, TrainState, rng_tensors
from aiayn.text.data import RunData
from aiayn.text.labelled import LabelledData
from aiayn.text.lm_data import LMData
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.cls_setup import validate_classifier
from aiayn.training.lm_setup import validate_lm
from aiayn.training.mlm_setup import MaskedData, validate_mlm
from aiayn.training.schedule import BudgetPlan, average_steps
from aiayn.training.validate import validate, validation_bleu

log = logging.getLogger(__name__)

TENSORBOARD_DIR = "tb"  # train.tensorboard's event files, in the run directory


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    # max_steps | max_epochs | max_minutes | total_steps | early_stopping | signal | diverged
    stopped: str
    train_loss: float  # mean smoothed loss per target token over the last log window
    best: float | None


# A run's curve gets at least about this many training records: a budget of a few minutes on
# a slow machine is a few dozen steps, which `log_every` alone would leave with none or one.
LOG_POINTS = 40


def log_interval(log_every: int, total_steps: int) -> int:
    """Steps between training records: `log_every` (0: none), or fewer when a fitted schedule
    of `total_steps` (0: not known) would give fewer than LOG_POINTS records."""
    if log_every <= 0 or total_steps <= 0:
        return log_every
    return max(1, min(log_every, total_steps // LOG_POINTS))


class Run:
    """The mutable parts of one training run, so the loop reads top to bottom."""

    def __init__(
        self,
        cfg: Config,
        tok: Tokenizer,
        data: RunData | LMData | LabelledData | MaskedData,
        model: _ModelBase,
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
        self.logged_step = state.step  # the step of the last training record
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
        self.last_bleu: float | None = None  # the last validation's BLEU (greedy), if any
        self.budget_short = False  # the fitted budget gives fewer steps than the model needs
        self.tb: Any = None  # a TensorBoard SummaryWriter, opened on the first record

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
            if self.tc.tensorboard:
                self._tensorboard(record)

    def _tensorboard(self, record: dict[str, Any]) -> None:
        """The same record as TensorBoard scalars (OUT_DIR/tb), by step."""
        if self.tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.out / TENSORBOARD_DIR))
        step = int(record["step"])
        for key, value in record.items():
            if key not in ("step", "epoch") and isinstance(value, int | float):
                group = "valid" if key.startswith("valid_") or key == "best" else "train"
                self.tb.add_scalar(f"{group}/{key.removeprefix('valid_')}", value, step)
        self.tb.flush()

    def log_due(self) -> bool:
        """A training record is due: every `log_every` steps, or more often when a fitted
        schedule is short (`log_interval`)."""
        every = log_interval(self.tc.log_every, self.state.total_steps)
        return every > 0 and self.state.step % every == 0

    def log_train(self, lr: float) -> dict[str, float]:
        """The window's training record (all ranks: a collective), and a new window."""
        loss_sum, nll_sum, n = all_sum(self.window, self.d)
        self.logged_step = self.state.step
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

    def window_finite(self) -> bool:
        """The loss summed since the last training record is a number (all ranks: a collective):
        False once the run has diverged (NaN or inf), and its weights are no longer worth a save."""
        return math.isfinite(all_sum(self.window, self.d)[0])

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
        if isinstance(self.data, LMData):  # a language model: the loss on the text, no BLEU
            assert isinstance(self.model, DecoderLM)
            rec = validate_lm(self.model, self.data, tc, self.d, self.precision)
        elif isinstance(self.data, LabelledData):
            assert isinstance(self.model, EncoderClassifier)
            rec = validate_classifier(self.model, self.data, tc, self.d, self.precision)
        elif isinstance(self.data, MaskedData):
            assert isinstance(self.model, EncoderMLM)
            rec = validate_mlm(self.model, self.data, self.tok, tc, self.d, self.precision)
        else:
            assert isinstance(self.model, Transformer)
            rec = validate(self.model, self.data.valid, tc, self.d, self.precision)
        # rank 0 decodes; the sum hands its figures to every rank
        if tc.bleu_samples > 0 and isinstance(self.model, Transformer):
            assert isinstance(self.data, RunData)
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
            got = (
                [bleu.score, bleu.length_ratio or 0.0, bleu.brevity_penalty or 0.0]
                if bleu
                else [0.0, 0.0, 0.0]
            )
            rec["valid_bleu"], rec["valid_length_ratio"], rec["valid_bp"] = all_sum(got, self.d)
            self.last_bleu = rec["valid_bleu"]
        value = rec[f"valid_{tc.best_metric}"]
        higher_is_better = tc.best_metric != "loss"
        better = st.best is None or (value > st.best if higher_is_better else value < st.best)
        if better:
            st.best, st.best_step, st.bad_validations = value, st.step, 0
            if self.d.main:
                # the run directory's model = the best so far
                save_model_dir(self.model, self.out)
        else:
            st.bad_validations += 1
        self.last_validated = st.step
        self.metric({**rec, "best": st.best, "best_step": st.best_step})
        log.info("step %d: %s", st.step, " ".join(f"{k}={v:.4g}" for k, v in rec.items()))
        return tc.patience > 0 and st.bad_validations >= tc.patience

    def save(self) -> None:
        self.state.elapsed_s = self.elapsed()
        if self.d.main:
            save_checkpoint(
                self.out, self.model, self.opt, self.state.to_json(), rng_tensors(self.d.device)
            )
            prune_checkpoints(self.out, self.tc.keep_last)
            if not self.data.valid:  # no validation set: the run's model is the latest one
                save_model_dir(self.model, self.out)
        self.last_saved = self.state.step

    def planned_averages(self) -> list[int]:
        """The steps whose checkpoints are averaged at the end; [] before the total is fixed."""
        st = self.state
        if self.tc.average_last < 1 or st.total_steps < 1:
            return []
        after = max(st.fit_step, st.refit_step)  # planned when the total was last fixed
        return average_steps(st.total_steps, self.tc.average_last, after, self.tc.budget_decay)

    def plan(self) -> BudgetPlan:
        st = self.state
        return BudgetPlan(
            st.total_steps, st.fit_step, st.warmup_end, st.refit_step, st.refit_progress
        )

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
