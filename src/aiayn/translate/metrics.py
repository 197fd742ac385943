"""Translation quality: sacreBLEU BLEU and chrF with their signatures, and exact match.

Scores are computed on detokenized text (what `Tokenizer.decode` returns) against plain
references, with sacreBLEU's defaults (BLEU: 13a tokenization, exponential smoothing; chrF:
character 6-grams, beta 2), so that a number here can be compared with a number in a paper
only when the signatures match (Post 2018, "A Call for Clarity in Reporting BLEU Scores").
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from aiayn.errors import DataError


class _Once(logging.Filter):
    """Each distinct message once per process. sacreBLEU warns in three lines whenever 100
    hypotheses end in " ." (tokenized text): a model trained on tokenized text writes that at
    every validation, so a run's log would repeat it a dozen times."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


logging.getLogger("sacrebleu").addFilter(_Once())


@dataclass(frozen=True)
class Score:
    """A corpus-level score, its sacreBLEU signature and the full one-line summary."""

    name: str  # "BLEU" or "chrF2"
    score: float  # 0..100
    signature: str  # e.g. nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0
    text: str  # e.g. BLEU = 53.73 83.3/60.0/50.0/33.3 (BP = 1.000 ratio = 1.000 ...)
    # BLEU only: hypothesis / reference length (in BLEU's tokens) and the brevity penalty,
    # exp(1 - 1 / ratio) below 1: the share of the score lost to short translations.
    length_ratio: float | None = None
    brevity_penalty: float | None = None

    def to_dict(self) -> dict[str, str | float]:
        return dataclasses.asdict(self)


def check_scored(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        raise DataError("nothing to score: no sentences")


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    """Corpus BLEU of `hyps` against one reference each (sacreBLEU defaults)."""
    check_scored(hyps, refs)
    metric = BLEU()
    result = metric.corpus_score(list(hyps), [list(refs)])
    ratio = result.sys_len / result.ref_len if result.ref_len else 0.0
    return Score(
        "BLEU",
        float(result.score),
        str(metric.get_signature()),
        str(result),
        ratio,
        float(result.bp),
    )


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> Score:
    """Corpus chrF2 (character n-gram F-score, beta = 2) of `hyps` against one reference each."""
    check_scored(hyps, refs)
    metric = CHRF()
    result = metric.corpus_score(list(hyps), [list(refs)])
    return Score(result.name, float(result.score), str(metric.get_signature()), str(result))


def bleu_by_source_length(
    srcs: Sequence[str],
    hyps: Sequence[str],
    refs: Sequence[str],
    edges: Sequence[int] = (10, 20, 30),
) -> list[dict[str, object]]:
    """Corpus BLEU and length ratio per bucket of source length in words (1-10, 11-20, 21-30,
    31+ by default): where in the length range a model loses, e.g. to short translations."""
    check_scored(hyps, refs)
    bounds = [0, *edges, 1 << 30]  # the last bucket is open-ended
    out: list[dict[str, object]] = []
    for lo, hi in itertools.pairwise(bounds):
        idx = [i for i, s in enumerate(srcs) if lo < len(s.split()) <= hi]
        if not idx:
            continue
        score = bleu([hyps[i] for i in idx], [refs[i] for i in idx])
        out.append(
            {
                "source_words": f"{lo + 1}-{hi}" if hi < bounds[-1] else f"{lo + 1}+",
                "sentences": len(idx),
                "bleu": score.score,
                "length_ratio": score.length_ratio,
            }
        )
    return out


def exact_match(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Percentage of hypotheses equal to their reference after stripping outer whitespace."""
    check_scored(hyps, refs)
    return 100.0 * sum(h.strip() == r.strip() for h, r in zip(hyps, refs, strict=True)) / len(hyps)
