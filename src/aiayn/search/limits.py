"""The bounds a search's settings must keep and what they imply: the checks of a
`DecodeConfig` (`check_decode_config`), the rows one sentence takes (`search_rows`) and each
sentence's output length limit (`max_output_lengths`, `output_cap`; the conventions are in
aiayn.search.decode's docstring).
"""

from __future__ import annotations

import math

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
