"""How sampling draws a token: top-k and top-p (nucleus) filters of the logits, inverse-CDF
draws, and the seed of each sentence's own random stream.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
