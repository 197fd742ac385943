"""Training (§5): a run set up (tokenizer, data, model, Adam, resume) and its loop.

    loss      aiayn.training.loss: (1 - ε) NLL + ε · mean over V of -log p   (ε = 0.1, §5.4)
    optimiser Adam(β1 = 0.9, β2 = 0.98, ε = 1e-9) (§5.3), built here
    schedule  aiayn.training.schedule: lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)

`train(cfg)` runs a whole resumable run into `cfg.train.out_dir` (see docs/training.md):
a model directory (config.json, model.safetensors = the best weights, tokenizer.model,
run_config.json, metrics.jsonl) plus `checkpoints/step_*/` with the full training state.
Launched by `torchrun`, it trains with DistributedDataParallel; rank 0 writes every file.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aiayn.atomic import atomic_write_json, atomic_write_text
from aiayn.config import RUN_CONFIG_FILE, Config, ModelConfig, TrainConfig, to_dict
from aiayn.errors import ConfigError
from aiayn.nn.model import Transformer, count_parameters
from aiayn.runtime.device import (
    Precision,
    check_threads,
    choose_precision,
    require_memory,
    set_threads,
)
from aiayn.runtime.distributed import Dist, init_distributed, stop_on_signals
from aiayn.runtime.progress import interactive
from aiayn.store.model_dir import check_position_table, load_model_config, load_model_dir
from aiayn.store.run_dir import (
    TrainState,
    check_resumable,
    data_fingerprint,
    find_resume,
    restore_checkpoint,
)
from aiayn.text.batches import Example, batch_plan, collate
from aiayn.text.corpus import HELDOUT_FILES, DataStats, Heldout, hold_out, read_parallel
from aiayn.text.data import StepLoader, load_data, require_corpus
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.budget import fit_budget, refit_budget
from aiayn.training.finish import finish_run
from aiayn.training.loss import train_step
from aiayn.training.run import Run, TrainResult
from aiayn.training.schedule import learning_rate

log = logging.getLogger(__name__)


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
            require_corpus(tc)
            stats = DataStats()
            texts = [side for pair in read_parallel(tc.src, tc.tgt or None, stats, heldout)
                     for side in pair]  # fmt: skip
            if not texts:  # every pair dropped: say why, as load_data's report would
                raise ConfigError(f"no training pairs left after filtering: {stats.report(tc.src)}")
            both = f"{tc.src} and {tc.tgt}" if tc.tgt else tc.src  # one joint vocabulary
            log.info(
                "training a joint %d-piece %s tokenizer on %s", tc.vocab_size, tc.spm_model_type,
                both,
            )  # fmt: skip
            tok = Tokenizer.train(texts, tc.vocab_size, tc.spm_model_type)
        out.mkdir(parents=True, exist_ok=True)
        tok.save(out)
    if d.world > 1:
        dist.barrier()
    return tok if d.main else Tokenizer.load(out)  # type: ignore[return-value]


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
    run, net = _prepare(cfg, tokenizer, progress)
    stopped = _loop(run, net, progress)
    finish_run(run, stopped, progress)
    return TrainResult(run.out, run.state.step, stopped, run.last_loss, run.state.best)


def check_recipe(tc: TrainConfig) -> None:
    """Refuse TrainConfig values, and combinations of them, that cannot work, before anything
    is written. Every range is written so that NaN fails it (its comparisons are false)."""
    inf = math.inf
    ranges = [  # a value out of its range trained silently (lr=inf: NaN loss for an hour)
        (tc.vocab_size >= 1 and tc.max_len >= 1, "vocab_size and max_len must be at least 1"),
        (0 <= tc.label_smoothing < 1, f"label_smoothing={tc.label_smoothing} must be in [0, 1)"),
        (0 <= tc.lr < inf, f"lr={tc.lr} must be a number >= 0"),  # 0: frozen (tests use it)
        (tc.warmup_steps >= (1 if tc.lr_schedule == "noam" else 0),  # noam divides by it
         f"warmup_steps={tc.warmup_steps} must be >= 0 (noam: >= 1)"),
        (all(0 <= b < 1 for b in tc.adam_betas), f"adam_betas={tc.adam_betas} must be in [0, 1)"),
        (all(0 <= x < inf for x in (tc.adam_eps, tc.weight_decay, tc.clip_norm)),
         "adam_eps, weight_decay and clip_norm must be numbers >= 0"),
        (tc.max_steps >= 1, f"max_steps={tc.max_steps} must be at least 1"),
        (0 <= tc.max_minutes < inf, f"max_minutes={tc.max_minutes} must be >= 0 (0 = no limit)"),
        (min(tc.max_epochs, tc.valid_every, tc.save_every, tc.patience, tc.bleu_samples,
             tc.keep_last, tc.average_last) >= 0,
         "max_epochs, valid_every, save_every, patience, bleu_samples, keep_last and "
         "average_last must be >= 0"),
        (tc.log_every >= 1, f"log_every={tc.log_every} must be at least 1"),
    ]  # fmt: skip
    for ok, message in ranges:
        if not ok:
            raise ConfigError(f"train.{message}")
    check_threads(tc.threads, "train.threads")  # the bound set_threads applies
    if tc.accum_steps < 1 or tc.max_tokens < 1:
        raise ConfigError("train.accum_steps and train.max_tokens must be at least 1")
    if tc.best_metric == "bleu" and tc.bleu_samples < 1:
        raise ConfigError("train.best_metric = 'bleu' needs train.bleu_samples >= 1")
    if not 0.0 < tc.budget_decay <= 1.0:
        raise ConfigError(f"train.budget_decay={tc.budget_decay} must be in (0, 1]")
    if not 0.0 <= tc.subword_alpha < 1.0:
        raise ConfigError(f"train.subword_alpha={tc.subword_alpha} must be in [0, 1)")
    if tc.subword_alpha and tc.spm_model_type == "word":
        raise ConfigError("train.subword_alpha samples segmentations; a 'word' vocabulary "
                          "(train.spm_model_type) keeps the text's own")  # fmt: skip
    if tc.average_last == 0:
        return
    if tc.average_last < 2:
        raise ConfigError(f"train.average_last={tc.average_last}: average at least 2 (0 = off)")
    if tc.average_last > tc.keep_last:
        raise ConfigError(
            f"train.average_last={tc.average_last} exceeds train.keep_last={tc.keep_last}: "
            "the averaged checkpoints must all be kept"
        )


# What training holds per parameter at the least: fp32 weights, gradients and Adam's two
# moments (activations come on top). A model past the device's memory by this count alone
# cannot train: say so before anything is written (it was torch's allocation traceback).
TRAIN_BYTES_PER_PARAM = 16


def check_model_fits(model_cfg: ModelConfig, device: torch.device, copies: int = 1) -> None:
    """Refuse a model whose parameters alone, `copies` times (CPU ranks share the machine's
    memory), need more than `device` has; sized on the meta device, so nothing is allocated."""
    check_position_table(model_cfg, ConfigError)
    with torch.device("meta"):
        n = count_parameters(Transformer(model_cfg))
    per = f" x {copies} processes" if copies > 1 else ""
    require_memory(
        n * TRAIN_BYTES_PER_PARAM * copies,
        device,
        lambda need, have: (
            f"the model has {n:,} parameters: training holds at least {TRAIN_BYTES_PER_PARAM} "
            f"bytes each{per} (weights, gradients, Adam's moments), {need:,.1f} GiB, and "
            f"{device.type} has {have:,.1f} GiB; choose a smaller model "
            "(model.d_model, d_ff, n_layers) or train.vocab_size"
        ),
        ConfigError,
    )


def check_batch_fits(
    model_cfg: ModelConfig,
    train: list[Example],
    tc: TrainConfig,
    precision: Precision,
    copies: int = 1,
) -> None:
    """Refuse a `train.max_tokens` whose largest batch cannot fit. A lower bound of a step's
    memory, each part certainly held at once: the parameters' TRAIN_BYTES_PER_PARAM; the
    logits (target positions x vocabulary) and their gradient; and every FFN's two inputs
    (d_model and d_ff a position), which its backward keeps, in each layer of both stacks.
    `max_tokens = 10^7` on a 24 GiB machine was an allocation failure, or the kernel's OOM
    killer, after the tokenizer and the data were ready."""
    plan = batch_plan(train, tc.max_tokens, seed=tc.seed)
    if not plan:
        return
    itemsize = 2 if precision.dtype == "bf16" else 4

    def held(batch: list[int]) -> tuple[int, int, int]:  # (bytes, logits' bytes, target positions)
        tgt = len(batch) * max(train[i].tgt_positions for i in batch)
        src = len(batch) * max(len(train[i].src) for i in batch)
        logits = tgt * model_cfg.vocab_size * itemsize * 2  # the logits and their gradient
        ffn = model_cfg.n_layers * (src + tgt) * (model_cfg.d_model + model_cfg.d_ff) * itemsize
        return logits + ffn, logits, tgt

    step, logits, tgt = max(held(b) for b in plan)
    with torch.device("meta"):
        params = count_parameters(Transformer(model_cfg))
    require_memory(
        (step + params * TRAIN_BYTES_PER_PARAM) * copies,
        precision.device,
        lambda need, have: (
            f"train.max_tokens={tc.max_tokens:,} makes batches of up to {tgt:,} target "
            f"positions: their logits over {model_cfg.vocab_size:,} pieces and the gradient "
            f"hold {logits / 2**30:,.1f} GiB ({precision.dtype}), and a step at least "
            f"{need:,.1f} GiB, more than the {have:,.1f} GiB "
            f"{precision.device.type} has; lower train.max_tokens (and raise "
            "train.accum_steps to keep the update's size)"
        ),
        ConfigError,
    )


def _prepare(
    cfg: Config, tokenizer: Tokenizer | None, progress: bool = False
) -> tuple[Run, torch.nn.Module]:
    """Everything before the first step: checks, tokenizer, data, model, optimizer, resume.

    The device and every config value are checked before anything is written."""
    tc, d = cfg.train, init_distributed(cfg.train.device)
    precision = choose_precision(tc.dtype, d.device, "train.dtype")
    check_recipe(tc)
    out = Path(tc.out_dir)
    resume = find_resume(out)
    if tc.init_from:  # continued training: the architecture and vocabulary are the model's
        cfg = dataclasses.replace(cfg, model=load_model_config(tc.init_from))
        tokenizer = Tokenizer.load(tc.init_from)
    if tc.max_len > cfg.model.max_len:
        raise ConfigError(f"train.max_len={tc.max_len} exceeds model.max_len={cfg.model.max_len}")
    vocab = tokenizer.vocab_size if tokenizer is not None else tc.vocab_size  # at most
    copies = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if d.device.type == "cpu" else 1
    check_model_fits(dataclasses.replace(cfg.model, vocab_size=vocab), d.device, copies)
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
    fingerprint = data_fingerprint(tc)
    if resume is not None:
        check_resumable(out, cfg, fingerprint)
    data = load_data(tc, tok, d, heldout, bar=progress and d.main and interactive())
    check_batch_fits(cfg.model, data.train, tc, precision, copies)
    if d.main and resume is None:  # once per run: a resume has the same data (data_sha256)
        _log_data_check(tc, bar=progress and interactive())  # a log file gets its lines
    torch.manual_seed(tc.seed)  # seeds the GPU's generator too
    random.seed(tc.seed)
    precision.apply()
    if d.main:
        log.info("device %s, precision: %s", d.device, precision.why)
    # On the device before the optimizer exists: restored Adam moments follow the parameters.
    model = Transformer(cfg.model).to(d.device)
    if tc.init_from and resume is None:  # a resumed run has its own weights
        start = load_model_dir(tc.init_from, d.device, expect=Transformer)
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
    return Run(cfg, tok, data, model, opt, state, d, out, precision), net


def _log_data_check(tc: TrainConfig, bar: bool = False) -> None:
    """Say what `aiayn data check` finds in the corpus (counts only: one streaming pass, with
    its progress bar where `bar`: a large corpus takes a minute or more)."""
    from aiayn.text.check import check_corpus

    t0 = time.monotonic()
    evals: dict[str, tuple[str | Path, str | Path | None]] = {}
    if tc.valid_src:
        evals["valid"] = (tc.valid_src, tc.valid_tgt or None)
    report = check_corpus(tc.src, tc.tgt or None, evals, examples=False, bar=bar)
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


def _loop(run: Run, net: torch.nn.Module, progress: bool) -> str:
    """Optimizer steps until a stopping rule fires; returns which one."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    tc, d, state = run.tc, run.d, run.state
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
            batches = [collate(loader.data, idx, pad_id).to(d.device) for idx in chunk]
            totals = train_step(net, run.opt, batches, tokens=tokens, lr=lr, pad_id=pad_id,
                                tc=tc, d=d, precision=run.precision)  # fmt: skip
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


def _show(run: Run, bar: Any, lr: float) -> None:
    """Log the window's loss and speed: on the progress bar, or as a log line without one."""
    rec, state = run.log_train(lr), run.state
    left = {"left": f"{max(run.tc.max_minutes - run.elapsed() / 60, 0.0):.1f}min"} \
        if run.tc.max_minutes else {}  # fmt: skip
    if bar.disable and run.d.main:  # no bar (no tty, --no-progress): say it in the log
        of = f"/{bar.total}" if bar.total else ""  # the bar's total: known, or fitted
        log.info("step %d%s epoch %d: loss %.3f ppl %.1f lr %.2e %.0f tok/s%s", state.step, of,
                 state.epoch + 1, rec["loss"], rec["ppl"], lr, rec["tokens_per_s"],
                 f", {left['left']} left" if left else "")  # fmt: skip
    bar.set_postfix(
        loss=f"{rec['loss']:.3f}",
        ppl=f"{rec['ppl']:.1f}",
        lr=f"{lr:.2e}",
        tok_s=f"{rec['tokens_per_s']:.0f}",
        ep=state.epoch + 1,
        **left,
    )
