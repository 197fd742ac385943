"""Attention (§3.2): scaled dot-product attention and multi-head attention.

`aiayn.nn.tracing` records every intermediate for the glass box; the projections are
`aiayn.runtime.kernels.Linear`, an `nn.Linear` that runs faster when decoding on a CPU.

Dimension key (shape suffixes on tensor names):
    B batch   S source / key length   T target / query length   D d_model   H heads
    K d_k = d_model / h               J K/V heads (grouped-query: H / J query heads share one)

Beside the paper's heads, a self-attention may rotate Q and K (RoPE), bias scores by distance
(ALiBi), see a window of positions only (local attention), share K/V heads (GQA) and normalise
Q and K (`qk_norm`): `aiayn.nn.positions` holds the math, `MultiHeadAttention.from_config`
the switches.

Mask convention, everywhere in aiayn: a bool tensor where True = "may attend" (as in
`F.scaled_dot_product_attention`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn.config import ModelConfig
from aiayn.nn.local_attention import local_attention
from aiayn.nn.norms import make_norm
from aiayn.nn.positions import alibi_bias, alibi_slopes, band_keep, distances, rope_angles, rotate
from aiayn.nn.tracing import is_tracing, tap
from aiayn.runtime.kernels import Linear

if TYPE_CHECKING:
    from aiayn.nn.kv_cache import KVCache


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep_mask: Tensor | None = None,
    scale: float | None = None,
    *,
    bias: Tensor | None = None,
    trace_name: str = "",
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, the explicit math path (§3.2.1, equation 1).

        Attention(Q, K, V) = softmax(Q K^T * scale + bias) V,   scale = 1 / sqrt(d_k) by default

    Args:
        q: queries (B, H, T, K) (or (..., T, K)). k: keys (B, J, S, K). v: values (B, J, S, K_v);
            J < H K/V heads (grouped-query): query head h reads K/V head h // (H / J).
        keep_mask: bool, broadcastable to (..., T, S); True = query may attend to key.
        scale: multiplies the scores; the seed example replays with 1/30.
        bias: added to the scaled scores, broadcastable to (..., T, S) (ALiBi's distances).
    Returns:
        (output (..., T, K_v), weights (..., T, S)). A query row with no key to attend to gets
        all-zero weights and a zero output, never NaN.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1))
    if q.dim() == 4 and k.size(1) != q.size(1):
        # Each K/V head serves G query heads: viewed (B, J, G*T, K), the queries of a group
        # meet their shared keys in one product, and no K/V copy is made.
        B, H, T, _ = q.shape
        J, S = k.size(1), k.size(2)
        q_grouped = q.reshape(B, J, (H // J) * T, q.size(-1))
        scores = (q_grouped @ k.transpose(-2, -1)).view(B, H, T, S)
    else:
        scores = q @ k.transpose(-2, -1)
    scaled = scores * scale
    if bias is not None:
        scaled = scaled + bias
    if keep_mask is not None:
        scaled_masked = scaled.masked_fill(~keep_mask, float("-inf"))
        # softmax of an all -inf row is NaN; such a row (nothing visible) attends to nothing.
        any_keep = keep_mask.any(dim=-1, keepdim=True)
        weights = torch.softmax(scaled_masked, dim=-1).masked_fill(~any_keep, 0.0)
    else:
        scaled_masked = scaled
        weights = torch.softmax(scaled, dim=-1)
    out = weighted_values(weights, v)
    if trace_name and is_tracing():
        tap(f"{trace_name}.scores", scores)
        tap(f"{trace_name}.scores_scaled", scaled)
        tap(f"{trace_name}.scores_masked", scaled_masked)
        tap(f"{trace_name}.weights", weights)
        tap(f"{trace_name}.heads", out)
    return out, weights


def weighted_values(weights: Tensor, v: Tensor) -> Tensor:
    """weights @ V, for (B, H, T, S) weights and J <= H value heads (query head h reads value
    head h // (H / J), without copying the values)."""
    if weights.dim() != 4 or v.size(1) == weights.size(1):
        return weights @ v
    B, H, T, S = weights.shape
    J = v.size(1)
    return (weights.reshape(B, J, (H // J) * T, S) @ v).view(B, H, T, v.size(-1))


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
    may not be combined with `keep_mask`. `keep_mask` may also be a float tensor, added to the
    scores (-inf where masked: ALiBi's bias and a mask in one). Fewer K/V heads than query
    heads (dimension -3) are shared as `attention` shares them.
    """
    gqa = k.size(-3) != q.size(-3)
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        # On CPU, SDPA's flash kernel is 2-3x slower than its math backend in bf16 (forward +
        # backward, torch 2.13, bench/train_speed.py), while in fp32 it is 2x faster.
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(
                q, k, v, keep_mask, dropout_p, causal, enable_gqa=gqa
            )
    return F.scaled_dot_product_attention(q, k, v, keep_mask, dropout_p, causal, enable_gqa=gqa)


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

    W^Q, W^K and W^V are stacked in one (D + 2 J d_k, D) projection so self-attention does one
    matmul (the layout of `nn.MultiheadAttention`); cross-attention uses its Q rows and KV rows
    apart. J = `kv_heads` (the paper's: J = h). The switches after the paper (RoPE, ALiBi, a
    window) act on self-attention only: `from_config` builds either kind.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        *,
        kv_heads: int = 0,
        bias: bool = True,
        rope_base: float = 0.0,
        alibi: bool = False,
        window: int = 0,
        qk_norm: tuple[nn.Module, nn.Module] | None = None,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.kv_heads = kv_heads or n_heads
        self.dropout = dropout  # on attention weights (not in the paper; see ModelConfig)
        d_kv = self.kv_heads * self.d_k
        self.in_proj = Linear(d_model, d_model + 2 * d_kv, bias=bias)  # [W^Q; W^K; W^V]
        self.out_proj = Linear(d_model, d_model, bias=bias)  # W^O
        self.rope_base = rope_base  # > 0: rotate Q and K (RoPE) with this base
        self.window = window  # > 0: local attention over this many positions
        # ALiBi's slopes: a buffer, not a parameter (rebuilt from the formula, never saved)
        self.register_buffer("slopes_H", alibi_slopes(n_heads) if alibi else None, False)
        self.slopes_H: Tensor | None
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if qk_norm is not None:
            self.q_norm, self.k_norm = qk_norm
        self.trace_name = "attn"

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, self_attention: bool) -> MultiHeadAttention:
        """A layer's attention as `cfg` asks; positions and the window for self-attention."""
        positional = cfg.positional if self_attention else "none"
        return cls(
            cfg.d_model,
            cfg.n_heads,
            cfg.attn_dropout,
            kv_heads=cfg.n_kv_heads,
            bias=cfg.bias,
            rope_base=cfg.rope_base if positional == "rope" else 0.0,
            alibi=positional == "alibi",
            window=cfg.attn_window if self_attention else 0,
            qk_norm=(make_norm(cfg, cfg.d_k), make_norm(cfg, cfg.d_k)) if cfg.qk_norm else None,
        )

    @property
    def geometric(self) -> bool:
        """Whether the scores depend on where queries and keys sit (ALiBi, a window): masks
        are then built from their columns."""
        return self.slopes_H is not None or self.window > 0

    def split_heads(self, x_BTD: Tensor, heads: int = 0) -> Tensor:
        B, T, _ = x_BTD.shape
        return x_BTD.view(B, T, heads or self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, K)

    def project_q(self, x_BTD: Tensor) -> Tensor:
        D = self.d_model
        return self._norm_q(self.split_heads(self.in_proj(x_BTD, rows=(0, D))))

    def project_kv(self, mem_BSD: Tensor) -> tuple[Tensor, Tensor]:
        D, d_kv = self.d_model, self.kv_heads * self.d_k
        kv_BS2E = self.in_proj(mem_BSD, rows=(D, D + 2 * d_kv))
        k_BSE, v_BSE = kv_BS2E.split(d_kv, dim=-1)
        J = self.kv_heads
        return self._norm_k(self.split_heads(k_BSE, J)), self.split_heads(v_BSE, J)

    def project_qkv(self, x_BTD: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        D, d_kv, J = self.d_model, self.kv_heads * self.d_k, self.kv_heads
        q_BTD, k_BTE, v_BTE = self.in_proj(x_BTD).split((D, d_kv, d_kv), dim=-1)
        q_BHTK = self._norm_q(self.split_heads(q_BTD))
        return q_BHTK, self._norm_k(self.split_heads(k_BTE, J)), self.split_heads(v_BTE, J)

    def _norm_q(self, q_BHTK: Tensor) -> Tensor:
        if self.q_norm is None:
            return q_BHTK
        tap(f"{self.trace_name}.q_raw", q_BHTK)
        return self.q_norm(q_BHTK)

    def _norm_k(self, k_BJSK: Tensor) -> Tensor:
        if self.k_norm is None:
            return k_BJSK
        tap(f"{self.trace_name}.k_raw", k_BJSK)
        return self.k_norm(k_BJSK)

    def angles(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE's cos and sin at positions `pos` ((T,) or per row (B, T)), shaped to turn
        (B, H, T, K) heads."""
        cos, sin = rope_angles(pos, self.d_k, self.rope_base)
        if pos.dim() == 2:  # (B, T, K) -> (B, 1, T, K): every head turns alike
            cos, sin = cos[:, None], sin[:, None]
        return cos, sin

    def rotate_qk(
        self, q_BHTK: Tensor, k_BJTK: Tensor, angles: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """RoPE on the new queries and keys, turned by `angles` (`self.angles` of their
        positions)."""
        cos, sin = angles
        if is_tracing():
            tap(f"{self.trace_name}.q_unrotated", q_BHTK)
            tap(f"{self.trace_name}.k_unrotated", k_BJTK)
            tap(f"{self.trace_name}.rope_cos", cos)
            tap(f"{self.trace_name}.rope_sin", sin)
        return rotate(q_BHTK, cos, sin), rotate(k_BJTK, cos, sin)

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
            q_BHTK, k_BJSK, v_BJSK = self.project_qkv(x_BTD)
            if self.rope_base:
                pos_T = torch.arange(x_BTD.size(1), device=x_BTD.device)
                q_BHTK, k_BJSK = self.rotate_qk(q_BHTK, k_BJSK, self.angles(pos_T))
        else:
            q_BHTK = self.project_q(x_BTD)
            k_BJSK, v_BJSK = self.project_kv(mem_BSD)
        return self.attend(q_BHTK, k_BJSK, v_BJSK, keep_mask, causal=causal)

    def step_self(self, x_BTD: Tensor, cache: KVCache, layer: int, keep: Tensor | None) -> Tensor:
        """Causal self-attention of new positions (at columns cache.length..) over the cache,
        which they extend. `keep`: which cached columns each row may see (None: all)."""
        q_BHTK, k_BJTK, v_BJTK = self.project_qkv(x_BTD)
        start, T = cache.length, x_BTD.size(1)
        if self.rope_base:

            def angles() -> tuple[Tensor, Tensor]:
                # at each row's position: its column less the column it starts at
                pos: Tensor = torch.arange(start, start + T, device=x_BTD.device)
                if cache.start_B is not None:
                    pos = pos[None, :] - cache.start_B[:, None]
                return self.angles(pos)

            # Every layer of the step turns by the same angles: the first layer's are kept.
            q_BHTK, k_BJTK = self.rotate_qk(
                q_BHTK, k_BJTK, cache.memoised("rope", (start, T), angles)
            )
        k_BJCK, v_BJCK, k_cols = cache.append_self(layer, k_BJTK, v_BJTK)  # C: cached
        if not self.geometric:
            return self.attend(q_BHTK, k_BJCK, v_BJCK, keep, causal=True)
        C = k_BJCK.size(2)
        if is_tracing():  # the masks are recorded where they are made, in every layer
            return self.attend(
                q_BHTK, k_BJCK, v_BJCK, cache.self_keep_B11C(C, k_cols), causal=True,
                q_start=start, k_cols=k_cols,
            )  # fmt: skip
        keep_mask, bias = cache.memoised(
            "geometry",
            (start, T, C),
            lambda: self._geometry(
                T, C, start, k_cols, cache.self_keep_B11C(C, k_cols), True, q_BHTK
            ),
        )
        return self.attend(q_BHTK, k_BJCK, v_BJCK, keep_mask, bias=bias, geometry_done=True)

    def attend(
        self,
        q_BHTK: Tensor,
        k_BJSK: Tensor,
        v_BJSK: Tensor,
        keep_mask: Tensor | None,
        *,
        causal: bool = False,
        q_start: int | None = None,
        k_cols: Tensor | None = None,
        bias: Tensor | None = None,
        geometry_done: bool = False,
    ) -> Tensor:
        """Attention over already projected heads, concat, W^O. Used by forward and the cache.

        `q_start`, `k_cols`: the queries' first column and each key's column (defaults: the
        queries are the last T of S keys at columns 0..S-1); ALiBi and the window read them.
        `geometry_done`: `keep_mask` and `bias` already hold them (`_geometry`'s).
        """
        T, S = q_BHTK.size(2), k_BJSK.size(2)
        dropout_p = self.dropout if self.training else 0.0
        tracing = is_tracing()
        if self.geometric and not geometry_done:
            start = S - T if q_start is None else q_start
            if (
                self.window
                and self.slopes_H is None
                and k_cols is None
                and start == 0
                and T == S
                and self.window * 2 < T
                and not tracing
            ):  # a long sequence: attend block by block, never holding T x T
                heads_BHTK = local_attention(
                    q_BHTK, k_BJSK, v_BJSK, self.window, causal=causal, keep_B11S=keep_mask,
                    dropout_p=dropout_p,
                )  # fmt: skip
                return self._merge(heads_BHTK, tracing)
            keep_mask, bias = self._geometry(T, S, start, k_cols, keep_mask, causal, q_BHTK)
            causal = False  # in the geometry's mask now
        if tracing:  # the explicit path: every number of §3.2.1 exists, and is recorded
            if causal:
                causal_TS = causal_mask(T, S, q_BHTK.device)
                keep_mask = causal_TS if keep_mask is None else keep_mask & causal_TS
            tap(f"{self.trace_name}.q", q_BHTK)
            tap(f"{self.trace_name}.k", k_BJSK)  # J heads: shared by H / J query heads each
            tap(f"{self.trace_name}.v", v_BJSK)
            heads_BHTK, weights_BHTS = attention(
                q_BHTK, k_BJSK, v_BJSK, keep_mask, bias=bias, trace_name=self.trace_name
            )
            if dropout_p:  # same as SDPA: dropout on the weights, i.e. on their product with V
                weights_drop = F.dropout(weights_BHTS, dropout_p, training=True)
                heads_BHTK = weighted_values(weights_drop, v_BJSK)
        elif T == 1 and not dropout_p:
            # One query per row, as in every decoding step: three small products beat the
            # fused kernel's setup (~30% on CPU). Causality needs no mask: the query is the
            # newest position, which sees every key.
            heads_BHTK, _ = attention(q_BHTK, k_BJSK, v_BJSK, keep_mask, bias=bias)
        elif causal and keep_mask is None and S == T:
            heads_BHTK = fused_attention(q_BHTK, k_BJSK, v_BJSK, causal=True, dropout_p=dropout_p)
        else:
            if causal:
                causal_TS = causal_mask(T, S, q_BHTK.device)
                keep_mask = causal_TS if keep_mask is None else keep_mask & causal_TS
            if bias is not None and keep_mask is not None:  # one float mask: the bias where
                keep_mask = bias.masked_fill(~keep_mask, float("-inf")).to(q_BHTK.dtype)  # kept
            heads_BHTK = fused_attention(q_BHTK, k_BJSK, v_BJSK, keep_mask, dropout_p=dropout_p)
        return self._merge(heads_BHTK, tracing)

    def _geometry(
        self,
        T: int,
        S: int,
        start: int,
        k_cols: Tensor | None,
        keep_mask: Tensor | None,
        causal: bool,
        like: Tensor,
    ) -> tuple[Tensor, Tensor | None]:
        """The keep mask (causal, the window, `keep_mask`) and ALiBi's bias, from the columns."""
        device = like.device
        q_cols_T = torch.arange(start, start + T, device=device)
        k_cols_S = torch.arange(S, device=device) if k_cols is None else k_cols
        dist_TS = distances(q_cols_T, k_cols_S)
        keep_TS = dist_TS >= 0 if causal else torch.ones_like(dist_TS, dtype=torch.bool)
        if self.window:
            keep_TS = keep_TS & band_keep(dist_TS, self.window, causal)
            tap(f"{self.trace_name}.band_mask", keep_TS)
        keep = keep_TS if keep_mask is None else keep_mask & keep_TS
        # A query always sees itself: a padding query whose window holds no real key would
        # otherwise attend to nothing (NaN in the fused kernel).
        keep = keep | (dist_TS == 0)
        bias = None
        if self.slopes_H is not None:
            bias = alibi_bias(self.slopes_H, dist_TS, causal)
            tap(f"{self.trace_name}.alibi_bias", bias)
        return keep, bias

    def _merge(self, heads_BHTK: Tensor, tracing: bool) -> Tensor:
        """Concat the heads, then W^O."""
        B, H, T, K = heads_BHTK.shape
        concat_BTD = heads_BHTK.transpose(1, 2).reshape(B, T, H * K)
        out_BTD = self.out_proj(concat_BTD)
        if tracing:
            tap(f"{self.trace_name}.concat", concat_BTD)
            tap(f"{self.trace_name}.output", out_BTD)
        return out_BTD
