"""How far a corpus score can be trusted: its 95% bootstrap interval (Koehn 2004), and whether
two systems' scores on the same sentences differ by more than chance (paired approximate
randomization: Noreen 1989; Riezler and Maxwell 2005).

Both resample sacreBLEU's own sufficient statistics (a row of counts per sentence, whose sums
give the corpus score), so every score here is sacreBLEU's. sacreBLEU has both tests
(`PairedTest`), but its randomization p-value counts only shuffles whose difference is
strictly larger than the observed one, after MultEval: two identical outputs come out
"different" at p = 0.0001, and so does one extra word in one sentence of 300, because every
shuffle then reproduces the observed difference exactly and none exceeds it (MultEval's
issues #3 and #5). Here, as in the textbook test, a shuffle at least as far apart counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric

from aiayn.errors import DataError
from aiayn.translate.metrics import check_scored

# sacreBLEU's defaults for its --confidence and --paired-ar; a fixed seed (sacreBLEU's own,
# 12345), so a rerun prints the same numbers.
BOOTSTRAP_RESAMPLES = 1000
RANDOMIZATION_TRIALS = 10_000
SEED = 12345
# Resamples and shuffles are drawn this many sentence-weights at a time, and not kept:
# (chunk x N) float64 is at most ~64 MB whatever the size of the test set (all 10,000 shuffles
# of 100,000 sentences at once would be 8 GB).
_CHUNK_CELLS = 8_000_000


def sentence_stats(metric: Metric, hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """(N, k): the metric's sufficient statistics, one row per sentence (float64: the counts
    stay exact, and resampling is one matrix product). sacreBLEU has no public name for them:
    these two methods are the ones its own PairedTest calls (tests/translate/test_translate.py
    checks that the sums give its corpus scores)."""
    rows = metric._extract_corpus_statistics(list(hyps), [list(refs)])
    return np.asarray(rows, dtype=np.float64)


def scores(metric: Metric, totals_RK: np.ndarray) -> np.ndarray:
    """(R,): the corpus score of each row of summed statistics."""
    return np.array([metric._compute_score_from_stats(row).score for row in totals_RK])


def _chunks(total: int, n: int) -> list[int]:
    size = max(1, _CHUNK_CELLS // max(n, 1))
    return [min(size, total - start) for start in range(0, total, size)]


def bootstrap_weights(n: int, resamples: int) -> Iterator[np.ndarray]:
    """The resamples, a chunk at a time, each as how often it drew each of the n sentences
    (n draws with replacement). Every call yields the same draws (each chunk from its own
    seed): every system and metric is resampled alike, and memory holds one chunk."""
    for i, size in enumerate(_chunks(resamples, n)):
        rng = np.random.default_rng([SEED, 0, i])
        yield rng.multinomial(n, np.full(n, 1.0 / n), size=size).astype(np.float64)


def shuffle_masks(n: int, trials: int) -> Iterator[np.ndarray]:
    """The randomization's trials, a chunk at a time: 1 marks a sentence whose two outputs
    swap (a fair coin each). The same draws at every call, as `bootstrap_weights`."""
    for i, size in enumerate(_chunks(trials, n)):
        rng = np.random.default_rng([SEED, 1, i])
        yield rng.integers(2, size=(size, n)).astype(np.float64)


def interval(metric: Metric, stats_NK: np.ndarray) -> tuple[float, float]:
    """(mean, half-width) of the 95% bootstrap interval: the 2.5th to 97.5th percentile of
    the resampled corpus scores (sacreBLEU's definition)."""
    n = len(stats_NK)
    chunks = bootstrap_weights(n, BOOTSTRAP_RESAMPLES)
    resampled = np.sort(np.concatenate([scores(metric, w @ stats_NK) for w in chunks]))
    low = len(resampled) // 40
    return float(resampled.mean()), float(resampled[-1 - low] - resampled[low]) / 2


def randomization_p(metric: Metric, a_NK: np.ndarray, b_NK: np.ndarray) -> float:
    """The chance that two systems as interchangeable as a coin toss per sentence differ by
    at least their observed |score(a) - score(b)|: each trial swaps the two outputs of the
    sentences its mask marks; p = (trials at least as far apart + 1) / (trials + 1)."""
    both = a_NK.sum(0) + b_NK.sum(0)
    observed = abs(
        scores(metric, a_NK.sum(0, keepdims=True))[0]
        - scores(metric, b_NK.sum(0, keepdims=True))[0]
    )
    delta_NK = b_NK - a_NK
    as_far = 0
    for mask in shuffle_masks(len(a_NK), RANDOMIZATION_TRIALS):
        shuffled_a = a_NK.sum(0) + mask @ delta_NK  # a's sums with the marked sentences b's
        diff = np.abs(scores(metric, shuffled_a) - scores(metric, both - shuffled_a))
        as_far += int(np.sum(diff >= observed))  # exact: the sums are of whole counts
    return (as_far + 1) / (RANDOMIZATION_TRIALS + 1)


def significance(
    hyps: Sequence[str],
    refs: Sequence[str],
    others: Sequence[tuple[str, Sequence[str]]] = (),
    *,
    name: str = "hypotheses",
    tokenize: str = "13a",
) -> dict[str, Any]:
    """How much the corpus scores of `hyps` would move on another test set like this one, and
    whether they differ from each of `others` (name, hypotheses of the same sources) by more
    than chance: each system's BLEU and chrF with the mean and the half-width of its 95%
    bootstrap interval, and for each of `others` the p-value of paired approximate
    randomization against `hyps`.

    `tokenize` is BLEU's ("none" for text already tokenized, as in published Multi30k
    figures). Returns a JSON-ready dict: the tests, their sizes and seed, the metrics'
    signatures, and one entry per system, `hyps` (called `name`) first."""
    check_scored(hyps, refs)
    for other_name, other in others:
        if len(other) != len(hyps):
            raise DataError(f"{other_name} has {len(other)} lines but the test set has {len(hyps)}")
    metrics: dict[str, Metric] = {
        "bleu": BLEU(tokenize=tokenize, force=tokenize == "none"),
        "chrf": CHRF(),
    }
    systems: list[dict[str, Any]] = [{"name": name}, *({"name": o} for o, _ in others)]
    signatures = {}
    outputs = [hyps, *(o for _, o in others)]
    for key, metric in metrics.items():
        first = sentence_stats(metric, hyps, refs)
        signatures[key] = str(metric.get_signature())  # after the statistics: it names nrefs
        for i, (system, lines) in enumerate(zip(systems, outputs, strict=True)):
            stats = sentence_stats(metric, lines, refs) if i else first
            mean, half = interval(metric, stats)  # the same resamples for every system
            entry = {
                "score": float(scores(metric, stats.sum(0, keepdims=True))[0]),
                "mean": mean,
                "ci95": half,
            }
            if i:
                entry["p_value"] = randomization_p(metric, first, stats)
            system[key] = entry
    return {
        "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
        "test": "paired approximate randomization" if others else None,
        "trials": RANDOMIZATION_TRIALS if others else None,
        "seed": SEED,
        "signatures": signatures,
        "systems": systems,
    }
