"""The end of a run: the final validation, the averaged model (`average_last`) and its length
penalty chosen on validation, saved as the model's `[decode]` default.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

import torch.distributed as dist

from aiayn.atomic import atomic_write_json
from aiayn.config_files import RUN_CONFIG_FILE
from aiayn.nn.model import Transformer
from aiayn.runtime.device import choose_precision
from aiayn.store.checkpoints import checkpoint_step, list_checkpoints, write_average
from aiayn.store.model_dir import WEIGHTS_FILE, load_model_dir, save_model_dir
from aiayn.store.run_dir import AVERAGED_DIR
from aiayn.text.data import RunData
from aiayn.training.run import Run

if TYPE_CHECKING:
    from aiayn.translate.translator import Translator

log = logging.getLogger(__name__)


def averaged_steps(planned: list[int], step: int) -> list[int]:
    """The checkpoints to average when a run stops at `step`: the planned ones reached, and
    the stop's own if it fell inside the planned span before its end (max_minutes came first:
    a machine slower than the last re-fit knew). It stands in for the planned checkpoints
    never reached, at a rate already near the schedule's 0, so the run still has its average."""
    reached = [s for s in planned if s <= step]
    if planned and planned[0] < step < planned[-1] and step not in planned:
        reached.append(step)
    return reached


def _write_average(run: Run) -> bool:
    """Average into OUT_DIR/averaged (a model directory, replaced whole when a finished run is
    rerun): a `cosine_budget` run's planned checkpoints that exist (`averaged_steps`); any
    other schedule's last `average_last` checkpoints, as `aiayn average --last` takes them."""
    kept, n = list_checkpoints(run.out), run.tc.average_last
    if run.tc.lr_schedule == "cosine_budget":
        planned = run.planned_averages()
        chosen = averaged_steps(planned, run.state.step)
        dirs = [c for c in kept if checkpoint_step(c) in chosen]
        missing = (
            f"{len(dirs)} of the {n} planned checkpoints exist (steps {planned}); the "
            "run stopped before its schedule's end"
        )
    else:
        dirs, planned = kept[-n:], []
        missing = f"{len(dirs)} checkpoint(s) kept, {n} to average"
    if len(dirs) < 2:
        log.warning("no averaged model: %s", missing)
        return False
    final = run.out / AVERAGED_DIR
    write_average(dirs, final, replace=True)
    steps = [checkpoint_step(c) for c in dirs]
    stand_in = (
        ""
        if not planned or set(steps) <= set(planned)
        else (
            f" (stopped at step {run.state.step}, before the schedule's end at {planned[-1]}: its "
            "checkpoint stands in for the planned ones not reached)"
        )
    )
    log.info("averaged the checkpoints of steps %s into %s%s", steps, final, stand_in)
    return True


# Length penalties tried on validation at the end of an averaging run (with the recipe's own
# decode.alpha, which stays unless another is significantly better: sweep_alpha): the paper's
# 0.6 and larger ones, which undertrained models' short beam outputs needed on Multi30k
# (docs/lab/budget_recipe.md).
ALPHA_GRID = (0.6, 1.0, 1.4, 2.0)
# The sweep takes as many validation sentences (in order, up to all) as its measured cost
# allows: the first ALPHA_PROBE are beam-searched with the recipe's α and timed, and the sweep
# (every α) is given the larger of ALPHA_MIN_SECONDS and ALPHA_BUDGET_SHARE of
# train.max_minutes, but never fewer than ALPHA_SENTENCES sentences. 300 sentences could not
# tell apart αs 0.5 BLEU apart (docs/lab/translation_quality.md): the gate against chance
# needs the whole set where it is affordable, and 10% of the budget keeps it an afterthought.
ALPHA_SENTENCES = 300
ALPHA_PROBE = 100
ALPHA_MIN_SECONDS = 120.0
ALPHA_BUDGET_SHARE = 0.10


def alpha_sweep_bound(max_minutes: float) -> float:
    """Seconds the α sweep may take at a run's end: the larger of ALPHA_MIN_SECONDS and
    ALPHA_BUDGET_SHARE of the budget (`train.max_minutes`; 0, no budget, gives the first)."""
    return max(ALPHA_MIN_SECONDS, ALPHA_BUDGET_SHARE * max_minutes * 60)


def alpha_sentences(
    lengths: list[int], probe: int, probe_seconds: float, passes: int, bound_s: float
) -> tuple[int, float]:
    """How many of the validation sentences (`lengths`: their sources' lengths, in order) the
    sweep takes, and its estimated seconds: as many as keep `passes` beam searches within
    `bound_s` at the speed the first `probe` sentences took (`probe_seconds`, per character of
    source), never fewer than ALPHA_SENTENCES (or all, when there are fewer)."""
    total = len(lengths)
    per_char = probe_seconds / max(sum(lengths[:probe]), 1)
    n, chars = 0, 0
    for length in lengths:
        if passes * per_char * (chars + length) > bound_s:
            break
        n, chars = n + 1, chars + length
    n = max(n, min(ALPHA_SENTENCES, total))
    return n, passes * per_char * sum(lengths[:n])


def _choose_alpha(run: Run, progress: bool) -> None:
    """Choose the averaged model's length penalty on validation and save it as its [decode]
    default (`run_config.json`, which `store.directory.ModelDir` reads), with the sweep.

    The sweep is `evaluate --alphas`' own (translate.evaluate.sweep_alpha: the gate against chance,
    then the brevity rule), at the run's beam size and in the precision `aiayn translate`
    would decode in, on as many validation pairs as its measured cost allows
    (`_alpha_sentences`).
    """
    from aiayn.translate.evaluate import alpha_choice_note, best_alpha_row, sweep_alpha
    from aiayn.translate.translator import Translator

    dc, data = run.cfg.decode, run.data
    if not run.tc.choose_alpha:
        log.info(
            "alpha not chosen (train.choose_alpha = false): the averaged model keeps "
            "alpha %g (%s length penalty)",
            dc.alpha,
            dc.length_penalty,
        )
        return
    assert isinstance(data, RunData)  # a translator's run (finish_run)
    if not data.valid_srcs or dc.beam_size < 2 or dc.sample:
        log.info(
            "alpha not chosen: it needs a validation set and beam search (decode.beam_size "
            ">= 2, not sampling); the averaged model keeps alpha %g",
            dc.alpha,
        )
        return
    where = run.out / AVERAGED_DIR
    model = load_model_dir(where, run.d.device, expect=Transformer)
    precision = choose_precision("auto", run.d.device, decoding=True)
    translator = Translator(model, run.tok, dc, precision)
    alphas = list(ALPHA_GRID)
    passes = len(alphas) + (dc.alpha not in alphas)
    n, estimate, bound = _alpha_sentences(run, translator, passes)
    rows = sweep_alpha(
        translator,
        dc,
        data.valid_srcs[:n],
        data.valid_refs[:n],
        alphas,
        progress=progress,
    )
    best = next(r for r in rows if r["best"])
    path = where / RUN_CONFIG_FILE
    saved = json.loads(path.read_text(encoding="utf-8"))
    saved["decode"] = {**saved.get("decode", {}), "alpha": best["alpha"]}
    saved["alpha_choice"] = {
        "sentences": n,
        "of": len(data.valid_srcs),
        "estimated_s": estimate,
        "bound_s": bound,
        "beam_size": dc.beam_size,
        "rows": rows,
    }
    atomic_write_json(path, saved)
    top = rows[best_alpha_row(rows)]  # the highest, whether or not it is chosen
    kept = (
        ""
        if top is best or best["reason"] != "kept"
        else (
            f"; alpha {top['alpha']:g} scored highest, within chance of {best['alpha']:g} "
            f"(p = {top['bleu_p_value']:.2f}), so the recipe's alpha stays"
        )
    )
    note = alpha_choice_note(rows)
    kept += f"; {note}" if note else ""
    log.info(
        "alpha %g chosen for %s on %d validation sentences (beam %d): BLEU (chrF) %s%s",
        best["alpha"],
        where,
        n,
        dc.beam_size,
        ", ".join(f"{r['alpha']:g}: {r['bleu']:.2f} ({r['chrf']:.2f})" for r in rows),
        kept,
    )


def _alpha_sentences(
    run: Run, translator: Translator, passes: int
) -> tuple[int, float | None, float]:
    """How many validation pairs the α sweep takes (`alpha_sentences`), its estimated seconds
    and its bound, logged: the first ALPHA_PROBE are beam-searched with the recipe's α and
    timed, unless there are no more than ALPHA_SENTENCES (then all, untimed)."""
    assert isinstance(run.data, RunData)
    srcs, dc = run.data.valid_srcs, run.cfg.decode
    total, bound = len(srcs), alpha_sweep_bound(run.tc.max_minutes)
    if total <= ALPHA_SENTENCES:
        log.info("alpha sweep on all %d validation sentences", total)
        return total, None, bound
    probe = min(ALPHA_PROBE, total)
    t0 = time.monotonic()
    for _ in translator.translate_stream(srcs[:probe], dc):
        pass
    took = time.monotonic() - t0
    lengths = [len(s) for s in srcs]
    n, estimate = alpha_sentences(lengths, probe, took, passes, bound)
    why = (
        f"over its {bound:.0f} s bound, but never fewer than {ALPHA_SENTENCES}"
        if estimate > bound
        else f"within its {bound:.0f} s bound"
    )
    log.info(
        "alpha sweep on %s of %s validation sentences: ~%.0f s estimated for %d beam passes, "
        "%s (the larger of %.0f s and %.0f%% of train.max_minutes; the first %d took %.1f s "
        "at alpha %g)",
        f"{n:,}",
        f"{total:,}",
        estimate,
        passes,
        why,
        ALPHA_MIN_SECONDS,
        100 * ALPHA_BUDGET_SHARE,
        probe,
        took,
        dc.alpha,
    )
    return n, estimate, bound


def finish_run(run: Run, stopped: str, progress: bool = False) -> None:
    """Validate and save the final weights (they compete for "best" too), average and choose
    alpha (with average_last); wait for all ranks."""
    state, out, d = run.state, run.out, run.d
    t_finish = time.monotonic()
    if stopped == "diverged":  # nothing of these weights is kept: no save, no average
        if d.main:
            log.error(
                "the training loss is not a number by step %d: the run diverged and stopped, "
                "and its weights are not saved (%s keeps what was saved before). Train again "
                "with a lower train.lr (now %g) or with train.clip_norm (now %g)",
                state.step,
                out,
                run.tc.lr,
                run.tc.clip_norm,
            )
        if d.world > 1:
            dist.barrier()
        return
    if run.data.valid and stopped != "signal" and run.last_validated != state.step:
        run.validate()
    if run.last_saved != state.step or not list_checkpoints(out):
        run.save()
    if d.main and not (out / WEIGHTS_FILE).exists():  # stopped before any validation
        save_model_dir(run.model, out)
    averaged = d.main and run.tc.average_last and stopped != "signal" and _write_average(run)
    if averaged and run.tc.task == "translate":  # a length penalty is a translation search's
        _choose_alpha(run, progress)
    if d.main:
        log.info(
            "stopped (%s) at step %d; run directory %s (finishing took %.0f s)",
            stopped,
            state.step,
            out,
            time.monotonic() - t_finish,
        )
    if d.world > 1:
        dist.barrier()
