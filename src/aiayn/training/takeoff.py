"""What a time budget buys: the steps a model needs before it translates, and what a budget run
says about it, at its start (once its speed is measured) and at its end.

A translation model learns little for its first few hundred steps, then "takes off": its
loss falls fast and its outputs become translations. A budget that ends before the take-off
buys a model that repeats words, however well the schedule fits the time. The steps the
take-off needs are measured, not guessed: `MEASURED` holds budget runs of the recipes in
`configs/` (docs/lab/budget_recipe.md), each with its model size, corpus, steps and test BLEU
(greedy), and a model counts as usable from `USABLE_BLEU` on. A model size without runs of
its own is judged by the nearest measured size, and the words say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aiayn.config import ModelConfig

USABLE_BLEU = 10.0  # greedy BLEU from which a model's outputs read as translations
MARGIN = 1.1  # the advice asks for this much more time than the steps strictly need
EVIDENCE = "docs/lab/budget_recipe.md"


@dataclass(frozen=True)
class Outcome:
    """One measured budget run: the model's width, its corpus, where it stopped, its BLEU."""

    d_model: int
    corpus: str
    pairs: int  # training sentence pairs
    steps: int
    bleu: float  # test BLEU, greedy, of the averaged model

    @property
    def usable(self) -> bool:
        return self.bleu >= USABLE_BLEU


# One CPU thread each: the own-data recipe (cpu_small, d_model 256) on three corpora
# ("The baseline fixed", "A held-out corpus", the Spanish -> English runs of "What a budget
# buys"), and the Multi30k budget recipe (d_model 128, "Short translations and a recipe for a
# CPU budget").
MEASURED = (
    Outcome(256, "Multi30k en-de", 29_000, 512, 25.84),
    Outcome(256, "Multi30k en-de", 29_000, 611, 31.00),
    Outcome(256, "Multi30k en-de", 29_000, 648, 28.41),
    Outcome(256, "Debian messages es-en", 60_000, 658, 12.46),
    Outcome(256, "Debian messages es-en", 60_000, 686, 18.86),
    Outcome(256, "everyday sentences es-en", 115_000, 287, 1.2),
    Outcome(256, "everyday sentences es-en", 115_000, 524, 22.2),
    Outcome(128, "Multi30k en-de", 29_000, 675, 28.1),
)


@dataclass(frozen=True)
class Need:
    """The steps after which every measured run of a model size was usable."""

    steps: int
    d_model: int  # the measured size the figure comes from
    exact: bool  # measured at the model's own d_model
    evidence: str  # the runs behind it, in words

    def whose(self, d_model: int) -> str:
        if self.exact:
            return f"models of this size (d_model {d_model})"
        return f"the nearest measured size (d_model {self.d_model}; none of {d_model} measured)"


def steps_needed(cfg: ModelConfig) -> Need:
    """The take-off of the nearest measured model size (ties: the larger, which needs more):
    the fewest steps of a usable run above the most steps of an unusable one."""
    sizes = sorted({o.d_model for o in MEASURED})
    near = min(sizes, key=lambda d: (abs(math.log(d / cfg.d_model)), -d))
    runs = [o for o in MEASURED if o.d_model == near]
    short = [o for o in runs if not o.usable]
    most = max((o.steps for o in short), default=0)
    steps = min(o.steps for o in runs if o.usable and o.steps > most)
    corpora = len({o.corpus for o in runs})
    evidence = (
        f"every measured run of {steps} steps or more reached greedy BLEU >= {USABLE_BLEU:g}"
        f" ({len(runs)} run{'s' if len(runs) > 1 else ''},"
        f" {corpora} {'corpora' if corpora > 1 else 'corpus'})"
    )
    if short:
        worst = max(short, key=lambda o: o.steps)
        evidence += f", {worst.steps} steps gave {worst.bleu:g}"
    if cfg.d_model > near:
        evidence += "; a larger model needs at least as many"
    return Need(steps, near, near == cfg.d_model, f"{evidence}; {EVIDENCE}")


def minutes_for(steps: int, steps_per_minute: float) -> int:
    """Whole minutes for `steps` at that speed, with MARGIN."""
    return max(1, math.ceil(steps * MARGIN / max(steps_per_minute, 1e-9)))


def budget_words(cfg: ModelConfig, planned: int, rate: float, minutes: float) -> tuple[bool, str]:
    """(too short, what to say) once a budget run's speed is measured: the steps its budget
    gives (`planned`, at `rate` steps/s in `minutes`) against the steps its model needs."""
    need = steps_needed(cfg)
    head = f"at {rate:.3g} steps/s, {minutes:g} minutes give ~{planned:,} steps"
    if planned >= need.steps:
        return False, (
            f"{head}: enough for {need.whose(cfg.d_model)}, which translated from "
            f"~{need.steps} steps on ({need.evidence})"
        )
    want = minutes_for(need.steps, planned / max(minutes, 1e-9))
    return True, (
        f"BUDGET TOO SHORT: {head}, and {need.whose(cfg.d_model)} needed ~{need.steps} before "
        f"they translated ({need.evidence}). Give at least {want} minutes "
        "(train.max_minutes), or choose a smaller model; this run goes on"
    )


def end_words(cfg: ModelConfig, steps: int, minutes: float, bleu: float | None) -> tuple[bool, str]:
    """(usable, what to say) at a budget run's end, from its last validation BLEU (greedy)."""
    need = steps_needed(cfg)
    if bleu is None:
        return True, (
            f"{steps:,} steps in {minutes:.1f} minutes; no validation BLEU to judge the model by "
            "(train.bleu_samples = 0 or no validation set)"
        )
    if bleu >= USABLE_BLEU:
        return True, (
            f"the model reached validation BLEU {bleu:.1f} (greedy) in {steps:,} steps: "
            "its outputs read as translations"
        )
    more = need.steps if steps < need.steps else 2 * steps  # past the take-off yet not usable
    want = minutes_for(more, steps / max(minutes, 1e-9))
    return False, (
        f"the model reached validation BLEU {bleu:.1f} (greedy) in {steps:,} steps, below the "
        f"{USABLE_BLEU:g} from which outputs read as translations: {need.whose(cfg.d_model)} "
        f"needed ~{need.steps} steps ({need.evidence}). Next time give at least {want} "
        "minutes at this speed (train.max_minutes), or choose a smaller model"
    )
