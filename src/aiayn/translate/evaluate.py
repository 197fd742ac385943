"""Scoring a translator on a test set: BLEU, chrF and exact match of its outputs, and the
length-penalty sweep that keeps a model's own α unless another is better beyond chance, and
does not keep an α whose outputs are short when a larger one is not worse."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.config import DecodeConfig
from aiayn.errors import ConfigError, DataError
from aiayn.runtime.progress import progress as progress_bar
from aiayn.translate.files import read_file_lines
from aiayn.translate.metrics import bleu, bleu_by_source_length, chrf, exact_match
from aiayn.translate.translator import Translator


def read_test_set(src_path: Path, ref_path: Path) -> tuple[list[str], list[str]]:
    """The source lines and their references (`evaluate_lines`' input), as many of each."""
    src, refs = read_file_lines(src_path), read_file_lines(ref_path)
    if len(src) != len(refs):
        raise DataError(f"{src_path} has {len(src)} lines but {ref_path} has {len(refs)}")
    return src, refs


def evaluate_lines(
    translator: Translator,
    cfg: DecodeConfig,
    src: Sequence[str],
    refs: Sequence[str],
    *,
    batch_tokens: int = 2048,
    progress: bool = True,
) -> dict[str, Any]:
    """Translate `src` and score it against `refs`: BLEU, chrF (with signatures) and exact
    match, as a JSON-ready dict that also holds the hypotheses."""
    if len(src) != len(refs):
        raise DataError(f"{len(src)} source lines but {len(refs)} references")
    with progress_bar(total=len(src), unit="line", desc="evaluate", disable=not progress) as bar:
        results = list(
            translator.translate_stream(src, cfg, batch_tokens=batch_tokens, progress=bar.update)
        )
    hyps = [r[0].text for r in results]
    corpus_bleu = bleu(hyps, refs)
    return {
        "bleu": corpus_bleu.to_dict(),
        "length_ratio": corpus_bleu.length_ratio,  # hypothesis / reference length (BLEU tokens)
        "brevity_penalty": corpus_bleu.brevity_penalty,
        "by_source_length": bleu_by_source_length(src, hyps, refs),
        "chrf": chrf(hyps, refs).to_dict(),
        "exact_match": exact_match(hyps, refs),
        "sentences": len(hyps),
        "decode": dataclasses.asdict(cfg),
        "hypotheses": hyps,
    }


# A sweep moves away from the model's own α only when the best α's outputs differ from its
# outputs by more than chance: p below SIGNIFICANCE_LEVEL over the number of other αs tried
# (Bonferroni: the best of three is a selection, and one of three chance differences would
# pass a plain 0.05 test one time in seven). A run of the published Multi30k recipe showed
# why (docs/lab/translation_quality.md, "The published recipe's whole 8,000 updates, on a
# CPU"): at the end of its training α 2.0 beat the recipe's 0.6 by 0.55 BLEU on the first 300
# validation sentences (p = 0.037, against 0.05 / 3), by 0.16 on all 1,014 (p = 0.43), and lost
# 0.3 and 0.9 BLEU to it on the two test sets.
SIGNIFICANCE_LEVEL = 0.05
# An α whose beam outputs are more than 5% short of the references (brevity penalty below
# this) is not kept when a larger α offered reaches it and is not worse beyond chance
# (`brevity_alpha_row`): budget runs' beam outputs came out 8-14% short with the α the sweep
# chose before this rule (BP 0.86-0.92), and on all 1,014 Multi30k validation sentences the α
# that brought the length ratio to ~0.97 scored highest (docs/lab/budget_recipe.md).
BREVITY_FLOOR = 0.95


def sweep_alpha(
    translator: Translator,
    cfg: DecodeConfig,
    src: Sequence[str],
    refs: Sequence[str],
    alphas: list[float],
    *,
    batch_tokens: int = 2048,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Beam-search `src` once per length penalty α and score each against `refs`; `cfg.alpha`
    (the model's own) is always one of them, first if it was not asked for.

    Returns one row per α: alpha, BLEU, chrF, length ratio, brevity penalty, `current` (the
    model's own α), `bleu_p_value` and `chrf_p_value` (paired approximate randomization of
    its outputs against the current α's; None on that row), `best` (see `best_alpha_row`:
    the highest BLEU, if it differs from the current α's by more than chance; then
    `brevity_alpha_row`: a larger α if that one's outputs are short), `reason` (on the best
    row, why: "kept", the current α stays; "significant", better than it beyond chance;
    "brevity", the α so chosen was short and this one is not; None on the others) and
    `brevity_p_value` (for the rows the brevity rule compared with that α's outputs, their
    BLEU's p against it; else None). A larger α favours longer outputs, so the length ratio
    shows why BLEU moves (§6.1 chose α = 0.6 on the development set). `aiayn evaluate
    --alphas` and the end of an averaging run (aiayn.training.finish) both use it.
    """
    from aiayn.translate.significance import significance

    if cfg.beam_size < 2 or cfg.sample:
        raise ConfigError("choosing alpha needs beam search: give --beam 2 or more, not --sample")
    if cfg.alpha not in alphas:
        alphas = [cfg.alpha, *alphas]
    rows, outputs = [], []
    for alpha in alphas:
        result = evaluate_lines(
            translator,
            dataclasses.replace(cfg, alpha=alpha),
            src,
            refs,
            batch_tokens=batch_tokens,
            progress=progress,
        )
        outputs.append(result["hypotheses"])
        rows.append(
            {
                "alpha": alpha,
                "bleu": result["bleu"]["score"],
                "chrf": result["chrf"]["score"],
                "length_ratio": result["length_ratio"],
                "brevity_penalty": result["brevity_penalty"],
                "current": alpha == cfg.alpha,
            }
        )
    keep = alphas.index(cfg.alpha)
    others = [(str(i), lines) for i, lines in enumerate(outputs) if i != keep]
    tested = iter(significance(outputs[keep], refs, others)["systems"][1:])
    for i, row in enumerate(rows):
        system = None if i == keep else next(tested)
        row["bleu_p_value"] = None if system is None else system["bleu"]["p_value"]
        row["chrf_p_value"] = None if system is None else system["chrf"]["p_value"]
    gated = best_alpha_row(rows, keep)
    best, tested = brevity_alpha_row(rows, gated, outputs, refs)
    reason = "brevity" if best != gated else "kept" if gated == keep else "significant"
    for i, row in enumerate(rows):
        row["best"] = i == best
        row["reason"] = reason if i == best else None
        row["brevity_p_value"] = tested.get(i)
    return rows


def best_alpha_row(rows: Sequence[dict[str, Any]], keep: int | None = None) -> int:
    """The index of the best α's row: the highest BLEU, equal BLEUs decided by chrF (one-word
    targets, as in the quick start's numbers, give every α a BLEU of 0, and chrF still tells
    them apart), then the first. With `keep` (the model's own α's row, which each row's
    p-values compare with), that row stays best unless the highest differs from it by more
    than chance: p below SIGNIFICANCE_LEVEL / (rows - 1) for the metric that ranked them."""

    def rank(i: int) -> tuple[float, float]:
        return rows[i]["bleu"], rows[i]["chrf"]

    best = max(range(len(rows)), key=rank)
    if keep is None or rank(best) == rank(keep):  # a tie is no reason to move
        return best if keep is None else keep
    metric = "chrf" if rows[best]["bleu"] == rows[keep]["bleu"] else "bleu"
    level = SIGNIFICANCE_LEVEL / (len(rows) - 1)
    return best if rows[best][f"{metric}_p_value"] < level else keep


def brevity_alpha_row(
    rows: Sequence[dict[str, Any]],
    chosen: int,
    outputs: Sequence[Sequence[str]],
    refs: Sequence[str],
) -> tuple[int, dict[int, float]]:
    """The row to keep after `best_alpha_row` chose `chosen`: itself, unless its outputs are
    more than 5% short of the references (brevity penalty below BREVITY_FLOOR) and a larger α
    reaches BREVITY_FLOOR without being worse beyond chance; then the smallest such α.

    Not worse: its BLEU (chrF where the BLEUs tie, as `best_alpha_row` ranks) is at least
    the chosen α's, or lower with p >= SIGNIFICANCE_LEVEL by paired approximate randomization
    of its `outputs` against the chosen α's (the baseline). Returns the row's index and the
    BLEU p-values computed, by row (only where a lower score needed the test)."""
    from aiayn.translate.significance import significance

    def rank(i: int) -> tuple[float, float]:
        return rows[i]["bleu"], rows[i]["chrf"]

    tested: dict[int, float] = {}
    if rows[chosen]["brevity_penalty"] >= BREVITY_FLOOR:
        return chosen, tested
    larger = sorted(
        (
            i
            for i, r in enumerate(rows)
            if r["alpha"] > rows[chosen]["alpha"] and r["brevity_penalty"] >= BREVITY_FLOOR
        ),
        key=lambda i: rows[i]["alpha"],
    )
    for i in larger:
        if rank(i) >= rank(chosen):
            return i, tested
        metric = "chrf" if rows[i]["bleu"] == rows[chosen]["bleu"] else "bleu"
        system = significance(outputs[chosen], refs, [(str(i), outputs[i])])["systems"][1]
        tested[i] = system["bleu"]["p_value"]
        if system[metric]["p_value"] >= SIGNIFICANCE_LEVEL:
            return i, tested
    return chosen, tested


def alpha_choice_note(rows: Sequence[dict[str, Any]]) -> str | None:
    """One line on the brevity rule's part in a sweep's choice (`sweep_alpha`'s rows): why a
    larger α was taken, or why the α chosen stays though its outputs are short; None where
    the chosen α's outputs are not short."""
    best = next(r for r in rows if r["best"])
    if best.get("reason") == "brevity":
        keep = [r["current"] for r in rows].index(True)
        short = rows[best_alpha_row(rows, keep)]  # the α the gate chose
        p = best.get("brevity_p_value")
        versus = (
            "not lower than"
            if p is None
            else f"within chance (p = {p:.3f}, not below {SIGNIFICANCE_LEVEL:g}) of"
        )
        return (
            f"alpha {best['alpha']:g} chosen over {short['alpha']:g}: {short['alpha']:g}'s "
            f"beam outputs are {1 - short['length_ratio']:.0%} short of the references "
            f"(BP {short['brevity_penalty']:.3f}), {best['alpha']:g}'s reach BP "
            f"{best['brevity_penalty']:.3f} and its BLEU {best['bleu']:.2f} is {versus} "
            f"{short['bleu']:.2f}"
        )
    if best["brevity_penalty"] >= BREVITY_FLOOR:
        return None
    larger = [
        r for r in rows if r["alpha"] > best["alpha"] and r["brevity_penalty"] >= BREVITY_FLOOR
    ]
    why = (
        f"no larger alpha offered reaches BP {BREVITY_FLOOR:g}"
        if not larger
        else "the larger alphas reaching BP {:g} ({}) score lower beyond chance".format(
            BREVITY_FLOOR,
            ", ".join(
                f"{r['alpha']:g}: p = {r['brevity_p_value']:.3f}"
                if r.get("brevity_p_value") is not None
                else f"{r['alpha']:g}"
                for r in larger
            ),
        )
    )
    return (
        f"alpha {best['alpha']:g}'s beam outputs are {1 - best['length_ratio']:.0%} short of "
        f"the references (BP {best['brevity_penalty']:.3f}), and it stays: {why}"
    )
