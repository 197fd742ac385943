"""What a search returns and the pure functions of its settings: `Hypothesis`, the length
penalty (GNMT's or a power of the length), output length limits, top-k / top-p filters, seeded
inverse-CDF sampling and the checks of a `DecodeConfig` (the conventions are in
aiayn.search.decode's docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.config import DecodeConfig
from aiayn.errors import ConfigError

# Past ~100 the penalty ((5 + |Y|) / 6) ** alpha overflows a float for long outputs; no
# published setting goes beyond 2 (fairseq, Marian, GNMT use 0.6-1.4).
MAX_ALPHA = 10.0
MAX_LENGTH = 2**31 - 1  # token counts in settings: more than any positional table holds
# One sentence's rows (beams, or samples) at most: `--sample --nbest 100000` held 8.9 GB for
# one word of the quick start model. Beams of 4-10 are usual; a thousand samples feed MBR.
MAX_ROWS = 1024


@dataclass(frozen=True)
class Hypothesis:
    """One output sequence with its scores (see the module docstring for the conventions)."""

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


def max_output_lengths(src_len_B: Tensor, a: float, b: int, cap: int) -> Tensor:
    """Per-sentence output limit: floor(a * src_len + b), clamped to [1, cap]."""
    return (src_len_B.double() * a + b).floor().long().clamp(1, cap)


def search_rows(cfg: DecodeConfig) -> int:
    """The rows one sentence takes in the search: its beams, its samples, or one (greedy)."""
    return cfg.nbest if cfg.sample else cfg.beam_size


def output_cap(cfg: DecodeConfig, model_max_len: int) -> int:
    """The most output tokens any sentence may get: the model's positional table, or
    `cfg.max_tokens` when that is smaller."""
    return min(model_max_len, cfg.max_tokens) if cfg.max_tokens > 0 else model_max_len


def top_k_filter(logits_RV: Tensor, k: int) -> Tensor:
    """Keep the k highest logits of each row, set the rest to -inf (k <= 0: keep all)."""
    if k <= 0 or k >= logits_RV.size(-1):
        return logits_RV
    kth_R1 = logits_RV.topk(k, dim=-1).values[:, -1:]
    return logits_RV.masked_fill(logits_RV < kth_R1, float("-inf"))


def top_p_filter(logits_RV: Tensor, p: float) -> Tensor:
    """Nucleus filter (Holtzman et al. 2020): keep the smallest set of most probable tokens
    whose probability mass reaches p; the most probable token is always kept."""
    if p >= 1.0:
        return logits_RV
    sorted_RV, order_RV = logits_RV.sort(dim=-1, descending=True)
    probs_RV = sorted_RV.softmax(-1)
    mass_before_RV = probs_RV.cumsum(-1) - probs_RV  # mass of the strictly better tokens
    drop_sorted_RV = mass_before_RV >= p
    drop_sorted_RV[:, 0] = False  # even when p rounds to 0 in the logits' type
    drop_RV = drop_sorted_RV.scatter(-1, order_RV, drop_sorted_RV)
    return logits_RV.masked_fill(drop_RV, float("-inf"))


def inverse_cdf_sample(probs_RV: Tensor, u_R: Tensor) -> Tensor:
    """One token per row drawn by inverting the CDF at u in [0, 1): token i has probability
    probs[i] / sum(probs). A zero-probability token is never returned (not even when rounding
    pushes u * total to the total: the last token with mass is taken then)."""
    cdf_RV = probs_RV.double().cumsum(-1)
    total_R1 = cdf_RV[:, -1:]
    pick_R = torch.searchsorted(cdf_RV, u_R.double()[:, None] * total_R1, right=True)[:, 0]
    last_R = (cdf_RV < total_R1).sum(-1)  # the first index where the CDF reaches its total
    return torch.minimum(pick_R, last_R)


_MASK64 = (1 << 64) - 1


def sample_seed(seed: int, line_no: int) -> int:
    """The generator seed of one sentence: SplitMix64 of (seed, line number), 63 bits.

    Each sentence samples from its own stream, so its samples depend on the seed and its line,
    never on which sentences share its batch (`Translator` passes line numbers).
    """
    x = (seed * 0x9E3779B97F4A7C15 + line_no) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


def check_decode_config(cfg: DecodeConfig, vocab_size: int = 0) -> None:
    """Raise a one-line ConfigError for settings no search can honour (with `vocab_size`, the
    model's: also a beam wider than its vocabulary, which has fewer tokens than beams to fill)."""
    # One `if` each, so a message is only formatted when it is raised: the server checks the
    # settings of every request.
    if cfg.beam_size < 1:
        raise ConfigError(f"beam size must be at least 1, got {cfg.beam_size}")
    if cfg.nbest < 1:
        raise ConfigError(f"nbest must be at least 1, got {cfg.nbest}")
    if search_rows(cfg) > MAX_ROWS:
        raise ConfigError(
            f"{'nbest (samples)' if cfg.sample else 'beam size'} {search_rows(cfg):,} is more "
            f"than {MAX_ROWS:,}: each is a row of the search, with its own caches and logits"
        )
    if not cfg.sample and cfg.nbest > cfg.beam_size:
        raise ConfigError(f"nbest={cfg.nbest} cannot exceed the beam size {cfg.beam_size}")
    if vocab_size and not cfg.sample and cfg.beam_size > vocab_size:
        raise ConfigError(
            f"beam size {cfg.beam_size} exceeds the model's vocabulary of {vocab_size} tokens"
        )
    if not all(map(math.isfinite, (cfg.alpha, cfg.temperature, cfg.top_p, cfg.max_len_a))):
        raise ConfigError("alpha, temperature, top_p and max_len_a must be finite numbers")
    if cfg.temperature <= 0:
        raise ConfigError(f"temperature must be positive, got {cfg.temperature}")
    if not 0.0 < cfg.top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {cfg.top_p}")
    if cfg.top_k < 0:
        raise ConfigError(f"top_k must be >= 0 (0 = off), got {cfg.top_k}")
    if cfg.min_len < 0:
        raise ConfigError(f"min_len must be >= 0, got {cfg.min_len}")
    if cfg.max_len_a < 0 or cfg.max_len_b < 0:
        raise ConfigError("max_len_a and max_len_b must be >= 0")
    if cfg.max_tokens < 0:
        raise ConfigError(f"max_tokens must be >= 0 (0 = the model's), got {cfg.max_tokens}")
    if cfg.length_penalty not in ("gnmt", "power"):
        raise ConfigError(f"length_penalty={cfg.length_penalty!r}: choose 'gnmt' or 'power'")
    if not 0 <= cfg.alpha <= MAX_ALPHA:
        raise ConfigError(f"length penalty alpha must be in [0, {MAX_ALPHA:g}], got {cfg.alpha}")
    if max(cfg.min_len, cfg.max_len_b) > MAX_LENGTH:  # they become int64 tensors
        raise ConfigError(f"min_len and max_len_b must be at most {MAX_LENGTH:,} tokens")
