"""The encoder without its padding: the same function as `Encoder.forward`, less work on a CPU.

A batch of sentences is right-padded to its longest, and the paper's encoder computes every
padded position too (then masks it). Every product of an encoder layer except attention is
position-wise (W^Q W^K W^V, W^O, the FFN, the residuals and LayerNorms), so here those run on
the real positions only, gathered into one (N, D) matrix; attention alone sees the padded
layout. A real position gets the same bits as in the padded forward (each product gives a
row the bits it gets in any batch), padding gets zeros. A batch in arrival order, as a server
admits it, is ~20-40% padding: its projections and FFN were most of what that padding cost.

Only `Transformer.encode` calls this, and only when `skips_padding` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.attention import MultiHeadAttention, fused_attention
from aiayn.nn.norms import Norm
from aiayn.nn.tracing import is_tracing


# What this module reads of `aiayn.nn.model`'s Encoder and EncoderLayer (which import it).
class _Encoder(Protocol):
    layers: nn.ModuleList
    norm: Norm | None


class _EncoderLayer(Protocol):
    self_attn: MultiHeadAttention
    ffn: nn.Module

    def sublayer(self, x_BTD: Tensor, i: int, fn: Callable[[Tensor], Tensor]) -> Tensor: ...


def skips_padding(model: nn.Module, keep_BS: Tensor) -> bool:
    """Whether `encode` takes `encode_packed`: inference on a CPU (on a GPU the indices would
    cost a wait for the device, and padding costs little there), untraced (the glass box
    records the paper's padded tensors), only if there is padding, and only for the paper's
    self-attention (`_self_attention` computes just that one)."""
    cfg: ModelConfig = model.cfg  # type: ignore[assignment]  # the models' own attribute
    paper_attention = (
        cfg.positional in ("sinusoidal", "learned")
        and cfg.n_kv_heads == cfg.n_heads
        and not cfg.qk_norm
        and not cfg.attn_window
    )
    return (
        paper_attention
        and not model.training
        and not torch.is_grad_enabled()
        and keep_BS.device.type == "cpu"
        and not is_tracing()
        and not bool(keep_BS.all())
    )


def encode_packed(encoder: _Encoder, x_BSD: Tensor, keep_BS: Tensor) -> Tensor:
    """`encoder(x_BSD, keep)` (inference, no causal mask) with every position-wise product on
    the real positions only; zeros at padding."""
    B, S, D = x_BSD.shape
    at_N = keep_BS.reshape(-1).nonzero().squeeze(1)  # the real positions, flattened
    x_ND = x_BSD.reshape(B * S, D).index_select(0, at_N)
    keep_B11S = keep_BS[:, None, None, :]
    layer: _EncoderLayer
    for layer in encoder.layers:  # type: ignore[assignment]  # ModuleList items
        x_ND = _layer_packed(layer, x_ND, at_N, keep_B11S)
    if encoder.norm is not None:
        x_ND = encoder.norm(x_ND)
    return x_ND.new_zeros(B * S, D).index_copy_(0, at_N, x_ND).view(B, S, D)


def _layer_packed(layer: _EncoderLayer, x_ND: Tensor, at_N: Tensor, keep_B11S: Tensor) -> Tensor:
    """`layer.forward` on the real positions only: the residuals, LayerNorms and FFN are
    position-wise, so they need no padding."""
    x_ND = layer.sublayer(x_ND, 1, lambda h: _self_attention(layer.self_attn, h, at_N, keep_B11S))
    return layer.sublayer(x_ND, 2, layer.ffn)


def _self_attention(
    attn: MultiHeadAttention, x_ND: Tensor, at_N: Tensor, keep_B11S: Tensor
) -> Tensor:
    """Self-attention over the real positions of a padded batch: x_ND holds them in row-major
    order, `at_N` their indices in the flattened (B, S) layout. W^Q W^K W^V and W^O run on
    those rows; the heads attend in the padded layout, as `MultiHeadAttention.attend` does, so
    a real position gets the same bits."""
    B, S, D = keep_B11S.size(0), keep_B11S.size(-1), attn.d_model
    qkv_N3D = attn.in_proj(x_ND)
    # Padding gets zeros: a masked key must be finite (its weight 0 times its value), and
    # what padded queries compute is dropped below.
    qkv_BS3D = qkv_N3D.new_zeros(B * S, 3 * D).index_copy_(0, at_N, qkv_N3D).view(B, S, -1)
    q_BSD, k_BSD, v_BSD = qkv_BS3D.split(D, dim=-1)
    q_BHSK, k_BHSK, v_BHSK = map(attn.split_heads, (q_BSD, k_BSD, v_BSD))
    heads_BHSK = fused_attention(q_BHSK, k_BHSK, v_BHSK, keep_B11S)  # as `attend` calls it
    concat_ND = heads_BHSK.transpose(1, 2).reshape(B * S, D).index_select(0, at_N)
    return attn.out_proj(concat_ND)
