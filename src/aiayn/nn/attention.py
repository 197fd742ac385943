"""Attention (§3.2) and the projections it runs on; `aiayn.nn.tracing` records it for the glass box.

Dimension key (shape suffixes on tensor names):
    B batch   S source / key length   T target / query length   D d_model   H heads
    K d_k = d_model / h

Mask convention, everywhere in aiayn: a bool tensor where True = "may attend" (as in
`F.scaled_dot_product_attention`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn.nn.tracing import is_tracing, tap

# --- linear layers with an inference fast path -------------------------------------------------
# Decoding multiplies small batches (one row per sentence or beam) by fixed weights. oneDNN can
# prepack a weight once into its blocked layout; for those shapes that is 2-2.5x faster than
# the plain GEMM on AVX-512 CPUs, with the same fp32 arithmetic (results agree to ~1e-6
# relative). Training and anything that needs gradients take the ordinary path.
#
# Whatever the path, a row's result must not depend on how many rows share the call (a served
# sentence is batched with whatever else is in flight, and must get the bits `aiayn translate`
# gets). The prepacked product keeps that at every row count. On an AVX2-only CPU (measured on
# an AMD EPYC Zen 3) a prepacked call costs a fixed ~50-90 us more than MKL's `F.linear`, which
# is faster for weights under ~2^20 elements (1-7x at 1-32 rows); MKL gives a row other bits
# in calls of 1, 2-3 and 4 or more rows, but the same bits at every count from 4 up. So there
# small weights take `F.linear` with a call's rows padded to at least `PLAIN_MIN_ROWS`, once
# `plain_rows_invariant` has seen that hold for the weight's shape and the thread count on
# this machine (one thread: yes; two: no) (docs/benchmarks.md, "Small weights through
# `F.linear` on AVX2").
_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(
    torch.ops.mkldnn, "_linear_pointwise"
)
PLAIN_MAX_WEIGHTS = 1 << 20  # elements: smaller weights may take `F.linear` on AVX2-only CPUs
PLAIN_MIN_ROWS = 4  # rows a plain call is padded to


def plain_rows_invariant(in_features: int, out_features: int) -> bool:
    """Whether `F.linear` gives every row the same bits at any row count >= PLAIN_MIN_ROWS and
    at any place in the call, for a weight of this shape on this machine's BLAS with the
    current number of torch threads: checked on random rows against one call of 260, at 8
    counts and offsets (a few ms, once per shape and thread count). With 2 threads MKL splits a
    call's rows between them, a thread may get fewer than 4, and the check fails (measured on
    a Zen 3)."""
    return _rows_invariant(in_features, out_features, torch.get_num_threads())


@functools.cache
def _rows_invariant(in_features: int, out_features: int, threads: int) -> bool:
    """`plain_rows_invariant`, run with `threads` (the current count: the cache's key)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g)
    x = torch.randn(260, in_features, generator=g)
    every = F.linear(x, w, b)
    spans = [(0, 4), (1, 5), (3, 7), (2, 8), (5, 13), (7, 33), (11, 64), (60, 200)]
    return all(torch.equal(F.linear(x[a : a + n], w, b), every[a : a + n]) for a, n in spans)


def _plain_preferred() -> bool:
    """AVX2-only CPUs (no AVX-512, no AMX): where prepacking loses for small weights."""
    return torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2")


_PLAIN_PREFERRED = _plain_preferred()


def padded_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`F.linear` with the call's rows padded to PLAIN_MIN_ROWS (zeros, results dropped)."""
    rows = x.numel() // x.size(-1)
    if rows >= PLAIN_MIN_ROWS:
        return F.linear(x, weight, bias)
    x_RD = x.reshape(rows, x.size(-1))
    padded_PD = torch.cat([x_RD, x_RD.new_zeros(PLAIN_MIN_ROWS - rows, x.size(-1))])
    return F.linear(padded_PD, weight, bias)[:rows].reshape(*x.shape[:-1], weight.size(0))


# The activations a Linear can fuse, by oneDNN's names: ReLU is the paper's FFN (§3.3), swish
# (SiLU, x * sigmoid(x)) is what Marian's OPUS-MT models use.
Activation = Literal["none", "relu", "swish"]
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "none": lambda x: x,
    "relu": F.relu,
    "swish": F.silu,
}


class _Plan(NamedTuple):
    """The path an inference call of a `Linear` took, kept for the calls after it."""

    stamp: tuple[int, int, int]  # `Linear._stamp` when it was made
    packed: bool  # the prepacked oneDNN product (else `padded_linear`)
    weight: Tensor  # the weight's rows (a view), or their packed copy
    bias: Tensor | None  # the bias's (a view)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) with two extras for inference:

    - `rows=(start, end)` uses only those output rows, e.g. W^Q out of [W^Q; W^K; W^V];
    - when no gradient is being recorded on a CPU fp32 tensor, the product runs on a oneDNN
      prepacked copy of the weight, rebuilt whenever the weight changes (its version counter
      or storage moves), so optimizer steps and `load_state_dict` are always seen. The packed
      copies live beside the weights (the model's size again, once decoding has run). On an
      AVX2-only CPU a small weight instead takes `F.linear` padded to 4 rows, where that is
      faster and gives a row the same bits in any batch (module comment above).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias)
        self._packed: dict[tuple[int, int], tuple[tuple[int, int, int], Tensor]] = {}
        # (rows, activation, torch threads) -> the path an inference call took and what it
        # needs (`_Plan`), so that later calls skip the checks that chose it: they cost ~20% of
        # a one-row decoding step of the quick start model (docs/benchmarks.md, "A linear
        # layer's checks made once").
        self._plans: dict[tuple[tuple[int, int] | None, str, int], _Plan] = {}

    def forward(
        self, x: Tensor, rows: tuple[int, int] | None = None, *, activation: Activation = "none"
    ) -> Tensor:
        if not torch.is_grad_enabled() and x.is_cpu and x.dtype is torch.float32:
            plan = self._plans.get((rows, activation, torch.get_num_threads()))
            if plan is not None and plan.stamp == self._stamp(plan.packed):
                if plan.packed:
                    return torch.ops.mkldnn._linear_pointwise(x, plan.weight, plan.bias,
                                                              activation, [], "")  # fmt: skip
                return ACTIVATIONS[activation](padded_linear(x, plan.weight, plan.bias))
        start, end = rows if rows is not None else (0, self.out_features)
        weight = self.weight if rows is None else self.weight[start:end]
        bias = None if self.bias is None else self.bias[start:end]
        if (
            _ONEDNN_LINEAR
            and not torch.is_grad_enabled()
            and x.device.type == "cpu"
            and x.dtype == torch.float32 == weight.dtype
            and not weight.is_inference()  # no version counter: changes could not be seen
        ):
            # Swish stays fused in oneDNN: torch's own SiLU computes a call's last few elements
            # (its length mod 2 vectors) by a scalar path with other bits, so a row's bits would
            # depend on where the call ends; ReLU is exact anywhere.
            key = (rows, activation, torch.get_num_threads())
            kept_bias = None if bias is None else bias.detach()
            if activation != "swish" and self._plain(start, end):
                self._plans[key] = _Plan(self._stamp(False), False, weight.detach(), kept_bias)
                return ACTIVATIONS[activation](padded_linear(x, weight, bias))
            packed = self._packed_weight(start, end, weight)
            self._plans[key] = _Plan(self._stamp(True), True, packed, kept_bias)
            return torch.ops.mkldnn._linear_pointwise(x, packed, bias, activation, [], "")
        return ACTIVATIONS[activation](F.linear(x, weight, bias))

    def _stamp(self, packed: bool) -> tuple[int, int, int]:
        """What a plan's tensors depend on: the weight's and the bias's storage (new storage
        from `.to()` or `.data =` makes a plan stale; views see in-place updates, optimizer
        steps and `load_state_dict` alike) and, for a packed copy of the weight, its version."""
        w, b = self.weight, self.bias
        return (w.data_ptr(), 0 if b is None else b.data_ptr(), w._version if packed else -1)

    def _plain(self, start: int, end: int) -> bool:
        """Whether rows start:end of the weight take `padded_linear` (module comment above): a
        rule of the machine and the shape, never of timings, so every process on a machine
        computes the same bits."""
        rows = end - start
        return (
            _PLAIN_PREFERRED
            and rows * self.in_features < PLAIN_MAX_WEIGHTS
            and plain_rows_invariant(self.in_features, rows)
        )

    def _packed_weight(self, start: int, end: int, weight: Tensor) -> Tensor:
        stamp = self._stamp(True)
        cached = self._packed.get((start, end))
        if cached is None or cached[0] != stamp:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 32)
            cached = (stamp, packed)
            self._packed[(start, end)] = cached
        return cached[1]


# --- attention (§3.2) --------------------------------------------------------------------------


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
    """The parameter-free self-attention of seed 000: y = softmax(X X^T) X, row-wise.

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

    def self_attend_packed(self, x_ND: Tensor, at_N: Tensor, keep_B11S: Tensor) -> Tensor:
        """Inference self-attention over the real positions of a padded batch only (the
        encoder's `forward_packed`): x_ND holds them in row-major order, `at_N` their indices in
        the flattened (B, S) layout. W^Q W^K W^V and W^O run on those rows; the heads attend in
        the padded layout, as `forward` does, so a real position gets the same bits."""
        B, S, D = keep_B11S.size(0), keep_B11S.size(-1), self.d_model
        qkv_N3D = self.in_proj(x_ND)
        # Padding gets zeros: a masked key must be finite (its weight 0 times its value), and
        # what padded queries compute is dropped below.
        qkv_BS3D = qkv_N3D.new_zeros(B * S, 3 * D).index_copy_(0, at_N, qkv_N3D).view(B, S, -1)
        q_BSD, k_BSD, v_BSD = qkv_BS3D.split(D, dim=-1)
        q_BHSK, k_BHSK, v_BHSK = map(self.split_heads, (q_BSD, k_BSD, v_BSD))
        heads_BHSK = fused_attention(q_BHSK, k_BHSK, v_BHSK, keep_B11S)  # as `attend` calls it
        concat_ND = heads_BHSK.transpose(1, 2).reshape(B * S, D).index_select(0, at_N)
        return self.out_proj(concat_ND)

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
