"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), Figure 1, top to bottom.

Dimension key (shape suffixes on tensor names):
    B batch   S source / key length   T target / query length   D d_model   H heads
    K d_k = d_model / h               F d_ff                    V vocabulary   L layers

Mask convention, everywhere in aiayn: a bool tensor where True = "may attend" (as in
`F.scaled_dot_product_attention`). Masks are built here from `pad_id`, nowhere else.

Sequences are right-padded. The decoder's causal mask therefore already hides target padding
from every real position, so decoder self-attention needs no padding mask (and can use the
fused causal kernel); outputs at PAD positions are computed but meaningless and never used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn.config import ModelConfig

# --- tracing: the glass box taps the real forward pass ----------------------------------------
# When a trace is active, modules record named intermediates and attention takes the explicit
# math path so that every number (Q, K, V, scores, weights...) exists. When none is active
# (training, decoding), a tap is one context-variable read.


@dataclass
class Trace:
    """Named intermediates of one traced forward pass, in the order they were computed."""

    tensors: dict[str, Tensor] = field(default_factory=dict)
    prefix: str = ""

    def record(self, name: str, x: Tensor) -> None:
        self.tensors[self.prefix + name] = x.detach().clone()


_TRACE: ContextVar[Trace | None] = ContextVar("aiayn_trace", default=None)


@contextmanager
def tracing(prefix: str = "") -> Iterator[Trace]:
    """Record every named intermediate computed inside the `with` block."""
    trace = Trace(prefix=prefix)
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        _TRACE.reset(token)


def _tap(name: str, x: Tensor) -> None:
    trace = _TRACE.get()
    if trace is not None:
        trace.record(name, x)


def _tracing() -> bool:
    return _TRACE.get() is not None


# --- linear layers with an inference fast path -------------------------------------------------
# Decoding multiplies small batches (one row per sentence or beam) by fixed weights. oneDNN can
# prepack a weight once into its blocked layout; for those shapes that is 2-2.5x faster than
# the plain GEMM, with the same fp32 arithmetic (results agree to ~1e-6 relative). Training
# and anything that needs gradients take the ordinary path.
_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(
    torch.ops.mkldnn, "_linear_pointwise"
)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) with two extras for inference:

    - `rows=(start, end)` uses only those output rows, e.g. W^Q out of [W^Q; W^K; W^V];
    - when no gradient is being recorded on a CPU fp32 tensor, the product runs on a oneDNN
      prepacked copy of the weight, rebuilt whenever the weight changes (its version counter
      or storage moves), so optimizer steps and `load_state_dict` are always seen.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias)
        self._packed: dict[tuple[int, int], tuple[tuple[int, int], Tensor]] = {}

    def forward(
        self, x: Tensor, rows: tuple[int, int] | None = None, *, relu: bool = False
    ) -> Tensor:
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
            packed = self._packed_weight(start, end, weight)
            return torch.ops.mkldnn._linear_pointwise(
                x, packed, bias, "relu" if relu else "none", [], ""
            )
        out = F.linear(x, weight, bias)
        return F.relu(out) if relu else out

    def _packed_weight(self, start: int, end: int, weight: Tensor) -> Tensor:
        stamp = (self.weight._version, self.weight.data_ptr())
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
    if trace_name and _tracing():
        _tap(f"{trace_name}.scores", scores)
        _tap(f"{trace_name}.scores_scaled", scaled)
        _tap(f"{trace_name}.scores_masked", scaled_masked)
        _tap(f"{trace_name}.weights", weights)
        _tap(f"{trace_name}.heads", out)
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


@dataclass
class AttentionOutput:
    output: Tensor  # (B, T, D)
    attention: Tensor | None = None  # (B, H, T, S) when requested


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
        return_attention: bool = False,
    ) -> AttentionOutput:
        """Queries from `x_BTD`; keys and values from `mem_BSD` (None or x itself = self-attention).

        Args:
            keep_mask: bool, broadcastable to (B, H, T, S), True = may attend.
            causal: also hide future keys (query i sees keys 0..i).
            return_attention: take the explicit path and return the weights (B, H, T, S).
        """
        if mem_BSD is None or mem_BSD is x_BTD:
            q_BHTK, k_BHSK, v_BHSK = self.project_qkv(x_BTD)
        else:
            q_BHTK = self.project_q(x_BTD)
            k_BHSK, v_BHSK = self.project_kv(mem_BSD)
        return self.attend(
            q_BHTK, k_BHSK, v_BHSK, keep_mask, causal=causal, return_attention=return_attention
        )

    def attend(
        self,
        q_BHTK: Tensor,
        k_BHSK: Tensor,
        v_BHSK: Tensor,
        keep_mask: Tensor | None,
        *,
        causal: bool = False,
        return_attention: bool = False,
    ) -> AttentionOutput:
        """Attention over already projected heads, concat, W^O. Used by forward and the cache."""
        B, H, T, K = q_BHTK.shape
        dropout_p = self.dropout if self.training else 0.0
        tracing = _tracing()
        weights_BHTS = None
        if return_attention or tracing:
            if causal:
                causal_TS = causal_mask(T, k_BHSK.size(2), q_BHTK.device)
                keep_mask = causal_TS if keep_mask is None else keep_mask & causal_TS
            if tracing:
                _tap(f"{self.trace_name}.q", q_BHTK)
                _tap(f"{self.trace_name}.k", k_BHSK)
                _tap(f"{self.trace_name}.v", v_BHSK)
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
            _tap(f"{self.trace_name}.concat", concat_BTD)
            _tap(f"{self.trace_name}.output", out_BTD)
        return AttentionOutput(out_BTD, weights_BHTS if return_attention else None)


# --- position-wise FFN (§3.3) and positions (§3.5) --------------------------------------------


class PositionwiseFFN(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, the same two layers at every position (§3.3)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w_1 = Linear(d_model, d_ff)
        self.w_2 = Linear(d_ff, d_model)
        self.trace_name = "ffn"

    def forward(self, x_BTD: Tensor) -> Tensor:
        hidden_BTF = self.w_1(x_BTD, relu=True)
        out_BTD = self.w_2(hidden_BTF)
        if _tracing():
            _tap(f"{self.trace_name}.hidden", hidden_BTF)
            _tap(f"{self.trace_name}.output", out_BTD)
        return out_BTD


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (§3.5).

    Both dimensions of a sin/cos pair share one frequency (the seeds give the cos dimension
    the next pair's frequency; see WORKED_EXAMPLES.md §2). Computed in float64, returned fp32.
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
    pos_P1 = torch.arange(n_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # 2i for each pair
    angle_PI = pos_P1 / torch.pow(10000.0, two_i / d_model)
    pe_PD = torch.empty(n_positions, d_model, dtype=torch.float64)
    pe_PD[:, 0::2] = torch.sin(angle_PI)
    pe_PD[:, 1::2] = torch.cos(angle_PI)
    return pe_PD.float()


class Embeddings(nn.Module):
    """Token embedding x sqrt(d_model) + positional encoding, then dropout (§3.4, §3.5, §5.4)."""

    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding) -> None:
        super().__init__()
        self.tokens = tokens  # may be shared with the other side and the output layer
        self.scale = math.sqrt(cfg.d_model)
        self.max_len = cfg.max_len
        self.learned: nn.Embedding | None = None
        if cfg.positional == "learned":
            self.learned = nn.Embedding(cfg.max_len, cfg.d_model)
        else:  # a buffer, not a parameter: rebuilt from the formula, never saved
            self.register_buffer("pe", sinusoidal_positions(cfg.max_len, cfg.d_model), False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.trace_name = "embed"

    def positions(self, start: int, length: int) -> Tensor:
        if start + length > self.max_len:
            raise ValueError(
                f"sequence of {start + length} positions is longer than max_len={self.max_len}"
            )
        if self.learned is not None:
            return self.learned.weight[start : start + length]
        return self.pe[start : start + length]

    def forward(self, ids_BT: Tensor, start: int = 0) -> Tensor:
        tok_BTD = self.tokens(ids_BT) * self.scale
        pos_TD = self.positions(start, ids_BT.size(1))
        sum_BTD = tok_BTD + pos_TD
        if _tracing():
            _tap(f"{self.trace_name}.tokens", tok_BTD)
            _tap(f"{self.trace_name}.positions", pos_TD)
            _tap(f"{self.trace_name}.sum", sum_BTD)
        return self.dropout(sum_BTD)


# --- layers and stacks (§3.1) ------------------------------------------------------------------


class EncoderLayer(nn.Module):
    """Self-attention -> FFN, each wrapped in residual + LayerNorm (§3.1, Figure 1 left).

    Post-LN (paper): x = LN(x + Dropout(Sublayer(x))). Pre-LN: x = x + Dropout(Sublayer(LN(x))).
    With `causal=True` the same block is a decoder-only (GPT-style) layer.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout)
        self.ffn = PositionwiseFFN(cfg.d_model, cfg.d_ff)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.trace_name = "layer"

    def forward(
        self,
        x_BSD: Tensor,
        keep_B11S: Tensor | None,
        *,
        causal: bool = False,
        return_attention: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        def sa(h_BSD: Tensor) -> AttentionOutput:
            return self.self_attn(
                h_BSD, h_BSD, keep_B11S, causal=causal, return_attention=return_attention
            )

        if self.norm_first:
            a = sa(self.norm1(x_BSD))
            x_BSD = _residual(x_BSD, self.dropout(a.output), f"{self.trace_name}.residual1")
            ff_BSD = self.ffn(self.norm2(x_BSD))
            x_BSD = _residual(x_BSD, self.dropout(ff_BSD), f"{self.trace_name}.residual2")
        else:
            a = sa(x_BSD)
            x_BSD = self.norm1(
                _residual(x_BSD, self.dropout(a.output), f"{self.trace_name}.residual1")
            )
            _tap(f"{self.trace_name}.norm1", x_BSD)
            ff_BSD = self.ffn(x_BSD)
            x_BSD = self.norm2(
                _residual(x_BSD, self.dropout(ff_BSD), f"{self.trace_name}.residual2")
            )
            _tap(f"{self.trace_name}.norm2", x_BSD)
        return x_BSD, a.attention


class DecoderLayer(nn.Module):
    """Masked self-attention -> cross-attention over the encoder output -> FFN (§3.1, Figure 1)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout)
        self.ffn = PositionwiseFFN(cfg.d_model, cfg.d_ff)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.trace_name = "layer"

    def _sublayer(
        self, x_BTD: Tensor, i: int, fn: Callable[[Tensor], AttentionOutput | Tensor]
    ) -> tuple[Tensor, Tensor | None]:
        """Apply sub-layer `fn` (returning AttentionOutput or a tensor) with residual + LN `i`."""
        norm = (self.norm1, self.norm2, self.norm3)[i - 1]
        name = f"{self.trace_name}.residual{i}"
        if self.norm_first:
            out = fn(norm(x_BTD))
            y, attn = (
                (out.output, out.attention) if isinstance(out, AttentionOutput) else (out, None)
            )
            return _residual(x_BTD, self.dropout(y), name), attn
        out = fn(x_BTD)
        y, attn = (out.output, out.attention) if isinstance(out, AttentionOutput) else (out, None)
        x_BTD = norm(_residual(x_BTD, self.dropout(y), name))
        _tap(f"{self.trace_name}.norm{i}", x_BTD)
        return x_BTD, attn

    def forward(
        self,
        y_BTD: Tensor,
        mem_BSD: Tensor,
        mem_keep_B11S: Tensor | None,
        *,
        return_attention: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        y_BTD, self_w = self._sublayer(
            y_BTD,
            1,
            lambda h: self.self_attn(h, h, None, causal=True, return_attention=return_attention),
        )
        y_BTD, cross_w = self._sublayer(
            y_BTD,
            2,
            lambda h: self.cross_attn(h, mem_BSD, mem_keep_B11S, return_attention=return_attention),
        )
        y_BTD, _ = self._sublayer(y_BTD, 3, self.ffn)
        return y_BTD, self_w, cross_w

    def step(
        self, y_BTD: Tensor, cache: KVCache, layer: int, mem_keep_B11S: Tensor | None
    ) -> Tensor:
        """The same layer for new positions only, reading and extending the KV cache."""

        def self_attn(h_BTD: Tensor) -> AttentionOutput:
            q_BHTK, k_BHTK, v_BHTK = self.self_attn.project_qkv(h_BTD)
            k_BHLK, v_BHLK = cache.append_self(layer, k_BHTK, v_BHTK)
            return self.self_attn.attend(q_BHTK, k_BHLK, v_BHLK, None, causal=True)

        def cross_attn(h_BTD: Tensor) -> AttentionOutput:
            q_BHTK = self.cross_attn.project_q(h_BTD)
            k_BHSK, v_BHSK = cache.cross_k[layer], cache.cross_v[layer]
            return self.cross_attn.attend(q_BHTK, k_BHSK, v_BHSK, mem_keep_B11S)

        y_BTD, _ = self._sublayer(y_BTD, 1, self_attn)
        y_BTD, _ = self._sublayer(y_BTD, 2, cross_attn)
        y_BTD, _ = self._sublayer(y_BTD, 3, self.ffn)
        return y_BTD


def _residual(x: Tensor, sub: Tensor, name: str) -> Tensor:
    out = x + sub
    _tap(name, out)
    return out


class Encoder(nn.Module):
    """N independent encoder layers; pre-LN adds a final LayerNorm (post-LN needs none)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None
        self.trace_name = "stack"

    def forward(
        self,
        x_BSD: Tensor,
        keep_B11S: Tensor | None,
        *,
        causal: bool = False,
        return_attention: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        maps = []
        for layer in self.layers:
            x_BSD, w = layer(x_BSD, keep_B11S, causal=causal, return_attention=return_attention)
            if w is not None:
                maps.append(w)
        if self.norm is not None:  # pre-LN: the final LayerNorm
            x_BSD = self.norm(x_BSD)
            _tap(f"{self.trace_name}.norm", x_BSD)
        return x_BSD, maps


class Decoder(nn.Module):
    """N independent decoder layers; pre-LN adds a final LayerNorm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None
        self.trace_name = "stack"

    def forward(
        self,
        y_BTD: Tensor,
        mem_BSD: Tensor,
        mem_keep_B11S: Tensor | None,
        *,
        return_attention: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        self_maps, cross_maps = [], []
        for layer in self.layers:
            y_BTD, sw, cw = layer(y_BTD, mem_BSD, mem_keep_B11S, return_attention=return_attention)
            if sw is not None and cw is not None:
                self_maps.append(sw)
                cross_maps.append(cw)
        if self.norm is not None:  # pre-LN: the final LayerNorm
            y_BTD = self.norm(y_BTD)
            _tap(f"{self.trace_name}.norm", y_BTD)
        return y_BTD, self_maps, cross_maps

    def step(self, y_BTD: Tensor, cache: KVCache, mem_keep_B11S: Tensor | None) -> Tensor:
        for i, layer in enumerate(self.layers):
            y_BTD = layer.step(y_BTD, cache, i, mem_keep_B11S)
        if self.norm is not None:  # pre-LN: the final LayerNorm
            y_BTD = self.norm(y_BTD)
            _tap(f"{self.trace_name}.norm", y_BTD)
        return y_BTD


# --- what the model returns and what decoding carries -------------------------------------------


@dataclass
class AttentionMaps:
    """Every attention map of one forward pass: one (B, H, T_q, T_k) tensor per layer."""

    enc_self: list[Tensor]
    dec_self: list[Tensor]
    cross: list[Tensor]


@dataclass
class Memory:
    """The encoder output and which source positions are real (not PAD)."""

    out_BSD: Tensor
    keep_BS: Tensor

    @property
    def keep_B11S(self) -> Tensor:
        return self.keep_BS[:, None, None, :]

    def index_select(self, idx_B: Tensor) -> Memory:
        return Memory(self.out_BSD.index_select(0, idx_B), self.keep_BS.index_select(0, idx_B))


@dataclass
class KVCache:
    """Per-layer keys and values for incremental decoding, batch first.

    Self-attention K/V live in buffers preallocated to `capacity` positions and are written
    in place each step (no re-allocation); `length` positions are filled. Cross-attention K/V
    of the encoder output are computed once per sentence.
    """

    self_k: list[Tensor]  # (B, H, capacity, K) per layer
    self_v: list[Tensor]
    cross_k: list[Tensor]  # (B, H, S, K) per layer
    cross_v: list[Tensor]
    length: int = 0
    spare_k: list[Tensor] | None = None  # same shapes as self_k: the target of a reorder
    spare_v: list[Tensor] | None = None

    def append_self(self, layer: int, k_BHTK: Tensor, v_BHTK: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' K/V; return views of everything so far (B, H, length+T, K)."""
        start, end = self.length, self.length + k_BHTK.size(2)
        if end > self.self_k[layer].size(2):
            raise ValueError(f"KV cache capacity {self.self_k[layer].size(2)} exceeded")
        self.self_k[layer][:, :, start:end] = k_BHTK
        self.self_v[layer][:, :, start:end] = v_BHTK
        return self.self_k[layer][:, :, :end], self.self_v[layer][:, :, :end]

    def index_select(self, idx_B: Tensor, *, cross: bool = True) -> KVCache:
        """Reorder (or select) batch rows, e.g. the surviving beams (fairseq's reorder).

        The cache it is called on must not be used afterwards: when the row count is unchanged
        (a beam reorder) the rows are gathered into a spare buffer that the two caches then
        swap, so a beam step allocates nothing (fresh large buffers each step cost page faults).
        Pass `cross=False` when rows are only permuted among beams of the same sentence: their
        cross-attention K/V are identical, so copying them would be wasted work.
        """
        same_rows = len(idx_B) == self.self_k[0].size(0)
        if same_rows and not self.self_k[0].requires_grad:  # out= cannot record gradients
            if self.spare_k is None or self.spare_v is None:
                self.spare_k = [torch.empty_like(b) for b in self.self_k]
                self.spare_v = [torch.empty_like(b) for b in self.self_v]
            for src, dst in zip(
                self.self_k + self.self_v, self.spare_k + self.spare_v, strict=True
            ):
                torch.index_select(src, 0, idx_B, out=dst)
            self_k, self_v = self.spare_k, self.spare_v
            spare_k, spare_v = self.self_k, self.self_v
        else:  # rows dropped (finished sentences), or autograd on: new buffers
            self_k = [b.index_select(0, idx_B) for b in self.self_k]
            self_v = [b.index_select(0, idx_B) for b in self.self_v]
            spare_k = spare_v = None
        keep_cross = not cross and same_rows
        return KVCache(
            self_k,
            self_v,
            self.cross_k if keep_cross else [b.index_select(0, idx_B) for b in self.cross_k],
            self.cross_v if keep_cross else [b.index_select(0, idx_B) for b in self.cross_v],
            self.length,
            spare_k,
            spare_v,
        )


# --- the model ------------------------------------------------------------------------------------


class _ModelBase(nn.Module):
    """Input checks, initialisation, trace names and the model directory, shared by all heads."""

    cfg: ModelConfig

    def _init_weights(self) -> None:
        """Xavier/Glorot for every projection, each from its own random draw (§ none; T2T/fairseq).

        Embeddings get N(0, d_model^-0.5) so that, multiplied by sqrt(d_model), they start at
        unit scale like the sinusoids (the tensor2tensor/fairseq choice for tied embeddings).
        """
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                for w in module.in_proj.weight.chunk(3, dim=0):  # W^Q, W^K, W^V separately
                    nn.init.xavier_uniform_(w)
                nn.init.zeros_(module.in_proj.bias)
            elif isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=self.cfg.d_model**-0.5)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
        # The out_proj of MultiHeadAttention is an nn.Linear and was covered above.

    def _name_for_trace(self) -> None:
        for name, module in self.named_modules():
            if hasattr(module, "trace_name") and name:
                module.trace_name = name

    def check_ids(self, ids: Tensor, what: str) -> None:
        """Raise a clear ValueError for ids that are not a (B, T) long tensor inside the vocab."""
        if ids.dim() != 2:
            raise ValueError(
                f"{what} must be a (batch, length) tensor, got shape {tuple(ids.shape)}"
            )
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{what} must hold integer token ids, got {ids.dtype}")
        if ids.size(1) > self.cfg.max_len:
            raise ValueError(
                f"{what} has length {ids.size(1)} > max_len={self.cfg.max_len} "
                f"(the positional table); shorten it or raise model.max_len"
            )
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size):
            raise ValueError(
                f"{what} holds ids in [{int(ids.min())}, {int(ids.max())}], outside the "
                f"vocabulary [0, {self.cfg.vocab_size})"
            )

    def save(self, directory: str | Path) -> None:
        """Write `config.json` + `model.safetensors` into `directory` (atomically, no pickle)."""
        from aiayn.checkpoint import save_model_dir

        save_model_dir(self, directory)

    @classmethod
    def load(cls, directory: str | Path, map_location: str = "cpu") -> _ModelBase:
        """Restore a model saved by `save`, checking that the weights fit the config."""
        from aiayn.checkpoint import load_model_dir

        model = load_model_dir(directory, map_location)
        if not isinstance(model, cls):
            from aiayn.errors import CheckpointError

            raise CheckpointError(
                f"{directory} holds a {type(model).__name__}, not a {cls.__name__}"
            )
        return model

    def extra_config(self) -> dict[str, int]:
        """Constructor arguments besides `cfg`, saved in config.json."""
        return {}


class Transformer(_ModelBase):
    """The encoder-decoder of Figure 1: `Transformer(cfg)(src_BS, tgt_in_BT) -> logits_BTV`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        src_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        tgt_tokens = (
            src_tokens
            if cfg.share_embeddings
            else nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        )
        self.src_embed = Embeddings(cfg, src_tokens)
        self.tgt_embed = Embeddings(cfg, tgt_tokens)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.generator = Linear(cfg.d_model, cfg.vocab_size, bias=False)  # pre-softmax
        self._init_weights()
        if cfg.tie_output:  # §3.4: the same matrix embeds target tokens and scores them
            self.generator.weight = tgt_tokens.weight
        self._name_for_trace()

    def encode(self, src_BS: Tensor, *, return_attention: bool = False) -> Memory:
        """Run the encoder once; decoding reuses the result for every step."""
        memory, _ = self._encode(src_BS, return_attention=return_attention)
        return memory

    def _encode(self, src_BS: Tensor, *, return_attention: bool) -> tuple[Memory, list[Tensor]]:
        self.check_ids(src_BS, "source")
        keep_BS = src_BS != self.cfg.pad_id
        x_BSD = self.src_embed(src_BS)
        out_BSD, maps = self.encoder(
            x_BSD, keep_BS[:, None, None, :], return_attention=return_attention
        )
        return Memory(out_BSD, keep_BS), maps

    def decode(
        self, tgt_in_BT: Tensor, memory: Memory, *, return_attention: bool = False
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Decoder + output layer over a target prefix: (logits_BTV, self maps, cross maps)."""
        self.check_ids(tgt_in_BT, "target")
        y_BTD = self.tgt_embed(tgt_in_BT)
        y_BTD, self_maps, cross_maps = self.decoder(
            y_BTD, memory.out_BSD, memory.keep_B11S, return_attention=return_attention
        )
        logits_BTV = self.generator(y_BTD)
        _tap("generator.logits", logits_BTV)
        return logits_BTV, self_maps, cross_maps

    def forward(
        self, src_BS: Tensor, tgt_in_BT: Tensor, *, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """Logits for every target position given the source and the shifted-right target.

        Returns `logits_BTV`, or `(logits_BTV, AttentionMaps)` with `return_attention=True`.
        """
        memory, enc_maps = self._encode(src_BS, return_attention=return_attention)
        if tgt_in_BT.size(0) != src_BS.size(0):
            raise ValueError(f"source batch {src_BS.size(0)} != target batch {tgt_in_BT.size(0)}")
        logits_BTV, self_maps, cross_maps = self.decode(
            tgt_in_BT, memory, return_attention=return_attention
        )
        if return_attention:
            return logits_BTV, AttentionMaps(enc_maps, self_maps, cross_maps)
        return logits_BTV

    # --- incremental decoding: the narrow interface search code uses ------------------------

    def init_cache(self, memory: Memory, capacity: int) -> KVCache:
        """An empty cache for up to `capacity` target positions, with cross K/V precomputed."""
        B = memory.out_BSD.size(0)
        H, K = self.cfg.n_heads, self.cfg.d_k
        like = memory.out_BSD
        self_k, self_v, cross_k, cross_v = [], [], [], []
        for layer in self.decoder.layers:
            self_k.append(like.new_empty(B, H, capacity, K))
            self_v.append(like.new_empty(B, H, capacity, K))
            k_BHSK, v_BHSK = layer.cross_attn.project_kv(memory.out_BSD)
            cross_k.append(k_BHSK.contiguous())  # read at every step: pay the layout once
            cross_v.append(v_BHSK.contiguous())
        return KVCache(self_k, self_v, cross_k, cross_v, 0)

    def decode_step(
        self, tokens_BT: Tensor, memory: Memory, cache: KVCache
    ) -> tuple[Tensor, KVCache]:
        """Logits for the next token after feeding `tokens_BT` (usually T = 1) at cache.length.

        Returns (logits_BV for the last fed position, the cache extended by T positions).
        """
        start = cache.length
        y_BTD = self.tgt_embed(tokens_BT, start=start)
        y_BTD = self.decoder.step(y_BTD, cache, memory.keep_B11S)
        cache.length = start + tokens_BT.size(1)
        logits_BV = self.generator(y_BTD[:, -1])
        return logits_BV, cache


class EncoderClassifier(_ModelBase):
    """Encoder-only variant (seed 003's conclusion): the encoder stack, mean-pooled, then a linear
    classifier over `n_classes` (BERT-style sequence classification, without pre-training)."""

    def __init__(self, cfg: ModelConfig, n_classes: int) -> None:
        super().__init__()
        if n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {n_classes}")
        self.cfg, self.n_classes = cfg, n_classes
        self.embed = Embeddings(cfg, nn.Embedding(cfg.vocab_size, cfg.d_model, cfg.pad_id))
        self.encoder = Encoder(cfg)
        self.classifier = nn.Linear(cfg.d_model, n_classes)
        self._init_weights()
        self._name_for_trace()

    def extra_config(self) -> dict[str, int]:
        return {"n_classes": self.n_classes}

    def forward(self, ids_BS: Tensor) -> Tensor:
        """Class logits (B, n_classes); the mean is over real (non-PAD) positions only."""
        self.check_ids(ids_BS, "input")
        keep_BS = ids_BS != self.cfg.pad_id
        x_BSD, _ = self.encoder(self.embed(ids_BS), keep_BS[:, None, None, :])
        keep_BS1 = keep_BS[:, :, None].to(x_BSD.dtype)
        pooled_BD = (x_BSD * keep_BS1).sum(1) / keep_BS1.sum(1).clamp(min=1.0)
        return self.classifier(pooled_BD)


class DecoderLM(_ModelBase):
    """Decoder-only causal language model (seed 003's conclusion, GPT-style): the encoder block
    with a causal mask (no cross-attention, since there is no source), tied output layer."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.embed = Embeddings(cfg, tokens)
        self.decoder = Encoder(cfg)  # EncoderLayer + causal=True is exactly a GPT block
        self.generator = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_output:
            self.generator.weight = tokens.weight
        self._name_for_trace()

    def forward(
        self, ids_BT: Tensor, *, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Next-token logits (B, T, V) at every position; position t sees tokens 0..t only."""
        self.check_ids(ids_BT, "input")
        y_BTD, maps = self.decoder(
            self.embed(ids_BT), None, causal=True, return_attention=return_attention
        )
        logits_BTV = self.generator(y_BTD)
        return (logits_BTV, maps) if return_attention else logits_BTV


MODEL_CLASSES: dict[str, type[_ModelBase]] = {
    "Transformer": Transformer,
    "EncoderClassifier": EncoderClassifier,
    "DecoderLM": DecoderLM,
}


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
