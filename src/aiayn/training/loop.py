"""Training (§5): `train`, a run set up (aiayn.training.setup) and its loop of optimizer steps.

    setup     aiayn.training.setup: tokenizer, data, model, Adam(β1 = 0.9, β2 = 0.98,
              ε = 1e-9) (§5.3), resume
    loss      aiayn.training.loss: (1 - ε) NLL + ε · mean over V of -log p   (ε = 0.1, §5.4)
    schedule  aiayn.training.schedule: lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)

`train(cfg)` runs a whole resumable run into `cfg.train.out_dir` (see docs/training.md):
a model directory (config.json, model.safetensors = the best weights, tokenizer.model,
run_config.json, metrics.jsonl) plus `checkpoints/step_*/` with the full training state.
Launched by `torchrun`, it trains with DistributedDataParallel; rank 0 writes every file.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import torch

from aiayn.config import Config, TrainConfig
from aiayn.runtime.device import set_threads
from aiayn.runtime.distributed import stop_on_signals
from aiayn.runtime.progress import interactive
from aiayn.text.labelled import LabelledData
from aiayn.text.lm_data import LMData
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.budget import fit_budget, refit_budget
from aiayn.training.cls_setup import SentenceLoader, class_weights
from aiayn.training.finish import finish_run
from aiayn.training.lm_setup import BlockLoader
from aiayn.training.loader import StepLoader
from aiayn.training.loss import train_step
from aiayn.training.mlm_setup import MaskedData, MaskedLoader
from aiayn.training.run import Run, TrainResult
from aiayn.training.schedule import learning_rate
from aiayn.training.setup import prepare_run
from aiayn.training.takeoff import end_words

log = logging.getLogger(__name__)


def _bar_total(
    tc: TrainConfig, loader: StepLoader | BlockLoader | SentenceLoader, epoch: int
) -> int | None:
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
    set_threads(cfg.train.threads, "train.threads")
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
    run, net = prepare_run(cfg, tokenizer, progress)
    stopped = _loop(run, net, progress)
    trained_minutes = run.elapsed() / 60  # the speed for the advice: finishing not counted
    finish_run(run, stopped, progress)
    tc = run.tc
    translator = tc.task == "translate"  # the takeoff's advice is measured in BLEU
    if tc.lr_schedule == "cosine_budget" and tc.max_minutes > 0 and run.d.main and translator:
        usable, words = end_words(run.cfg.model, run.state.step, trained_minutes, run.last_bleu)
        (log.info if usable else log.warning)("%s", words)
    return TrainResult(run.out, run.state.step, stopped, run.last_loss, run.state.best)


def _loop(run: Run, net: torch.nn.Module, progress: bool) -> str:
    """Optimizer steps until a stopping rule fires; returns which one."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    tc, d, state = run.tc, run.d, run.state
    loader: StepLoader | BlockLoader | SentenceLoader
    weight_C = None
    if isinstance(run.data, LMData):
        loader = BlockLoader(run.data, tc, d)
    elif isinstance(run.data, LabelledData):
        loader = SentenceLoader(run.data.train_ids, run.data.train_y, tc, d)
        if tc.class_weights:
            weight_C = class_weights(run.data).to(d.device)
            if d.main:
                log.info(
                    "class weights: %s",
                    ", ".join(
                        f"{name} {w:.3g}"
                        for name, w in zip(run.data.labels, weight_C.tolist(), strict=True)
                    ),
                )
    elif isinstance(run.data, MaskedData):
        loader = MaskedLoader(run.data, run.tok, tc, d)
    else:
        loader = StepLoader(run.data.train, tc, d, run.data.train_text, run.tok)
    bar = tqdm(
        total=_bar_total(tc, loader, state.epoch),
        initial=state.step,
        unit="step",
        # A log file or a pipe gets the training records as log lines instead (`_show`), as
        # fairseq's `simple` format: a bar's redraws would pile up there (runtime.progress).
        disable=not (progress and d.main and interactive()),
        dynamic_ncols=True,
    )
    with stop_on_signals() as flag, bar, logging_redirect_tqdm():
        while (stopped := run.should_stop(flag)) is None:
            if tc.lr_schedule == "cosine_budget" and (
                fit_budget(run) if state.total_steps == 0 else refit_budget(run)
            ):
                bar.total = state.total_steps
                # the log says by how much, and what to give; a re-fit may cross either way
                bar.set_description("budget too short" if run.budget_short else "")
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
            batches = [loader.batch(idx, pad_id).to(d.device) for idx in chunk]
            totals = train_step(
                net,
                run.opt,
                batches,
                tokens=tokens,
                lr=lr,
                pad_id=loader.unscored(pad_id),
                tc=tc,
                d=d,
                precision=run.precision,
                weight_C=weight_C,
            )
            state.step, state.tokens = state.step + 1, state.tokens + tokens
            run.add_step(totals, tokens)
            bar.update(1)
            if run.log_due():
                _show(run, bar, lr)
                if not math.isfinite(run.last_loss):
                    stopped = "diverged"
                    break
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
                if not run.window_finite():  # never a checkpoint (or a model) of NaN weights
                    stopped = "diverged"
                    break
                run.save()
            run.window_t += time.monotonic() - t_aside
            run.aside_s += time.monotonic() - t_aside
            if stopped:
                break
        if stopped != "diverged" and run.logged_step != state.step:  # the curve reaches the end
            _show(run, bar, learning_rate(state.step, tc, run.cfg.model.d_model, run.plan()))
    return stopped


# What a step's targets are, where they are not tokens (the records' `tokens` count them too).
TARGETS = {"classify": "texts", "mlm": "masked tok"}


def _show(run: Run, bar: Any, lr: float) -> None:
    """Log the window's loss and speed: on the progress bar, or as a log line without one."""
    rec, state = run.log_train(lr), run.state
    left = (
        {"left": f"{max(run.tc.max_minutes - run.elapsed() / 60, 0.0):.1f}min"}
        if run.tc.max_minutes
        else {}
    )
    if bar.disable and run.d.main:  # no bar (no tty, --no-progress): say it in the log
        of = f"/{bar.total}" if bar.total else ""  # the bar's total: known, or fitted
        log.info(
            "step %d%s epoch %d: loss %.3f ppl %.1f lr %.2e %.0f %s/s%s",
            state.step,
            of,
            state.epoch + 1,
            rec["loss"],
            rec["ppl"],
            lr,
            rec["tokens_per_s"],
            TARGETS.get(run.tc.task, "tok"),
            f", {left['left']} left" if left else "",
        )
    bar.set_postfix(
        loss=f"{rec['loss']:.3f}",
        ppl=f"{rec['ppl']:.1f}",
        lr=f"{lr:.2e}",
        tok_s=f"{rec['tokens_per_s']:.0f}",
        ep=state.epoch + 1,
        **left,
    )
