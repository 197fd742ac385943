"""What the glass box says about a model built with switches after the paper (ModelConfig's
positional, norm, activation, bias, kv_heads, attn_window, qk_norm).

- `differs(cfg)`: the architecture line's words, e.g. "RoPE, RMSNorm, SwiGLU, GQA 8->2,
  window 256" ("" for the paper's model);
- `switch_description(leaf, attn, config)`: the one-line meaning of an intermediate in a
  model with those switches: the new ones (`q_raw`, `rope_cos`, `band_mask`, `alibi_bias`,
  `ffn.gate`...) and the paper's that read differently under them (an RMSNorm model's norm1
  is no LayerNorm; ALiBi's scaled scores carry its bias; K with fewer heads than Q is shared);
- `kv_note` and `ring_labels`: what one per-head entry adds (which query heads share a K/V
  head; which position each slot of a window's ring cache holds).

`config` is the summary the glass box files with every trace (`summary(cfg)`), so a JSON
trace read back says the same as the live one.
"""

from __future__ import annotations

from aiayn.config import GATED, ModelConfig

ACTIVATION_NAMES = {"swiglu": "SwiGLU", "geglu": "GeGLU", "relu2": "ReLU²"}
POSITION_NAMES = {
    "learned": "learned positions",
    "rope": "RoPE",
    "alibi": "ALiBi",
    "none": "no positions (NoPE)",
}
# Where the positions act when the embeddings add none (the embeddings section says so).
POSITIONS_ACT = {
    "rope": "no positions are added here (RoPE, Su et al. 2021): each self-attention head's "
    "q and k are turned by angles set by their position (rope_cos, rope_sin)",
    "alibi": "no positions are added here (ALiBi, Press et al. 2022): each self-attention "
    "head's scores get a penalty -m_h x distance (alibi_bias)",
    "none": "no positions anywhere (NoPE): only the causal mask tells positions apart",
}


def summary(cfg: ModelConfig) -> dict[str, object]:
    """The switches' part of a trace's config (beside d_model, n_heads, norm, positional...)."""
    return {
        "norm_type": cfg.norm,
        "activation": cfg.activation,
        "d_hidden": cfg.d_hidden,
        "kv_heads": cfg.n_kv_heads,
        "attn_window": cfg.attn_window,
        "qk_norm": cfg.qk_norm,
        "bias": cfg.bias,
        "rope_base": cfg.rope_base,
    }


def differs(cfg: ModelConfig) -> list[str]:
    """Where the model differs from the paper, in the order a reader meets it (an imported
    Marian model: its FFN, its sinusoids' layout, the logits' bias)."""
    H, J = cfg.n_heads, cfg.n_kv_heads
    rope = "RoPE" if cfg.rope_base == 10000.0 else f"RoPE (base {cfg.rope_base:g})"
    act = ACTIVATION_NAMES.get(cfg.activation, f"{cfg.activation} FFN")
    options = [
        (cfg.positional != "sinusoidal", rope if cfg.positional == "rope" else
         POSITION_NAMES.get(cfg.positional, "")),
        (cfg.norm == "rmsnorm", "RMSNorm"),
        (cfg.activation != "relu", act),
        (cfg.positional_layout == "halves" and cfg.positional in ("sinusoidal", "learned"),
         "sines then cosines (halves)"),
        (cfg.logits_bias, "bias on the logits"),
        (cfg.d_hidden != cfg.d_ff, f"FFN width {cfg.d_hidden}"),
        (J < H, f"MQA {H}->1" if J == 1 else f"GQA {H}->{J}"),
        (cfg.attn_window > 0, f"window {cfg.attn_window}"),
        (cfg.qk_norm, "QK-norm"),
        (not cfg.bias, "no biases"),
    ]  # fmt: skip
    return [text for differ, text in options if differ]


def architecture(config: dict[str, object]) -> str:
    """The architecture line's tail: "post-LN (paper), sinusoidal positions" for the paper's
    model; with switches, "...; differs from the paper: RoPE, RMSNorm, SwiGLU, GQA 8->2"."""
    pos = config.get("positional")
    parts = [str(config.get("norm"))]
    parts += [f"{pos} positions"] if pos == "sinusoidal" else []
    diff = config.get("differs")
    return ", ".join(parts) + (f"; differs from the paper: {diff}" if diff else "")


def norm_name(config: dict[str, object]) -> str:
    return "RMSNorm" if config.get("norm_type") == "rmsnorm" else "LayerNorm"


def _norm_words(config: dict[str, object]) -> str:
    if config.get("norm_type") == "rmsnorm":
        return "RMSNorm (x / rms(x) x g: no mean subtracted, no bias; Zhang & Sennrich 2019)"
    return "LayerNorm"


def switch_description(leaf: str, attn: str | None, config: dict[str, object]) -> str | None:
    """The meaning of `leaf` (a stable name's last part: "q", "ffn.gate", "embed.tokens",
    "norm2"...; `attn`: self_attn | cross_attn | None) under `config`'s switches; None when the
    paper's description holds."""
    self_attn = attn == "self_attn"
    pos, act = config.get("positional"), str(config.get("activation", "relu"))
    b = "" if config.get("bias", True) is False else " + b"
    qk_norm, window = bool(config.get("qk_norm")), int(config.get("attn_window") or 0)  # type: ignore[call-overload]
    H, J = config.get("n_heads"), config.get("kv_heads") or config.get("n_heads")
    gate = "swish" if act == "swiglu" else "gelu"
    text = {
        "q_raw": f"Q = x W^Q_h before QK-norm: `q` is this normalised by a {norm_name(config)} "
        "of size d_k (qk_norm; OLMo 2, Qwen3)",
        "k_raw": f"K = m W^K before QK-norm: `k` is this normalised by a {norm_name(config)} "
        "of size d_k (qk_norm; OLMo 2, Qwen3)",
        "q_unrotated": "Q before RoPE (RoFormer, Su et al. 2021): `q` is this turned by the "
        "angles of its position (rope_cos, rope_sin)",
        "k_unrotated": "K before RoPE (RoFormer): `k` is this turned by the angles of its "
        "position, so Q K^T depends on the distance between query and key",
        "rope_cos": "RoPE: cos(pos x base^(-2i/d_k)) per position (rows) and dimension pair i "
        "(halves layout: pair i at dims i and i + d_k/2; LLaMA's rotate_half)",
        "rope_sin": "RoPE: sin of the same angles; rotated = x cos + rotate_half(x) sin",
        "band_mask": f"local attention's window (attn_window = {window or 'W'}): 1 where query "
        "i may see key j (causal: 0 <= i - j < W; encoder: |i - j| <= W // 2; Longformer, Mistral)",
        "alibi_bias": "ALiBi (Press et al. 2022): -m_h x distance (i - j), added to this "
        "head's scaled scores in place of positional encodings",
        "ffn.gate": f"{ACTIVATION_NAMES.get(act, act)}'s gate {gate}(x W_1{b}) (Shazeer 2020, "
        "GLU variants; LLaMA's w1)",
        "ffn.up": f"x W_3{b}: the gated FFN's second projection (LLaMA's w3), times the gate",
    }.get(leaf)
    if text is not None:
        return text
    if leaf in ("q", "k") and self_attn and (pos == "rope" or qk_norm):
        what = "Q = x W^Q_h" if leaf == "q" else "K = x W^K"
        steps = (["normalised (QK-norm)"] if qk_norm else []) + (
            ["rotated by RoPE (the angles of its position)"] if pos == "rope" else []
        )
        shared = " (shared K/V head)" if leaf == "k" and J != H else ""
        return f"{what}{shared}, {', then '.join(steps)}: what meets the other side in Q K^T"
    if leaf in ("k", "v") and J != H:
        sym = "K = m W^K" if leaf == "k" else "V = m W^V"
        return f"{sym} of a shared K/V head (grouped-query attention, Ainslie et al. 2023)"
    if leaf in ("q", "k") and qk_norm:  # cross-attention with QK-norm
        return f"{'Q = x W^Q_h' if leaf == 'q' else 'K = m W^K'}, normalised (QK-norm)"
    if leaf == "scores_scaled" and self_attn and pos == "alibi":
        return "Q K^T / sqrt(d_k) + this head's ALiBi bias (alibi_bias): distance lowers a score"
    if leaf == "scores_masked" and self_attn and window:
        return (
            "scaled scores with hidden keys set to -inf (padding, the future, and keys "
            f"outside the window of {window})"
        )
    if leaf.startswith("norm") and leaf[4:].isdigit() and config.get("norm_type") == "rmsnorm":
        return f"{_norm_words(config)} of x + Sublayer(x), after sub-layer {leaf[4:]}"
    if leaf == "embed.norm" and config.get("norm_type") == "rmsnorm":
        return f"{_norm_words(config)} of the embeddings (cfg.embed_norm): the input of layer 0"
    if leaf == "norm" and config.get("norm_type") == "rmsnorm":
        return f"the final {_norm_words(config)} of a pre-LN stack (LLaMA's norm)"
    if leaf == "ffn.hidden" and act in GATED:
        return "gate x up (elementwise): the gated FFN's hidden layer, then W_2 (LLaMA's w2)"
    if leaf == "ffn.hidden" and act == "relu2":
        return f"relu(x W_1{b})^2: squared ReLU (Primer, So et al. 2021), the FFN's hidden layer"
    if leaf == "ffn.hidden" and act != "relu":
        return f"{act}(x W_1{b}): FFN hidden layer after its activation (the paper's: ReLU)"
    if leaf in ("ffn.output", "attn_output") and not b:
        if leaf == "ffn.output":
            return "hidden W_2: FFN output (no bias)"
        return "Concat(heads) W^O: the attention sub-layer's output (no bias)"
    if leaf == "embed.tokens" and pos in POSITIONS_ACT:
        return f"token embedding x sqrt(d_model) (§3.4); {POSITIONS_ACT[str(pos)]}"
    if leaf == "embed.positions" and pos == "learned":
        return "learned position embedding (a trained table, as GPT and BERT; the paper: §3.5)"
    return None


def kv_note(h: int, n_heads: int, n_kv: int) -> str:
    """Which K/V head query head h (from 1) reads, and who shares it (grouped-query)."""
    g = n_heads // n_kv
    j = (h - 1) // g + 1
    return (
        f"{n_kv} shared K/V heads, each read by {g} query heads: query head {h} reads K/V "
        f"head {j} (query heads {(j - 1) * g + 1}..{j * g})"
    )


def ring_positions(t: int, window: int, slots: int) -> list[int]:
    """The position each slot of a window's ring cache holds at decoding step t (the query at
    position t): slot s holds t - (t - s) mod W (KVCache's layout); < 0: not written yet."""
    return [t - (t - s) % window for s in range(slots)]


def ring_labels(t: int, window: int, slots: int, pieces: list[str]) -> list[str]:
    """Labels of a ring cache's slots at step t: "pos:piece"; "-" for a slot not written yet."""
    cols = ring_positions(t, window, slots)
    return [f"{c}:{pieces[c]}" if 0 <= c < len(pieces) else "-" for c in cols]
