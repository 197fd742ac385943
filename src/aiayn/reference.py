"""The same forward pass in plain NumPy: literal, slow, and independent of nn/model.py.

A second implementation to test the first against, and a companion for learners: every step of
Figure 1 is a few lines of matrix arithmetic, one head at a time, in float64, in the style of
the "random transformer" worked by hand (docs/worked_example.md). It reads the weights of a torch
`Transformer` (its state dict as NumPy arrays) and shares no code with it.

    >>> weights = reference.weights_of(model)            # name -> np.ndarray
    >>> logits = reference.transformer_forward(weights, cfg, src, tgt_in)   # (B, T, V)
"""

from __future__ import annotations

import math

import numpy as np

from aiayn.config import ModelConfig

Array = np.ndarray


def weights_of(model: object) -> dict[str, Array]:
    """A torch module's state dict as float64 NumPy arrays (tied tensors appear under each name)."""
    return {k: v.detach().cpu().double().numpy() for k, v in model.state_dict().items()}  # type: ignore[attr-defined]


def softmax(x: Array) -> Array:
    """Row-wise softmax over the last axis, stable; a row of all -inf gives zeros."""
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def layer_norm(x: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """(x - mean) / sqrt(population variance + eps) * gamma + beta (Ba et al.; nn.LayerNorm)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def positional_encoding(n: int, d: int, layout: str = "interleaved") -> Array:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)) (§3.5).

    layout "halves": the sine of pair i at column i, its cosine at column d/2 + i (Marian)."""
    pe = np.zeros((n, d))
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            sin_col, cos_col = (i, d // 2 + i) if layout == "halves" else (2 * i, 2 * i + 1)
            pe[pos, sin_col] = np.sin(angle)
            pe[pos, cos_col] = np.cos(angle)
    return pe


def multi_head_attention(
    w: dict[str, Array], prefix: str, x: Array, mem: Array, keep: Array, n_heads: int
) -> Array:
    """One sequence (no batch axis): x (T, D) attends over mem (S, D); keep (T, S) bool.

    For each head i: Q_i = x W^Q_i, K_i = mem W^K_i, V_i = mem W^V_i,
    head_i = softmax(Q_i K_i^T / sqrt(d_k), masked) V_i; output = concat(heads) W^O.
    """
    d = x.shape[-1]
    d_k = d // n_heads
    w_in, b_in = w[f"{prefix}.in_proj.weight"], w[f"{prefix}.in_proj.bias"]
    w_q, w_k, w_v = w_in[:d], w_in[d : 2 * d], w_in[2 * d :]  # torch Linear stores W^T
    b_q, b_k, b_v = b_in[:d], b_in[d : 2 * d], b_in[2 * d :]
    q, k, v = x @ w_q.T + b_q, mem @ w_k.T + b_k, mem @ w_v.T + b_v
    heads = []
    for i in range(n_heads):
        cols = slice(i * d_k, (i + 1) * d_k)
        scores = q[:, cols] @ k[:, cols].T / np.sqrt(d_k)
        scores = np.where(keep, scores, -np.inf)
        heads.append(softmax(scores) @ v[:, cols])
    concat = np.concatenate(heads, axis=-1)
    return concat @ w[f"{prefix}.out_proj.weight"].T + w[f"{prefix}.out_proj.bias"]


def feed_forward(w: dict[str, Array], prefix: str, x: Array, activation: str = "relu") -> Array:
    """max(0, x W_1 + b_1) W_2 + b_2 (§3.3), or another activation in place of max(0, z)."""
    z = x @ w[f"{prefix}.w_1.weight"].T + w[f"{prefix}.w_1.bias"]
    return activate(z, activation) @ w[f"{prefix}.w_2.weight"].T + w[f"{prefix}.w_2.bias"]


def activate(z: Array, activation: str) -> Array:
    """ReLU max(0, z) (§3.3); swish z sigmoid(z); GELU z Phi(z) (exact, with erf) and GPT-2's
    tanh approximation 0.5 z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3)))."""
    if activation == "relu":
        return np.maximum(0.0, z)
    if activation == "swish":
        return z / (1.0 + np.exp(-z))
    if activation == "gelu":
        return 0.5 * z * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    if activation == "gelu_tanh":
        return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))
    raise ValueError(f"the reference has no activation {activation!r}")


def sublayer(w: dict[str, Array], norm: str, x: Array, fn: object, cfg: ModelConfig) -> Array:
    """Residual + LayerNorm around `fn`: post-LN LN(x + fn(x)), or pre-LN x + fn(LN(x))."""
    g, b = w[f"{norm}.weight"], w[f"{norm}.bias"]
    if cfg.norm_first:
        return x + fn(layer_norm(x, g, b, cfg.layer_norm_eps))  # type: ignore[operator]
    return layer_norm(x + fn(x), g, b, cfg.layer_norm_eps)  # type: ignore[operator]


def embed(w: dict[str, Array], prefix: str, ids: Array, cfg: ModelConfig) -> Array:
    """Token embedding x sqrt(d_model) (unless `scale_embeddings` is off) + positions (§3.4,
    §3.5)."""
    scale = np.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
    tokens = w[f"{prefix}.tokens.weight"][ids] * scale
    if cfg.positional == "learned":
        x = tokens + w[f"{prefix}.learned.weight"][: len(ids)]
    else:
        x = tokens + positional_encoding(len(ids), cfg.d_model, cfg.positional_layout)
    if cfg.embed_norm:  # BERT's LayerNorm over the sum
        return layer_norm(
            x, w[f"{prefix}.norm.weight"], w[f"{prefix}.norm.bias"], cfg.layer_norm_eps
        )
    return x


def encoder(
    w: dict[str, Array],
    cfg: ModelConfig,
    src: Array,
    *,
    stack: str = "encoder",
    embedding: str = "src_embed",
    causal: bool = False,
) -> Array:
    """One source sequence (S,) of ids -> (S, D); `causal`: the same stack as a decoder-only
    model's (position t sees 0..t; a `DecoderLM` names it `decoder`, its embedding `embed`)."""
    x = embed(w, embedding, src, cfg)
    S = len(src)
    keep = (
        np.tril(np.ones((S, S), dtype=bool))
        if causal
        else np.broadcast_to(src != cfg.pad_id, (S, S))
    )
    for n in range(cfg.n_layers):
        p = f"{stack}.layers.{n}"
        x = sublayer(
            w,
            f"{p}.norm1",
            x,
            lambda h, p=p: multi_head_attention(w, f"{p}.self_attn", h, h, keep, cfg.n_heads),
            cfg,
        )
        x = sublayer(
            w, f"{p}.norm2", x, lambda h, p=p: feed_forward(w, f"{p}.ffn", h, cfg.activation), cfg
        )
    if cfg.norm_first:
        x = layer_norm(x, w[f"{stack}.norm.weight"], w[f"{stack}.norm.bias"], cfg.layer_norm_eps)
    return x


def decoder(w: dict[str, Array], cfg: ModelConfig, tgt_in: Array, mem: Array, src: Array) -> Array:
    """One target prefix (T,) over the encoder output mem (S, D) -> logits (T, V)."""
    y = embed(w, "tgt_embed", tgt_in, cfg)
    T = len(tgt_in)
    causal = np.tril(np.ones((T, T), dtype=bool))  # position t sees 0..t (§3.2.3)
    cross_keep = np.broadcast_to(src != cfg.pad_id, (T, len(src)))
    for n in range(cfg.n_layers):
        p = f"decoder.layers.{n}"
        y = sublayer(
            w,
            f"{p}.norm1",
            y,
            lambda h, p=p: multi_head_attention(w, f"{p}.self_attn", h, h, causal, cfg.n_heads),
            cfg,
        )
        y = sublayer(
            w,
            f"{p}.norm2",
            y,
            lambda h, p=p: multi_head_attention(
                w, f"{p}.cross_attn", h, mem, cross_keep, cfg.n_heads
            ),
            cfg,
        )
        y = sublayer(
            w, f"{p}.norm3", y, lambda h, p=p: feed_forward(w, f"{p}.ffn", h, cfg.activation), cfg
        )
    if cfg.norm_first:
        y = layer_norm(y, w["decoder.norm.weight"], w["decoder.norm.bias"], cfg.layer_norm_eps)
    return _logits(w, cfg, y)


def _logits(w: dict[str, Array], cfg: ModelConfig, y: Array) -> Array:
    logits = y @ w["generator.weight"].T
    return logits + w["generator.bias"] if cfg.logits_bias else logits


def lm_forward(w: dict[str, Array], cfg: ModelConfig, ids_BT: Array) -> Array:
    """A decoder-only model's (`DecoderLM`) logits (B, T, V), one sequence at a time."""
    out = []
    for ids in np.asarray(ids_BT):
        y = encoder(w, cfg, ids, stack="decoder", embedding="embed", causal=True)
        out.append(_logits(w, cfg, y))
    return np.stack(out)


def classifier_forward(w: dict[str, Array], cfg: ModelConfig, ids_BS: Array) -> Array:
    """An encoder-only classifier's (`EncoderClassifier`) logits (B, C), one text at a time:
    its real tokens only (no padding), pooled at the first position or by their mean."""
    out = []
    for ids in np.asarray(ids_BS):
        ids = ids[: int(np.flatnonzero(ids != cfg.pad_id).max()) + 1]
        x = encoder(w, cfg, ids, embedding="embed")
        pooled = x[0] if cfg.pooling == "cls" else x.mean(0)
        if cfg.pooler:
            pooled = np.tanh(pooled @ w["pooler.weight"].T + w["pooler.bias"])
        out.append(pooled @ w["classifier.weight"].T + w["classifier.bias"])
    return np.stack(out)


def transformer_forward(
    w: dict[str, Array], cfg: ModelConfig, src_BS: Array, tgt_in_BT: Array
) -> Array:
    """Logits (B, T, V) for a batch, one sentence at a time."""
    out = []
    for src, tgt in zip(np.asarray(src_BS), np.asarray(tgt_in_BT), strict=True):
        out.append(decoder(w, cfg, tgt, encoder(w, cfg, src), src))
    return np.stack(out)
