"""What a search returns and how it is scored: `Hypothesis` (the conventions are in
aiayn.search.decode's docstring) and the length penalty its score is divided by, GNMT's or a
power of the length.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hypothesis:
    """One output sequence with its scores (conventions: aiayn.search.decode's docstring)."""

    tokens: list[int]
    log_prob: float
    score: float
    eos: bool


# How each form of DecodeConfig.length_penalty reads, for the glass box's tables
LENGTH_PENALTY_FORMULAS = {"gnmt": "((5 + |Y|) / 6) ** alpha (GNMT)", "power": "|Y| ** alpha"}


def length_penalty(length: int, alpha: float, form: str) -> float:
    """lp(Y), by which a hypothesis's log-probability is divided (DecodeConfig.length_penalty).

    "gnmt": ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, §7; the paper's §6.1, alpha 0.6).
    "power": |Y| ** alpha, the rule of fairseq's --lenpen (its default 1: the mean per token),
    Hugging Face's and CTranslate2's length_penalty and Marian's --normalize; an empty live
    hypothesis counts as length 1.
    """
    if form == "power":
        return max(length, 1) ** alpha
    return ((5 + length) / 6) ** alpha
