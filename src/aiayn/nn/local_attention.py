"""Local (sliding-window) attention over a long sequence, block by block: the remedy for the
O(L^2) cost of §4's Table 1 that the tutorials end on (Longformer, Mistral).

The queries are cut into blocks of W; block b's queries see keys in one span around it (the
W before it, and W // 2 after it when two-sided), so the scores are (L / W) blocks of
W x span numbers: O(L W) time and memory where dense attention's are O(L^2). Every block's
mask is the same band (the distance query - key depends on the offsets within the block and
span only); keys before column 0 or past the end are padding, masked. The result equals dense
attention with the band mask (`aiayn.nn.positions.band_keep`), which the tests check.

Dimension key: B batch  H heads  J K/V heads  T length  K d_k  N blocks  W window  P span
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.nn.positions import band_keep


def local_attention(
    q_BHTK: Tensor,
    k_BJTK: Tensor,
    v_BJTK: Tensor,
    window: int,
    *,
    causal: bool,
    keep_B11S: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Self-attention of T queries over the same T positions, each query seeing the window
    `band_keep` gives it (and itself), and the keys `keep_B11S` allows. (B, H, T, K)."""
    B, H, T, K = q_BHTK.shape
    W = window
    before, after = (W, 0) if causal else (W // 2, W // 2)
    N = -(-T // W)  # blocks of queries
    P = W + before + after  # the keys a block sees
    pad_q = N * W - T

    def blocks(x_BXTK: Tensor) -> Tensor:  # (B, X, T, K) -> (B, N, X, P, K)
        padded = F.pad(x_BXTK, (0, 0, before, pad_q + after))
        return padded.unfold(2, P, W).permute(0, 2, 1, 4, 3)

    q_BNHWK = F.pad(q_BHTK, (0, 0, 0, pad_q)).view(B, H, N, W, K).transpose(1, 2)
    k_BNJPK, v_BNJPK = blocks(k_BJTK), blocks(v_BJTK)
    # Query a of a block sits at column bW + a, key c of its span at column bW - before + c.
    a_W, c_P = torch.arange(W, device=q_BHTK.device), torch.arange(P, device=q_BHTK.device)
    dist_WP = a_W[:, None] - c_P[None, :] + before
    keep_WP = band_keep(dist_WP, W, causal)
    real_S = torch.ones(T, dtype=torch.bool, device=q_BHTK.device)
    key_BS = real_S[None, :] if keep_B11S is None else keep_B11S.reshape(-1, T) & real_S
    key_BNP = F.pad(key_BS, (before, pad_q + after)).unfold(1, P, W)
    # A query always sees itself, so a padding query is never left with no key (NaN).
    keep_BNWP = (keep_WP & key_BNP[:, :, None, :]) | (dist_WP == 0)
    # Batch and blocks as one dimension: PyTorch's fused CPU kernels take 4-D inputs only (a
    # 5-D call takes the math path, which holds every block's scores at once: ~14x the memory).
    out_XHWK = F.scaled_dot_product_attention(
        q_BNHWK.reshape(B * N, H, W, K),
        k_BNJPK.reshape(B * N, -1, P, K),
        v_BNJPK.reshape(B * N, -1, P, K),
        keep_BNWP.expand(B, N, W, P).reshape(B * N, 1, W, P),
        dropout_p,
        enable_gqa=k_BJTK.size(1) != H,
    )  # fmt: skip
    return out_XHWK.view(B, N, H, W, K).transpose(1, 2).reshape(B, H, N * W, K)[:, :, :T]
