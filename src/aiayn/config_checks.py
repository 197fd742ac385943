"""The checks of a `ModelConfig`'s values, each a one-line message (ModelConfig raises the
first at construction). Here, not beside the fields, only because they are many; a foundation
below `aiayn.config`, importing nothing of aiayn.
"""

from __future__ import annotations

from typing import Any

CHOICES: dict[str, tuple[str, ...]] = {
    "positional": ("sinusoidal", "learned", "rope", "alibi", "none"),
    "norm": ("layernorm", "rmsnorm"),
    "activation": ("relu", "swish", "gelu", "gelu_tanh", "relu2", "swiglu", "geglu"),
    "pooling": ("mean", "cls"),
    "init": ("xavier", "normal"),
    "positional_layout": ("interleaved", "halves"),
}


def _choose(options: tuple[str, ...]) -> str:
    quoted = [repr(o) for o in options]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


def model_problems(cfg: Any) -> list[str]:
    """Every value of `cfg` (a ModelConfig: not imported, since it imports this) that no model
    can be built from, as one-line messages."""
    problems = [
        f"{name}={getattr(cfg, name)!r}: choose {_choose(options)}"
        for name, options in CHOICES.items()
        if getattr(cfg, name) not in options
    ]
    heads = max(cfg.n_heads, 1)
    checks = [
        (cfg.vocab_size > 0, "vocab_size must be positive"),
        (cfg.d_model > 0 and cfg.n_heads > 0, "d_model and n_heads must be positive"),
        (
            cfg.d_model % heads == 0,
            f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}",
        ),
        (cfg.n_layers >= 1, "n_layers must be at least 1"),
        (cfg.d_ff > 0, "d_ff must be positive"),
        (0.0 <= cfg.dropout < 1.0, f"dropout={cfg.dropout} must be in [0, 1)"),
        (0.0 <= cfg.attn_dropout < 1.0, f"attn_dropout={cfg.attn_dropout} not in [0, 1)"),
        (cfg.max_len >= 2, "max_len must be at least 2"),
        (
            cfg.positional != "sinusoidal" or cfg.d_model % 2 == 0,
            "sinusoidal positions need an even d_model",
        ),
        (
            cfg.positional != "rope" or (cfg.d_model // heads) % 2 == 0,
            f"positional='rope' turns pairs of a head's dimensions: the head size "
            f"d_model / n_heads = {cfg.d_model // heads} must be even",
        ),
        (cfg.rope_base > 1.0, f"rope_base={cfg.rope_base} must be greater than 1"),
        (
            cfg.positional_layout == "interleaved" or cfg.positional == "sinusoidal",
            f"positional_layout={cfg.positional_layout!r} orders a sinusoidal table; "
            f"positional={cfg.positional!r} has none",
        ),
        (
            0 <= cfg.kv_heads <= cfg.n_heads and (cfg.kv_heads == 0 or heads % cfg.kv_heads == 0),
            f"kv_heads={cfg.kv_heads} must divide n_heads={cfg.n_heads} "
            f"(1 = multi-query, n_heads or 0 = one K/V head per query head)",
        ),
        (
            cfg.attn_window >= 0,
            f"attn_window={cfg.attn_window}: a window holds at least 1 position (0 = none)",
        ),
        (cfg.layer_norm_eps > 0, f"layer_norm_eps={cfg.layer_norm_eps} must be positive"),
        (
            all(0 <= i < cfg.vocab_size for i in (cfg.pad_id, cfg.bos_id, cfg.eos_id)),
            f"special ids pad/bos/eos={cfg.pad_id}/{cfg.bos_id}/{cfg.eos_id} "
            f"must lie in [0, vocab_size={cfg.vocab_size})",
        ),
    ]
    return problems + [message for ok, message in checks if not ok]
