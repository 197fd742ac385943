"""Attention (§3.2): scaled dot-product attention and multi-head attention.

`aiayn.nn.tracing` records every intermediate for the glass box; the projections are
`aiayn.runtime.kernels.Linear`, an `nn.Linear` that runs faster when decoding on a CPU.

Dimension key (shape suffixes on tensor names):
    B batch   S source / key length   T target / query length   D d_model   H heads
    K d_k = d_model / h

Mask convention, everywhere in aiayn: a bool tensor where True = "may attend" (as in
`F.scaled_dot_product_attention`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn.nn.tracing import is_tracing, tap
from aiayn.runtime.kernels import Linear


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep_mask: Tensor | None = None,
    scale: float | None = None,
    *,
    trace_name: str = "",
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, the explicit math path (§3.2.1, equation 1).

        Attention(Q, K, V) = softmax(Q K^T * scale) V,   scale = 1 / sqrt(d_k) by default

    Args:
        q: queries (..., T, K). k: keys (..., S, K). v: values (..., S, K_v).
        keep_mask: bool, broadcastable to (..., T, S); True = query may attend to key.
        scale: multiplies the scores; the seed example replays with 1/30.
    Returns:
        (output (..., T, K_v), weights (..., T, S)). A query row with no key to attend to gets
        all-zero weights and a zero output, never NaN.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1))
    scores = q @ k.transpose(-2, -1)
    scaled = scores * scale
    if keep_mask is not None:
        scaled_masked = scaled.masked_fill(~keep_mask, float("-inf"))
        # softmax of an all -inf row is NaN; such a row (nothing visible) attends to nothing.
        any_keep = keep_mask.any(dim=-1, keepdim=True)
        weights = torch.softmax(scaled_masked, dim=-1).masked_fill(~any_keep, 0.0)
    else:
        scaled_masked = scaled
        weights = torch.softmax(scaled, dim=-1)
    out = weights @ v
    if trace_name and is_tracing():
        tap(f"{trace_name}.scores", scores)
        tap(f"{trace_name}.scores_scaled", scaled)
        tap(f"{trace_name}.scores_masked", scaled_masked)
        tap(f"{trace_name}.weights", weights)
        tap(f"{trace_name}.heads", out)
    return out, weights


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep_mask: Tensor | None = None,
    *,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """The same function through PyTorch's fused kernel (no weights materialised).

    `causal=True` applies the top-left-aligned causal mask (query i sees keys 0..i) and
    may not be combined with `keep_mask`.
    """
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        # On CPU, SDPA's flash kernel is 2-3x slower than its math backend in bf16 (forward +
        # backward, torch 2.13, bench/train_speed.py), while in fp32 it is 2x faster.
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep_mask, dropout_p=dropout_p, is_causal=causal
            )
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=keep_mask, dropout_p=dropout_p, is_causal=causal
    )


def self_attention_unparameterised(x_BTD: Tensor) -> Tensor:
    """The parameter-free self-attention the tutorials start from: y = softmax(X X^T) X, row-wise.

    Every output is a weighted average of the inputs, weighted by dot-product similarity.
    No projections and no scaling; permuting the input rows permutes the output rows.
    """
    weights_BTT = torch.softmax(torch.bmm(x_BTD, x_BTD.transpose(1, 2)), dim=2)
    return torch.bmm(weights_BTT, x_BTD)


def causal_mask(t_q: int, t_k: int, device: torch.device | None = None) -> Tensor:
    """(t_q, t_k) bool mask for queries at the last t_q of t_k positions: query i sees keys <= i."""
    offset = t_k - t_q
    q_pos = torch.arange(t_q, device=device)[:, None] + offset
    return torch.arange(t_k, device=device)[None, :] <= q_pos


class MultiHeadAttention(nn.Module):
    """h parallel attention heads over d_k = d_model / h dimensions, then W^O (§3.2.2).

    W^Q, W^K and W^V are stacked in one (3D, D) projection so self-attention does one matmul
    (the layout of `nn.MultiheadAttention`); cross-attention uses its Q rows and KV rows apart.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.dropout = dropout  # on attention weights (not in the paper; see ModelConfig)
        self.in_proj = Linear(d_model, 3 * d_model)  # [W^Q; W^K; W^V]
        self.out_proj = Linear(d_model, d_model)  # W^O
        self.trace_name = "attn"

    def split_heads(self, x_BTD: Tensor) -> Tensor:
        B, T, _ = x_BTD.shape
        return x_BTD.view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, K)

    def project_q(self, x_BTD: Tensor) -> Tensor:
        D = self.d_model
        return self.split_heads(self.in_proj(x_BTD, rows=(0, D)))

    def project_kv(self, mem_BSD: Tensor) -> tuple[Tensor, Tensor]:
        D = self.d_model
        kv_BS2D = self.in_proj(mem_BSD, rows=(D, 3 * D))
        k_BSD, v_BSD = kv_BS2D.split(D, dim=-1)
        return self.split_heads(k_BSD), self.split_heads(v_BSD)

    def project_qkv(self, x_BTD: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q_BTD, k_BTD, v_BTD = self.in_proj(x_BTD).split(self.d_model, dim=-1)
        return self.split_heads(q_BTD), self.split_heads(k_BTD), self.split_heads(v_BTD)

    def forward(
        self,
        x_BTD: Tensor,
        mem_BSD: Tensor | None = None,
        keep_mask: Tensor | None = None,
        *,
        causal: bool = False,
    ) -> Tensor:
        """Queries from `x_BTD`; keys and values from `mem_BSD` (None or x itself = self-attention).

        Args:
            keep_mask: bool, broadcastable to (B, H, T, S), True = may attend.
            causal: also hide future keys (query i sees keys 0..i).
        Returns:
            (B, T, D). Under `tracing()` the weights (B, H, T, S) and every other intermediate
            are recorded as `<trace_name>.weights`, ... (the only way to read them).
        """
        if mem_BSD is None or mem_BSD is x_BTD:
            q_BHTK, k_BHSK, v_BHSK = self.project_qkv(x_BTD)
        else:
            q_BHTK = self.project_q(x_BTD)
            k_BHSK, v_BHSK = self.project_kv(mem_BSD)
        return self.attend(q_BHTK, k_BHSK, v_BHSK, keep_mask, causal=causal)

    def attend(
        self,
        q_BHTK: Tensor,
        k_BHSK: Tensor,
        v_BHSK: Tensor,
        keep_mask: Tensor | None,
        *,
        causal: bool = False,
    ) -> Tensor:
        """Attention over already projected heads, concat, W^O. Used by forward and the cache."""
        B, H, T, K = q_BHTK.shape
        dropout_p = self.dropout if self.training else 0.0
        tracing = is_tracing()
        if tracing:  # the explicit path: every number of §3.2.1 exists, and is recorded
            if causal:
                causal_TS = causal_mask(T, k_BHSK.size(2), q_BHTK.device)
                keep_mask = causal_TS if keep_mask is None else keep_mask & causal_TS
            tap(f"{self.trace_name}.q", q_BHTK)
            tap(f"{self.trace_name}.k", k_BHSK)
            tap(f"{self.trace_name}.v", v_BHSK)
            heads_BHTK, weights_BHTS = attention(
                q_BHTK, k_BHSK, v_BHSK, keep_mask, trace_name=self.trace_name
            )
            if dropout_p:  # same as SDPA: dropout on the weights, i.e. on their product with V
                weights_drop = F.dropout(weights_BHTS, dropout_p, training=True)
                heads_BHTK = weights_drop @ v_BHSK
        elif T == 1 and not dropout_p:
            # One query per row, as in every decoding step: three small products beat the
            # fused kernel's setup (~30% on CPU). Causality needs no mask: the query is the
            # newest position, which sees every key.
            heads_BHTK, _ = attention(q_BHTK, k_BHSK, v_BHSK, keep_mask)
        elif causal and keep_mask is None and k_BHSK.size(2) == T:
            heads_BHTK = fused_attention(q_BHTK, k_BHSK, v_BHSK, causal=True, dropout_p=dropout_p)
        else:
            if causal:
                causal_TS = causal_mask(T, k_BHSK.size(2), q_BHTK.device)
                keep_mask = causal_TS if keep_mask is None else keep_mask & causal_TS
            heads_BHTK = fused_attention(q_BHTK, k_BHSK, v_BHSK, keep_mask, dropout_p=dropout_p)
        concat_BTD = heads_BHTK.transpose(1, 2).reshape(B, T, H * K)
        out_BTD = self.out_proj(concat_BTD)
        if tracing:
            tap(f"{self.trace_name}.concat", concat_BTD)
            tap(f"{self.trace_name}.output", out_BTD)
        return out_BTD
