"""Each sentence's output length limit (`max_output_lengths`, `output_cap`; the conventions are
in aiayn.search.decode's docstring). The bounds the settings themselves must keep are checked
beside `DecodeConfig` (`aiayn.config.check_decode_config`).
"""

from __future__ import annotations

from torch import Tensor

from aiayn.config import DecodeConfig


def max_output_lengths(src_len_B: Tensor, a: float, b: int, cap: int) -> Tensor:
    """Per-sentence output limit: floor(a * src_len + b), clamped to [1, cap]."""
    return (src_len_B.double() * a + b).floor().long().clamp(1, cap)


def output_cap(cfg: DecodeConfig, model_max_len: int) -> int:
    """The most output tokens any sentence may get: the model's positional table, or
    `cfg.max_tokens` when that is smaller."""
    return min(model_max_len, cfg.max_tokens) if cfg.max_tokens > 0 else model_max_len
