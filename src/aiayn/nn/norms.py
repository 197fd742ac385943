"""The normalisation every sub-layer is wrapped with: `ModelConfig.norm` picks it.

    "layernorm"  (x - mean) / sqrt(var + eps) * gamma + beta      the paper's (Ba et al., 2016)
    "rmsnorm"    x / sqrt(mean(x^2) + eps) * gamma                 Zhang & Sennrich, 2019; LLaMA

RMSNorm drops the mean and the bias: one reduction instead of two, and (their paper) the
re-centring was not what made LayerNorm work.
"""

from __future__ import annotations

from torch import nn

from aiayn.config import ModelConfig

Norm = nn.LayerNorm | nn.RMSNorm


def make_norm(cfg: ModelConfig, dim: int | None = None) -> Norm:
    """The norm `cfg.norm` names over the last `dim` features (d_model by default)."""
    size = cfg.d_model if dim is None else dim
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(size, eps=cfg.layer_norm_eps)
    return nn.LayerNorm(size, eps=cfg.layer_norm_eps)
