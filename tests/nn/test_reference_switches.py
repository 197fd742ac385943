"""Every ModelConfig switch after the paper, alone and combined, in all three architectures
(Transformer, DecoderLM, EncoderClassifier), against the NumPy reference (`aiayn.reference`,
float64, one head at a time, no code shared with aiayn.nn).

Tolerance: rtol = atol = 1e-5, torch in fp32 against NumPy in float64. Each case runs two
right-padded batches: a long one (12 positions, more than twice the window, so torch attends
block by block, `aiayn.nn.local_attention`) and a short one (6 positions: the dense band mask).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from aiayn import reference
from aiayn.config import ModelConfig
from aiayn.nn import attention as attention_module
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.nn.model import Transformer
from aiayn.nn.variants import DecoderLM

TOL = dict(rtol=1e-5, atol=1e-5)  # fp32 torch against float64 NumPy
LONG, SHORT = 12, 6  # > 2 * window (blocked local attention) and <= 2 * window (dense band)

BASE = ModelConfig(
    vocab_size=40, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=64
)

SWITCHES: dict[str, dict[str, Any]] = {
    "rope": dict(positional="rope", rope_base=100.0),  # a base that turns every pair visibly
    "rope_default_base": dict(positional="rope"),
    "alibi": dict(positional="alibi"),
    "none": dict(positional="none"),
    "rmsnorm": dict(norm="rmsnorm"),
    "rmsnorm_pre_ln": dict(norm="rmsnorm", norm_first=True),
    "relu2": dict(activation="relu2"),
    "swiglu": dict(activation="swiglu"),
    "swiglu_matched": dict(activation="swiglu", ffn_match_params=True),  # hidden 43, not 64
    "geglu": dict(activation="geglu"),
    "no_bias": dict(bias=False),
    "kv_heads_2": dict(kv_heads=2),
    "multi_query": dict(kv_heads=1),
    "window_4": dict(attn_window=4),
    "window_3": dict(attn_window=3),  # odd: two-sided, |i - j| <= 1
    "qk_norm": dict(qk_norm=True),
    "qk_norm_rms_rope": dict(qk_norm=True, norm="rmsnorm", positional="rope"),
    "llama": dict(
        positional="rope", norm="rmsnorm", activation="swiglu", kv_heads=2, bias=False,
        norm_first=True,
    ),
    "window_alibi": dict(attn_window=4, positional="alibi"),
    "window_rope_gqa": dict(attn_window=3, positional="rope", kv_heads=2, qk_norm=True),
}  # fmt: skip


def build(make: Callable[[ModelConfig], nn.Module], cfg: ModelConfig, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = make(cfg).eval()
    for p in model.parameters():  # every weight off its initial value (norms, biases, PAD row)
        nn.init.normal_(p, std=0.3)
    return model


def right_padded(lengths: list[int], width: int, cfg: ModelConfig, seed: int) -> Tensor:
    """Rows of random ids (none PAD) of these lengths, right-padded to `width`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, cfg.vocab_size, (len(lengths), width), generator=g)
    for row, n in enumerate(lengths):
        ids[row, n:] = cfg.pad_id
    return ids


def blocked_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls of the blocked local attention (the real function still runs)."""
    calls: list[int] = []
    real = attention_module.local_attention

    def counted(*args: Any, **kwargs: Any) -> Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_module, "local_attention", counted)
    return calls


def check_paths(cfg: ModelConfig, calls: list[int], width: int) -> None:
    """A window without ALiBi over a long forward must have gone block by block (else this
    file would test the dense band twice); a short one, never."""
    blocked = bool(cfg.attn_window) and cfg.positional != "alibi" and width > 2 * cfg.attn_window
    assert bool(calls) == blocked, (cfg.attn_window, width, len(calls))
    calls.clear()


@pytest.mark.parametrize("name", [n for n in SWITCHES if n != "none"])  # decoder-only
def test_transformer_matches_the_reference(name, monkeypatch):
    cfg = dataclasses.replace(BASE, **SWITCHES[name])
    model = build(Transformer, cfg, seed=1)
    w = reference.weights_of(model)
    calls = blocked_calls(monkeypatch)
    for width, seed in ((LONG, 2), (SHORT, 3)):
        src = right_padded([width, width - 4, width - 1], width, cfg, seed)
        tgt = right_padded([width - 1, width - 1, width - 3], width - 1, cfg, seed + 10)
        with torch.no_grad():
            got = model(src, tgt).double().numpy()
        check_paths(cfg, calls, width)
        # Every target position, padding included: the decoder computes them alike.
        np.testing.assert_allclose(
            got, reference.transformer_forward(w, cfg, src.numpy(), tgt.numpy()), **TOL
        )


@pytest.mark.parametrize("name", SWITCHES)
def test_decoder_lm_matches_the_reference(name, monkeypatch):
    cfg = dataclasses.replace(BASE, **SWITCHES[name])
    model = build(DecoderLM, cfg, seed=4)
    w = reference.weights_of(model)
    calls = blocked_calls(monkeypatch)
    for width, seed in ((LONG, 5), (SHORT, 6)):
        ids = right_padded([width, width - 5, width - 2], width, cfg, seed)
        with torch.no_grad():
            got = model(ids).double().numpy()
        check_paths(cfg, calls, width)
        np.testing.assert_allclose(got, reference.lm_forward(w, cfg, ids.numpy()), **TOL)


@pytest.mark.parametrize("name", [n for n in SWITCHES if n != "none"])  # decoder-only
def test_classifier_matches_the_reference(name, monkeypatch):
    cfg = dataclasses.replace(BASE, **SWITCHES[name])
    model = build(lambda c: EncoderClassifier(c, 3), cfg, seed=7)
    w = reference.weights_of(model)
    calls = blocked_calls(monkeypatch)
    for width, seed in ((LONG, 8), (SHORT, 9)):
        ids = right_padded([width - 3, width, width - 5], width, cfg, seed)
        with torch.no_grad():
            got = model(ids).double().numpy()
        check_paths(cfg, calls, width)
        np.testing.assert_allclose(got, reference.classifier_forward(w, cfg, ids.numpy()), **TOL)


def test_alibi_slopes_are_the_papers():
    """Press et al. §3: 8 heads get 1/2, 1/4, ..., 1/256; their code gives 6 heads the 4 of
    4 heads (1/4 .. 1/256), then every other one of 8 heads' (1/2, 1/8)."""
    assert reference.alibi_slopes(8) == [2.0**-h for h in range(1, 9)]
    assert reference.alibi_slopes(6) == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]


def test_rope_keeps_lengths_and_turns_by_relative_position():
    """A rotation keeps each pair's length, and q_t . k_s depends on t - s only."""
    g = np.random.default_rng(0)
    q_row, k_row = g.normal(size=8), g.normal(size=8)
    q, k = (
        reference.rope(np.tile(q_row, (10, 1)), 50.0),
        reference.rope(np.tile(k_row, (10, 1)), 50.0),
    )
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), np.linalg.norm(q_row), rtol=1e-12)
    dots = q @ k.T
    np.testing.assert_allclose(dots[5, 2], dots[7, 4], rtol=1e-12)  # both t - s = 3
    assert not np.isclose(dots[5, 2], dots[5, 4])


def test_window_keep_is_the_band():
    cfg = dataclasses.replace(BASE, attn_window=3)
    causal = reference.self_attention_keep(cfg, np.ones(5, dtype=bool), causal=True)
    assert causal.astype(int).tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    real = np.array([True, True, True, False, False])  # two-sided: |i - j| <= 1, real keys,
    both = reference.self_attention_keep(cfg, real, causal=False)  # and itself always
    assert both.astype(int).tolist() == [
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],
    ]
