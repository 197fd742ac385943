"""Positions inside attention, the alternatives to adding a table to the embeddings (§3.5):

    rope     rotate each head's Q and K by their positions (Su et al., RoFormer, 2021), so
             q_i . k_j depends on i - j only; LLaMA's layout, the two halves of a head paired
    alibi    add -m_h |i - j| to head h's scores (Press et al., ALiBi, 2022): no parameters,
             a fixed slope per head, geometric from 2^(-8/H)
    window   a query sees keys within W positions (`band_keep`), the local attention of
             Longformer and Mistral

All three read only where queries and keys sit: query columns `q_cols_T`, key columns
`k_cols_S`. Pure functions; `aiayn.nn.attention` applies them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def rope_angles(pos: Tensor, d_k: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin of the angles pos / base^(2i/d_k) for pair i, each (*pos.shape, d_k): the
    angle of pair i sits at dimensions i and d_k/2 + i (the "halves" layout, LLaMA's). fp32,
    as Hugging Face's LLaMA computes them."""
    inv_freq = 1.0 / (base ** (torch.arange(0, d_k, 2, device=pos.device).float() / d_k))
    angles = pos.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE: each pair (x_i, x_{i+d/2}) turned by its angle: x cos + rotate_half(x) sin."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def alibi_slopes(n_heads: int) -> Tensor:
    """Head h's slope m_h (ALiBi §3): 2^(-8h/n) for h = 1..n when n is a power of 2; otherwise
    those of the power of 2 below n, then every other one of the next power's (their code)."""

    def powers(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(powers(n_heads))
    below = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(powers(below) + powers(2 * below)[0::2][: n_heads - below])


def distances(q_cols_T: Tensor, k_cols_S: Tensor) -> Tensor:
    """(T, S) query column - key column (positive: the key is in the past)."""
    return q_cols_T[:, None] - k_cols_S[None, :]


def alibi_bias(slopes_H: Tensor, dist_TS: Tensor, causal: bool) -> Tensor:
    """(H, T, S) ALiBi's additions to the scores: -m_h * distance (causal: the future is masked
    anyway, so only the past's distance counts; two-sided: |i - j|)."""
    dist = dist_TS.clamp(min=0) if causal else dist_TS.abs()
    return -slopes_H.to(dist_TS.device)[:, None, None] * dist.float()


def band_keep(dist_TS: Tensor, window: int, causal: bool) -> Tensor:
    """(T, S) bool, True = inside the window: causal, the last `window` positions (itself
    included, 0 <= i - j < W); two-sided, |i - j| <= W // 2."""
    if causal:
        return (dist_TS >= 0) & (dist_TS < window)
    return dist_TS.abs() <= window // 2
