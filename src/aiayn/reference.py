"""The same forward pass in plain NumPy: literal, slow, and independent of nn/model.py.

A second implementation to test the first against, and a companion for learners: every step of
Figure 1 is a few lines of matrix arithmetic, one head at a time, in float64, in the style of
the "random transformer" worked by hand (docs/worked_example.md). It reads the weights of a torch
`Transformer` (its state dict as NumPy arrays) and shares no code with it.

    >>> weights = reference.weights_of(model)            # name -> np.ndarray
    >>> logits = reference.transformer_forward(weights, cfg, src, tgt_in)   # (B, T, V)

Beside the paper's blocks, it computes every later switch of `ModelConfig`, each where it acts:
positions "rope" (`rope`: Q and K of self-attention turned by their position), "alibi"
(`alibi_slopes`: each head's scores less m_h times the distance) or "none"; norm "rmsnorm"
(`rms_norm`); activations "relu2", "swiglu" and "geglu" (a third matrix W_3 gates the FFN);
bias=False (the state dict holds no bias: it counts as 0); kv_heads (query head h reads K/V
head h // (H / J)); attn_window (`self_attention_keep`: a band of positions); qk_norm (each
head's Q and K normalised before RoPE).
"""

from __future__ import annotations

import math

import numpy as np

from aiayn.config import ModelConfig

Array = np.ndarray


def weights_of(model: object) -> dict[str, Array]:
    """A torch module's state dict as float64 NumPy arrays (tied tensors appear under each name)."""
    return {k: v.detach().cpu().double().numpy() for k, v in model.state_dict().items()}  # type: ignore[attr-defined]


def linear(w: dict[str, Array], prefix: str, x: Array, rows: slice = slice(None)) -> Array:
    """x W^T + b for the torch Linear `prefix` (its `rows` of outputs); no bias stored = none."""
    y = x @ w[f"{prefix}.weight"][rows].T
    bias = w.get(f"{prefix}.bias")  # bias=False (LLaMA): the state dict has no such tensor
    return y if bias is None else y + bias[rows]


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


def rms_norm(x: Array, gamma: Array, eps: float) -> Array:
    """x / sqrt(mean(x^2) + eps) * gamma (Zhang & Sennrich; LLaMA): no mean taken, no beta."""
    return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps) * gamma


def norm(w: dict[str, Array], prefix: str, x: Array, cfg: ModelConfig) -> Array:
    """The norm `cfg.norm` names, with the weights stored under `prefix`."""
    if cfg.norm == "rmsnorm":
        return rms_norm(x, w[f"{prefix}.weight"], cfg.layer_norm_eps)
    return layer_norm(x, w[f"{prefix}.weight"], w[f"{prefix}.bias"], cfg.layer_norm_eps)


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


def rope(x: Array, base: float) -> Array:
    """RoPE (Su et al.) on one head's rows x (T, d_k), row t at position t: the pair of
    dimensions (i, d_k/2 + i) turns by the angle t / base^(2i/d_k), as a point in the plane
    (LLaMA's "halves" layout). Then q_t . k_s depends on t - s only."""
    T, d_k = x.shape
    half = d_k // 2
    out = x.copy()
    for i in range(half):
        angle = np.arange(T) / base ** (2 * i / d_k)
        a, b = x[:, i], x[:, half + i]
        out[:, i] = a * np.cos(angle) - b * np.sin(angle)
        out[:, half + i] = b * np.cos(angle) + a * np.sin(angle)
    return out


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi's slope m_h per head (Press et al., §3): for n heads, n a power of 2, the
    geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise the n' = largest power of 2
    below n get those of n', and the other n - n' heads the 1st, 3rd, 5th, ... of 2n' heads'."""
    below = 2 ** int(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * h / below) for h in range(1, below + 1)]
    odd = [2.0 ** (-8.0 * h / (2 * below)) for h in range(1, 2 * below, 2)]
    return slopes + odd[: n_heads - below]


def self_attention_keep(cfg: ModelConfig, real: Array, causal: bool) -> Array:
    """(S, S) bool, True = query i may see key j: the real keys (`real`, (S,) bool), or those at
    or before i when `causal`; with `attn_window` W, only those in the band (causal:
    0 <= i - j < W; two-sided: |i - j| <= W // 2), and always i itself."""
    S = len(real)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    keep = i >= j if causal else np.broadcast_to(real, (S, S))
    W = cfg.attn_window
    if W:
        band = (i - j >= 0) & (i - j < W) if causal else np.abs(i - j) <= W // 2
        keep = (keep & band) | (i == j)
    return keep


def multi_head_attention(
    w: dict[str, Array],
    prefix: str,
    x: Array,
    mem: Array,
    keep: Array,
    cfg: ModelConfig,
    *,
    self_attention: bool = False,
    causal: bool = False,
) -> Array:
    """One sequence (no batch axis): x (T, D) attends over mem (S, D); keep (T, S) bool.

    For each head h: Q_h = x W^Q_h, K_h = mem W^K_j, V_h = mem W^V_j, where j = h // (H / J)
    (J K/V heads, `kv_heads`: each shared by H / J query heads; J = H in the paper);
    head_h = softmax(Q_h K_h^T / sqrt(d_k) + bias, masked) V_h; output = concat(heads) W^O.
    `qk_norm` normalises Q_h and K_h first. In `self_attention`, RoPE turns Q_h and K_h, and
    ALiBi's bias is -m_h |i - j| (`causal`: -m_h (i - j); the future is masked anyway).
    """
    H, J, d_k, D = cfg.n_heads, cfg.n_kv_heads, cfg.d_k, cfg.d_model
    # in_proj's rows: [W^Q (D rows); W^K (J d_k rows); W^V (J d_k rows)] (torch stores W^T)
    q = linear(w, f"{prefix}.in_proj", x, slice(0, D))
    k = linear(w, f"{prefix}.in_proj", mem, slice(D, D + J * d_k))
    v = linear(w, f"{prefix}.in_proj", mem, slice(D + J * d_k, D + 2 * J * d_k))
    T, S = len(x), len(mem)
    distance = np.arange(T)[:, None] - np.arange(S)[None, :]  # i - j: > 0, the key is past
    slopes = alibi_slopes(H)
    heads = []
    for h in range(H):
        j = h // (H // J)  # the K/V head this query head reads
        q_h, k_h = q[:, h * d_k : (h + 1) * d_k], k[:, j * d_k : (j + 1) * d_k]
        v_h = v[:, j * d_k : (j + 1) * d_k]
        if cfg.qk_norm:
            q_h, k_h = norm(w, f"{prefix}.q_norm", q_h, cfg), norm(w, f"{prefix}.k_norm", k_h, cfg)
        if self_attention and cfg.positional == "rope":
            q_h, k_h = rope(q_h, cfg.rope_base), rope(k_h, cfg.rope_base)
        scores = q_h @ k_h.T / np.sqrt(d_k)
        if self_attention and cfg.positional == "alibi":
            scores = scores - slopes[h] * (distance if causal else np.abs(distance))
        scores = np.where(keep, scores, -np.inf)
        heads.append(softmax(scores) @ v_h)
    concat = np.concatenate(heads, axis=-1)
    return linear(w, f"{prefix}.out_proj", concat)


def feed_forward(w: dict[str, Array], prefix: str, x: Array, activation: str = "relu") -> Array:
    """max(0, x W_1 + b_1) W_2 + b_2 (§3.3), or another activation in place of max(0, z).

    Gated (Shazeer 2020): (act(x W_1 + b_1) * (x W_3 + b_3)) W_2 + b_2, act = swish for
    "swiglu", GELU for "geglu". The hidden width is W_1's rows (2/3 d_ff with ffn_match_params).
    """
    z = linear(w, f"{prefix}.w_1", x)
    if activation in ("swiglu", "geglu"):
        gate = activate(z, "swish" if activation == "swiglu" else "gelu")
        hidden = gate * linear(w, f"{prefix}.w_3", x)
    else:
        hidden = activate(z, activation)
    return linear(w, f"{prefix}.w_2", hidden)


def activate(z: Array, activation: str) -> Array:
    """ReLU max(0, z) (§3.3); its square max(0, z)^2 (So et al., Primer); swish z sigmoid(z);
    GELU z Phi(z) (exact, with erf) and GPT-2's tanh approximation
    0.5 z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3)))."""
    if activation == "relu":
        return np.maximum(0.0, z)
    if activation == "relu2":
        return np.maximum(0.0, z) ** 2
    if activation == "swish":
        return z / (1.0 + np.exp(-z))
    if activation == "gelu":
        return 0.5 * z * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    if activation == "gelu_tanh":
        return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))
    raise ValueError(f"the reference has no activation {activation!r}")


def sublayer(w: dict[str, Array], prefix: str, x: Array, fn: object, cfg: ModelConfig) -> Array:
    """Residual + norm around `fn`: post-LN norm(x + fn(x)), or pre-LN x + fn(norm(x))."""
    if cfg.norm_first:
        return x + fn(norm(w, prefix, x, cfg))  # type: ignore[operator]
    return norm(w, prefix, x + fn(x), cfg)  # type: ignore[operator]


def embed(w: dict[str, Array], prefix: str, ids: Array, cfg: ModelConfig) -> Array:
    """Token embedding x sqrt(d_model) (unless `scale_embeddings` is off) + positions (§3.4,
    §3.5); "rope", "alibi" and "none" add none here (the first two act in attention)."""
    scale = np.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
    x = w[f"{prefix}.tokens.weight"][ids] * scale
    if cfg.positional == "learned":
        x = x + w[f"{prefix}.learned.weight"][: len(ids)]
    elif cfg.positional == "sinusoidal":
        x = x + positional_encoding(len(ids), cfg.d_model, cfg.positional_layout)
    if cfg.embed_norm:  # BERT's LayerNorm over the sum
        return norm(w, f"{prefix}.norm", x, cfg)
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
    keep = self_attention_keep(cfg, src != cfg.pad_id, causal)
    for n in range(cfg.n_layers):
        p = f"{stack}.layers.{n}"
        x = sublayer(
            w,
            f"{p}.norm1",
            x,
            lambda h, p=p: multi_head_attention(
                w, f"{p}.self_attn", h, h, keep, cfg, self_attention=True, causal=causal
            ),
            cfg,
        )
        x = sublayer(
            w, f"{p}.norm2", x, lambda h, p=p: feed_forward(w, f"{p}.ffn", h, cfg.activation), cfg
        )
    if cfg.norm_first:
        x = norm(w, f"{stack}.norm", x, cfg)
    return x


def decoder(w: dict[str, Array], cfg: ModelConfig, tgt_in: Array, mem: Array, src: Array) -> Array:
    """One target prefix (T,) over the encoder output mem (S, D) -> logits (T, V)."""
    y = embed(w, "tgt_embed", tgt_in, cfg)
    T = len(tgt_in)
    # position t sees 0..t (§3.2.3), within the window if there is one
    causal = self_attention_keep(cfg, np.ones(T, dtype=bool), causal=True)
    cross_keep = np.broadcast_to(src != cfg.pad_id, (T, len(src)))
    for n in range(cfg.n_layers):
        p = f"decoder.layers.{n}"
        y = sublayer(
            w,
            f"{p}.norm1",
            y,
            lambda h, p=p: multi_head_attention(
                w, f"{p}.self_attn", h, h, causal, cfg, self_attention=True, causal=True
            ),
            cfg,
        )
        y = sublayer(
            w,
            f"{p}.norm2",
            y,
            lambda h, p=p: multi_head_attention(w, f"{p}.cross_attn", h, mem, cross_keep, cfg),
            cfg,
        )
        y = sublayer(
            w, f"{p}.norm3", y, lambda h, p=p: feed_forward(w, f"{p}.ffn", h, cfg.activation), cfg
        )
    if cfg.norm_first:
        y = norm(w, "decoder.norm", y, cfg)
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
            pooled = np.tanh(linear(w, "pooler", pooled))
        out.append(linear(w, "classifier", pooled))
    return np.stack(out)


def transformer_forward(
    w: dict[str, Array], cfg: ModelConfig, src_BS: Array, tgt_in_BT: Array
) -> Array:
    """Logits (B, T, V) for a batch, one sentence at a time."""
    out = []
    for src, tgt in zip(np.asarray(src_BS), np.asarray(tgt_in_BT), strict=True):
        out.append(decoder(w, cfg, tgt, encoder(w, cfg, src), src))
    return np.stack(out)
