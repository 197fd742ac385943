"""The model against its oracles: torch.nn modules on copied weights, the NumPy reference,
and the invariants (causality, padding, permutation equivariance, cache == no cache)."""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from aiayn import reference
from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.nn.attention import (
    MultiHeadAttention,
    attention,
    fused_attention,
    self_attention_unparameterised,
)
from aiayn.nn.model import AttentionMaps, DecoderLayer, EncoderLayer, Transformer, count_parameters
from aiayn.nn.packed import skips_padding
from aiayn.nn.tracing import tracing
from aiayn.nn.variants import DecoderLM, EncoderClassifier

TOL = dict(rtol=1e-5, atol=1e-5)  # fp32 parity


@pytest.fixture(autouse=True)
def _no_fastpath():
    # nn.Transformer*'s inference fast path returns nested tensors that zero padded rows; the
    # oracle is the documented math path.
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(True)


def copy_mha(ref: nn.MultiheadAttention, ours: MultiHeadAttention) -> None:
    with torch.no_grad():
        ours.in_proj.weight.copy_(ref.in_proj_weight)
        ours.in_proj.bias.copy_(ref.in_proj_bias)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)


def copy_layer(ref: nn.Module, ours: nn.Module) -> None:
    copy_mha(ref.self_attn, ours.self_attn)
    if hasattr(ref, "multihead_attn"):
        copy_mha(ref.multihead_attn, ours.cross_attn)
    pairs = [("linear1", "ffn.w_1"), ("linear2", "ffn.w_2"), ("norm1", "norm1"), ("norm2", "norm2")]
    if hasattr(ref, "norm3"):
        pairs.append(("norm3", "norm3"))
    with torch.no_grad():
        for r, o in pairs:
            src, dst = ref.get_submodule(r), ours.get_submodule(o)
            dst.weight.copy_(src.weight)
            dst.bias.copy_(src.bias)


def layer_cfg(norm_first: bool) -> ModelConfig:
    return ModelConfig(
        vocab_size=11,
        d_model=16,
        n_heads=4,
        n_layers=2,
        d_ff=24,
        dropout=0.0,
        norm_first=norm_first,
    )


# --- attention ------------------------------------------------------------------------------


def test_fused_and_explicit_attention_agree_with_masks():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    keep = torch.rand(2, 1, 5, 7) > 0.3
    keep[0, 0, 2] = False  # a row with nothing to attend to
    out, w = attention(q, k, v, keep)
    torch.testing.assert_close(out, fused_attention(q, k, v, keep), **TOL)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert torch.all(out[0, :, 2] == 0) and torch.all(w[0, :, 2] == 0)
    torch.testing.assert_close(w.sum(-1)[keep.any(-1).expand(2, 3, 5)], torch.ones(2 * 3 * 5 - 3))


def test_fused_causal_matches_explicit_causal():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 6, 4) for _ in range(3))
    keep = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    torch.testing.assert_close(
        fused_attention(q, k, v, causal=True), attention(q, k, v, keep)[0], **TOL
    )


def test_fully_masked_rows_have_zero_gradient_not_nan():
    q = torch.randn(1, 1, 2, 4, requires_grad=True)
    k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    keep = torch.tensor([[True, False, True], [False, False, False]])
    out, _ = attention(q, k, v, keep)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.all(q.grad[0, 0, 1] == 0)


@pytest.mark.parametrize("cross", [False, True])
def test_mha_matches_torch_multihead_attention(cross):
    torch.manual_seed(2)
    D, H, B, T, S = 16, 4, 3, 5, 7
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    ours = MultiHeadAttention(D, H).eval()
    copy_mha(ref, ours)
    x = torch.randn(B, T, D)
    mem = torch.randn(B, S, D) if cross else x
    keep_BS = torch.ones(B, mem.size(1), dtype=torch.bool)
    keep_BS[1, -3:] = False
    expected, expected_w = ref(x, mem, mem, key_padding_mask=~keep_BS, average_attn_weights=False)
    with tracing() as trace:  # the explicit path, every intermediate recorded
        got = ours(x, mem, keep_mask=keep_BS[:, None, None, :])
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(trace.tensors["attn.weights"], expected_w, **TOL)
    # the fused path (not traced) gives the same output
    torch.testing.assert_close(ours(x, mem, keep_BS[:, None, None, :]), expected, **TOL)


@given(n=st.integers(1, 10), seed=st.integers(0, 2**16))
def test_self_attention_is_permutation_equivariant(n, seed):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, 4).eval()
    x_BTD, perm = torch.randn(2, n, 16), torch.randperm(n)
    y_BTD = mha(x_BTD, x_BTD)
    torch.testing.assert_close(mha(x_BTD[:, perm], x_BTD[:, perm]), y_BTD[:, perm], **TOL)
    y0 = self_attention_unparameterised(x_BTD)
    torch.testing.assert_close(self_attention_unparameterised(x_BTD[:, perm]), y0[:, perm], **TOL)


def test_unparameterised_self_attention_is_a_weighted_average():
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    w = torch.softmax(x[0] @ x[0].T, dim=1)
    torch.testing.assert_close(self_attention_unparameterised(x)[0], w @ x[0])


# --- layers and stacks against torch.nn ---------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch(norm_first):
    torch.manual_seed(3)
    cfg = layer_cfg(norm_first)
    ref = nn.TransformerEncoderLayer(
        16, 4, 24, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    ours = EncoderLayer(cfg)
    copy_layer(ref, ours)
    ref.eval(), ours.eval()
    x = torch.randn(2, 6, 16)
    keep_BS = torch.ones(2, 6, dtype=torch.bool)
    keep_BS[0, 4:] = False
    expected = ref(x, src_key_padding_mask=~keep_BS)
    got = ours(x, keep_BS[:, None, None, :])
    torch.testing.assert_close(got[keep_BS], expected[keep_BS], **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first):
    torch.manual_seed(4)
    cfg = layer_cfg(norm_first)
    ref = nn.TransformerDecoderLayer(
        16, 4, 24, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    ours = DecoderLayer(cfg)
    copy_layer(ref, ours)
    ref.eval(), ours.eval()
    y, mem = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    keep_BS = torch.ones(2, 7, dtype=torch.bool)
    keep_BS[1, 3:] = False
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    expected = ref(y, mem, tgt_mask=causal, memory_key_padding_mask=~keep_BS, tgt_is_causal=True)
    got = ours(y, mem, keep_BS[:, None, None, :])
    torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_decoder_stack_matches_nn_transformer(norm_first):
    torch.manual_seed(5)
    cfg = layer_cfg(norm_first)
    ref = nn.Transformer(16, 4, 2, 2, 24, dropout=0.0, batch_first=True, norm_first=norm_first)
    if not norm_first:  # nn.Transformer always adds final norms; the paper's post-LN has none
        ref.encoder.norm = None
        ref.decoder.norm = None
    ours = Transformer(cfg)
    for r, o in zip(ref.encoder.layers, ours.encoder.layers, strict=True):
        copy_layer(r, o)
    for r, o in zip(ref.decoder.layers, ours.decoder.layers, strict=True):
        copy_layer(r, o)
    if norm_first:
        ours.encoder.norm.load_state_dict(ref.encoder.norm.state_dict())
        ours.decoder.norm.load_state_dict(ref.decoder.norm.state_dict())
    ref.eval(), ours.eval()
    x, y = torch.randn(2, 7, 16), torch.randn(2, 5, 16)
    keep_BS = torch.ones(2, 7, dtype=torch.bool)
    keep_BS[0, 5:] = False
    expected = ref(
        x,
        y,
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(5),
        src_key_padding_mask=~keep_BS,
        memory_key_padding_mask=~keep_BS,
        tgt_is_causal=True,
    )
    mem = ours.encoder(x, keep_BS[:, None, None, :])
    got = ours.decoder(y, mem, keep_BS[:, None, None, :])
    torch.testing.assert_close(got, expected, **TOL)


# --- the whole model against the NumPy reference --------------------------------------------------

VARIANTS = [
    dict(),
    dict(norm_first=True),
    dict(positional="learned", share_embeddings=False, tie_output=False),
    # Marian's choices (aiayn import marian): swish FFN, sines-then-cosines, a logits bias.
    dict(activation="swish", positional_layout="halves", logits_bias=True),
]


def random_batch(cfg, B=3, S=7, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, cfg.vocab_size, (B, S), generator=g)
    tgt = torch.randint(4, cfg.vocab_size, (B, T), generator=g)
    src[0, 5:] = cfg.pad_id
    tgt[1, 4:] = cfg.pad_id
    return src, tgt


@pytest.mark.parametrize(
    "overrides", VARIANTS, ids=["post_ln", "pre_ln", "learned_untied", "marian"]
)
def test_model_matches_numpy_reference(tiny_cfg, overrides):
    cfg = dataclasses.replace(tiny_cfg, **overrides)
    torch.manual_seed(6)
    model = Transformer(cfg).eval()
    if cfg.logits_bias:  # zero-initialised: make it count
        nn.init.normal_(model.generator.bias)
    if cfg.positional == "learned":
        nn.init.normal_(model.src_embed.learned.weight)
        nn.init.normal_(model.tgt_embed.learned.weight)
    src, tgt = random_batch(cfg)
    got = model(src, tgt).detach().double().numpy()
    expected = reference.transformer_forward(
        reference.weights_of(model), cfg, src.numpy(), tgt.numpy()
    )
    tgt_real = (tgt != cfg.pad_id).numpy()
    np.testing.assert_allclose(got[tgt_real], expected[tgt_real], rtol=1e-5, atol=1e-5)


LM_VARIANTS = [
    {},
    dict(norm_first=True, positional="learned", activation="gelu_tanh", scale_embeddings=False),
    dict(norm_first=True, activation="gelu", logits_bias=True, tie_output=False),
]


@pytest.mark.parametrize("overrides", LM_VARIANTS, ids=["paper_block", "gpt2", "gelu_bias"])
def test_decoder_only_model_matches_numpy_reference(tiny_cfg, overrides):
    cfg = dataclasses.replace(tiny_cfg, **overrides)
    torch.manual_seed(7)
    model = DecoderLM(cfg).eval()
    for p in model.parameters():  # every weight off its initial value (LayerNorms, biases)
        nn.init.normal_(p, std=0.3)
    ids = torch.randint(4, cfg.vocab_size, (2, 9))
    got = model(ids).detach().double().numpy()
    expected = reference.lm_forward(reference.weights_of(model), cfg, ids.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_reference_positional_encoding_matches_model(layout):
    from aiayn.nn.embeddings import sinusoidal_positions

    np.testing.assert_allclose(
        sinusoidal_positions(50, 12, layout).double().numpy(),
        reference.positional_encoding(50, 12, layout),
        atol=1e-6,
    )


def test_halves_layout_is_the_interleaved_table_with_its_columns_permuted():
    from aiayn.nn.embeddings import sinusoidal_positions

    inter, halves = sinusoidal_positions(40, 16), sinusoidal_positions(40, 16, "halves")
    torch.testing.assert_close(halves[:, :8], inter[:, 0::2], rtol=0, atol=0)
    torch.testing.assert_close(halves[:, 8:], inter[:, 1::2], rtol=0, atol=0)


# --- invariants -----------------------------------------------------------------------------------


def test_causality_future_target_tokens_do_not_change_earlier_logits(tiny_cfg):
    torch.manual_seed(7)
    model = Transformer(tiny_cfg).eval()
    src, tgt = random_batch(tiny_cfg)
    tgt[1] = torch.randint(4, tiny_cfg.vocab_size, (tgt.size(1),))
    base = model(src, tgt)
    for t in range(tgt.size(1)):
        changed = tgt.clone()
        changed[:, t] = (changed[:, t] + 1 - 4) % (tiny_cfg.vocab_size - 4) + 4
        out = model(src, changed)
        torch.testing.assert_close(out[:, :t], base[:, :t], **TOL)
        assert not torch.allclose(out[:, t], base[:, t])


@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_invariance(tiny_cfg, norm_first):
    cfg = dataclasses.replace(tiny_cfg, norm_first=norm_first)
    torch.manual_seed(8)
    model = Transformer(cfg).eval()
    src = torch.randint(4, cfg.vocab_size, (2, 5))
    tgt = torch.randint(4, cfg.vocab_size, (2, 4))
    base = model(src, tgt)
    pad = torch.full((2, 3), cfg.pad_id)
    torch.testing.assert_close(model(torch.cat([src, pad], 1), tgt), base, **TOL)
    torch.testing.assert_close(model(src, torch.cat([tgt, pad], 1))[:, :4], base, **TOL)
    both = model(torch.cat([src, pad], 1), torch.cat([tgt, pad[:, :1]], 1))
    torch.testing.assert_close(both[:, :4], base, **TOL)


def test_batch_of_mixed_lengths_equals_one_by_one(tiny_cfg):
    torch.manual_seed(9)
    model = Transformer(tiny_cfg).eval()
    src, tgt = random_batch(tiny_cfg)
    batch = model(src, tgt)
    for b in range(src.size(0)):
        s = src[b][src[b] != tiny_cfg.pad_id][None]
        t = tgt[b][tgt[b] != tiny_cfg.pad_id][None]
        torch.testing.assert_close(model(s, t)[0], batch[b, : t.size(1)], **TOL)


def test_kv_cached_decoding_equals_full_forward(tiny_cfg):
    for norm_first in (False, True):
        cfg = dataclasses.replace(tiny_cfg, norm_first=norm_first)
        torch.manual_seed(10)
        model = Transformer(cfg).eval()
        src, tgt = random_batch(cfg)
        tgt[1] = 5  # no PAD in the fed prefix
        full = model(src, tgt)
        memory = model.encode(src)
        cache = model.init_cache(memory, capacity=tgt.size(1))
        steps = []
        for t in range(tgt.size(1)):
            logits, cache = model.decode_step(tgt[:, t : t + 1], memory, cache)
            steps.append(logits)
        torch.testing.assert_close(torch.stack(steps, 1), full, **TOL)
        # feeding several positions at once (a forced prefix) gives the same last logits
        cache = model.init_cache(memory, capacity=tgt.size(1))
        logits, cache = model.decode_step(tgt[:, :3], memory, cache)
        torch.testing.assert_close(logits, full[:, 2], **TOL)
        logits, _ = model.decode_step(tgt[:, 3:4], memory, cache)
        torch.testing.assert_close(logits, full[:, 3], **TOL)


def test_kv_cache_index_select_reorders_rows(tiny_cfg):
    torch.manual_seed(11)
    model = Transformer(tiny_cfg).eval()
    src, tgt = random_batch(tiny_cfg)
    memory = model.encode(src)
    cache = model.init_cache(memory, capacity=8)
    _, cache = model.decode_step(tgt[:, :2], memory, cache)
    idx = torch.tensor([2, 0, 1])
    reordered = cache.index_select(idx)
    logits, _ = model.decode_step(tgt[idx, 2:3], memory.index_select(idx), reordered)
    full = model(src[idx], tgt[idx, :3])
    torch.testing.assert_close(logits, full[:, 2], **TOL)


def test_traced_attention_maps_shapes_and_same_logits(tiny_cfg):
    torch.manual_seed(12)
    model = Transformer(tiny_cfg).eval()
    src, tgt = random_batch(tiny_cfg)
    with tracing() as trace:
        logits = model(src, tgt)
    maps = AttentionMaps.from_trace(trace)
    torch.testing.assert_close(logits, model(src, tgt), **TOL)
    L, H = tiny_cfg.n_layers, tiny_cfg.n_heads
    assert [m.shape for m in maps.enc_self] == [(3, H, 7, 7)] * L
    assert [m.shape for m in maps.dec_self] == [(3, H, 6, 6)] * L
    assert [m.shape for m in maps.cross] == [(3, H, 6, 7)] * L
    assert torch.all(maps.cross[0][0, :, :, 5:] == 0)  # padded source positions get no weight
    assert torch.all(torch.triu(maps.dec_self[0], diagonal=1) == 0)  # causal


def test_tracing_records_the_real_forward_pass(tiny_cfg):
    torch.manual_seed(13)
    model = Transformer(tiny_cfg).eval()
    src, tgt = random_batch(tiny_cfg)
    plain = model(src, tgt)
    with tracing() as trace:
        traced = model(src, tgt)
    torch.testing.assert_close(traced, plain, **TOL)
    names = list(trace.tensors)
    for name in [
        "src_embed.tokens",
        "src_embed.positions",
        "src_embed.sum",
        "encoder.layers.0.self_attn.q",
        "encoder.layers.0.self_attn.scores_scaled",
        "encoder.layers.0.self_attn.weights",
        "encoder.layers.1.ffn.hidden",
        "decoder.layers.1.cross_attn.weights",
        "decoder.layers.0.norm3",
        "generator.logits",
    ]:
        assert name in names, name
    torch.testing.assert_close(trace.tensors["generator.logits"], plain, **TOL)
    assert names.index("src_embed.sum") < names.index("encoder.layers.0.self_attn.q")


def test_gradients_reach_every_parameter(tiny_cfg):
    for overrides in VARIANTS:
        cfg = dataclasses.replace(tiny_cfg, **overrides)
        model = Transformer(cfg)
        src, tgt = random_batch(cfg)
        model(src, tgt).sum().backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name


def test_layers_start_from_independent_random_weights(tiny_cfg):
    model = Transformer(tiny_cfg)
    w0 = model.encoder.layers[0].self_attn.in_proj.weight
    w1 = model.encoder.layers[1].self_attn.in_proj.weight
    assert not torch.equal(w0, w1)
    q, k, _ = w0.chunk(3)
    assert not torch.equal(q, k)


def test_q_k_v_blocks_get_xavier_with_gain_one_over_sqrt_2():
    """W^Q, W^K, W^V are d x d blocks of the packed in_proj: each U(-a, a) with
    a = sqrt(6 / 4d) (Xavier, gain 1/sqrt(2), fairseq's scaled init), and independent."""
    torch.manual_seed(0)
    d = 256
    model = Transformer(ModelConfig(vocab_size=50, d_model=d, n_heads=4, n_layers=1, d_ff=64))
    bound = (6 / (4 * d)) ** 0.5
    for mha in (model.encoder.layers[0].self_attn, model.decoder.layers[0].cross_attn):
        q, k, v = mha.in_proj.weight.chunk(3)
        for w in (q, k, v):
            assert w.abs().max() <= bound
            assert w.abs().max() > 0.99 * bound  # 65,536 uniform draws reach the bound
            assert w.std().item() == pytest.approx(bound / 3**0.5, rel=0.02)
        assert abs(torch.corrcoef(torch.stack([q.flatten(), k.flatten()]))[0, 1]) < 0.02


def test_normal_init_draws_every_weight_from_n_0_002():
    """init = "normal" (HF Marian's, BERT's): every projection and embedding ~ N(0, 0.02),
    biases 0, the padding row 0, and Q/K/V independent (one draw for the packed matrix)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=500, d_model=256, n_heads=4, n_layers=1, d_ff=512,
                      logits_bias=True, init="normal")  # fmt: skip
    model = Transformer(cfg)
    emb = model.src_embed.tokens
    weights = {"embedding": emb.weight[1:], "ffn": model.decoder.layers[0].ffn.w_1.weight}
    for mha in (model.encoder.layers[0].self_attn, model.decoder.layers[0].cross_attn):
        weights.update(zip("qkv", mha.in_proj.weight.chunk(3), strict=True))
    for name, w in weights.items():
        assert w.mean().item() == pytest.approx(0.0, abs=2e-3), name
        assert w.std().item() == pytest.approx(0.02, rel=0.02), name
    assert torch.count_nonzero(emb.weight[cfg.pad_id]) == 0
    assert torch.count_nonzero(model.generator.bias) == 0
    assert torch.count_nonzero(model.decoder.layers[0].ffn.w_1.bias) == 0
    q, k, _ = model.encoder.layers[0].self_attn.in_proj.weight.chunk(3)
    assert abs(torch.corrcoef(torch.stack([q.flatten(), k.flatten()]))[0, 1]) < 0.02
    with pytest.raises(ConfigError, match="init='he'"):
        ModelConfig(vocab_size=10, d_model=8, n_heads=2, init="he")  # type: ignore[arg-type]


def test_tied_embeddings_are_one_tensor(tiny_cfg):
    model = Transformer(tiny_cfg)
    assert model.src_embed.tokens.weight is model.tgt_embed.tokens.weight
    assert model.generator.weight is model.tgt_embed.tokens.weight
    untied = Transformer(dataclasses.replace(tiny_cfg, share_embeddings=False, tie_output=False))
    assert untied.generator.weight is not untied.tgt_embed.tokens.weight
    assert count_parameters(untied) == count_parameters(model) + 2 * 50 * 16


@pytest.mark.parametrize("preset,paper", [("paper_base", 65e6), ("paper_big", 213e6)])
def test_parameter_count_matches_table_3(preset, paper):
    with torch.device("meta"):  # no memory or init time for 213M parameters
        model = Transformer(ModelConfig.preset(preset, vocab_size=37000))
    assert abs(count_parameters(model) - paper) / paper < 0.05


# --- variants from the same blocks -------------------------------------------------------


def test_encoder_classifier_ignores_padding(tiny_cfg):
    torch.manual_seed(14)
    clf = EncoderClassifier(tiny_cfg, n_classes=3).eval()
    ids = torch.randint(4, 50, (2, 5))
    out = clf(ids)
    assert out.shape == (2, 3)
    padded = torch.cat([ids, torch.zeros(2, 4, dtype=torch.long)], 1)
    torch.testing.assert_close(clf(padded), out, **TOL)


def test_decoder_lm_is_causal(tiny_cfg):
    torch.manual_seed(15)
    lm = DecoderLM(tiny_cfg).eval()
    ids = torch.randint(4, 50, (2, 6))
    base = lm(ids)
    assert base.shape == (2, 6, 50)
    changed = ids.clone()
    changed[:, 3] = 7 if int(ids[0, 3]) != 7 else 8
    torch.testing.assert_close(lm(changed)[:, :3], base[:, :3], **TOL)
    assert lm.generator.weight is lm.embed.tokens.weight


# --- bad input ------------------------------------------------------------------------------------


def test_bad_config_values_are_clear_errors():
    with pytest.raises(ConfigError, match="not divisible by n_heads"):
        ModelConfig(vocab_size=10, d_model=10, n_heads=3)
    with pytest.raises(ConfigError, match="dropout"):
        ModelConfig(vocab_size=10, d_model=8, n_heads=2, dropout=1.5)
    with pytest.raises(ConfigError, match="unknown preset"):
        ModelConfig.preset("paper_huge", vocab_size=10)
    with pytest.raises(ValueError, match="not divisible"):
        MultiHeadAttention(10, 3)


def test_bad_inputs_are_clear_value_errors(tiny_cfg):
    model = Transformer(tiny_cfg).eval()
    ok = torch.randint(4, 50, (2, 5))
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 50\)"):
        model(torch.full((2, 5), 50), ok)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(ok, torch.full((2, 5), -1))
    with pytest.raises(ValueError, match=r"\(batch, length\) tensor"):
        model(ok[0], ok)
    with pytest.raises(ValueError, match="integer token ids"):
        model(ok.float(), ok)
    with pytest.raises(ValueError, match="max_len=64"):
        model(torch.randint(4, 50, (1, 65)), ok[:1])
    for most in (None, 64):  # per-row positions (rows that joined late); `most` a host bound
        with pytest.raises(ValueError, match="65 positions is longer than max_len=64"):
            model.tgt_embed(ok[:, :1], start=torch.tensor([3, 64]), most=most)
    assert model.tgt_embed(ok[:, :1], start=torch.tensor([3, 63]), most=63).shape == (2, 1, 16)
    with pytest.raises(ValueError, match="source batch 2 != target batch 1"):
        model(ok, ok[:1])


@torch.inference_mode()
def test_beam_style_reorders_in_inference_mode_match_full_forward(tiny_cfg):
    """Reorders with an unchanged row count go through the spare buffers; twice in a row swaps
    them back, so both directions are exercised."""
    torch.manual_seed(16)
    model = Transformer(tiny_cfg).eval()
    src, tgt = random_batch(tiny_cfg)
    tgt[1] = 5
    memory = model.encode(src)
    cache = model.init_cache(memory, capacity=8)
    order = torch.arange(3)
    for t, idx in enumerate([torch.tensor([2, 0, 1]), torch.tensor([1, 1, 0]), None]):
        logits, cache = model.decode_step(tgt[order, t : t + 1], memory.index_select(order), cache)
        torch.testing.assert_close(logits, model(src[order], tgt[order, : t + 1])[:, t], **TOL)
        if idx is not None:
            cache = cache.index_select(idx, cross=True)
            order = order[idx]


def test_linear_fast_path_matches_and_sees_weight_updates():
    from aiayn.runtime.kernels import Linear

    torch.manual_seed(17)
    lin = Linear(16, 24)
    x = torch.randn(5, 16)
    expected = torch.nn.functional.linear(x, lin.weight, lin.bias)
    with torch.no_grad():
        torch.testing.assert_close(lin(x), expected, **TOL)
        torch.testing.assert_close(lin(x, rows=(8, 24)), expected[:, 8:], **TOL)
        torch.testing.assert_close(lin(x, activation="relu"), expected.relu(), **TOL)
        swish = torch.nn.functional.silu(expected)
        torch.testing.assert_close(lin(x, activation="swish"), swish, **TOL)
        lin.weight.add_(1.0)  # an optimizer step: the packed copy must be rebuilt
        torch.testing.assert_close(
            lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias), **TOL
        )
    assert lin(x).requires_grad  # with autograd on, the ordinary differentiable path


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def torch_threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [(16, 24), (128, 384), (256, 1024)])
@pytest.mark.parametrize("activation", ["none", "relu", "swish"])
def test_linear_gives_a_row_the_same_bits_in_any_batch(shape, activation, torch_threads):
    """Inference: a row's product does not depend on how many rows share the call, on
    whichever path this machine takes at this thread count (prepacked oneDNN, or `F.linear`
    padded to 4 rows where that is faster and checked invariant), so a served sentence gets
    `translate`'s bits."""
    from aiayn.runtime.kernels import Linear

    torch.manual_seed(5)
    lin = Linear(*shape)
    x = torch.randn(70, shape[0])
    with torch.no_grad():
        every = lin(x, activation=activation)
        for start, n in [(0, 1), (3, 1), (1, 2), (4, 3), (2, 4), (9, 5), (20, 33), (0, 70)]:
            got = lin(x[start : start + n], activation=activation)
            assert torch.equal(got, every[start : start + n]), (start, n)
        half = (shape[1] // 2, shape[1])  # a block of output rows, as W^K W^V of in_proj
        every_half = lin(x, rows=half, activation=activation)
        for start, n in [(5, 1), (0, 3), (6, 9)]:
            got = lin(x[start : start + n], rows=half, activation=activation)
            assert torch.equal(got, every_half[start : start + n]), ("rows", start, n)


@pytest.mark.parametrize("plain", [True, False], ids=["padded_linear", "prepacked"])
def test_linear_remembers_its_path_and_sees_new_weights(plain, torch_threads, monkeypatch):
    """Inference calls after a layer's first skip the checks that chose its path (`F.linear`
    padded to 4 rows, or the prepacked oneDNN product, whichever this machine would take for
    small weights, forced here): the same bits as a fresh layer's first call, and every change
    of the weights seen: in place, new storage of the weight or the bias, a new state dict,
    another thread count, another dtype."""
    import aiayn.runtime.kernels
    from aiayn.runtime.kernels import Linear

    monkeypatch.setattr(aiayn.runtime.kernels, "_PLAIN_PREFERRED", plain)
    torch.manual_seed(8)
    lin = Linear(128, 384)
    x = torch.randn(3, 128)

    def fresh_first_call(rows=None, activation="none"):
        other = Linear(128, 384)
        other.load_state_dict(lin.state_dict())
        return other(x, rows=rows, activation=activation)

    with torch.no_grad():
        for rows, activation in [(None, "none"), ((0, 128), "none"), ((128, 384), "relu")]:
            first = lin(x, rows=rows, activation=activation)
            assert torch.equal(lin(x, rows=rows, activation=activation), first)
            assert torch.equal(first, fresh_first_call(rows, activation))
        lin.weight.add_(0.25)  # in place, as an optimizer step
        assert torch.equal(lin(x, rows=(0, 128)), fresh_first_call((0, 128)))
        lin.weight.data = torch.randn(384, 128)  # new storage
        assert torch.equal(lin(x), fresh_first_call())
        lin(x, rows=(128, 384))  # a plan for these rows, then new storage of the bias alone
        lin.bias.data = torch.randn(384)
        assert torch.equal(lin(x, rows=(128, 384)), fresh_first_call((128, 384)))
        lin.load_state_dict({k: torch.randn_like(v) for k, v in lin.state_dict().items()})
        assert torch.equal(lin(x), fresh_first_call())
        torch.set_num_threads(3 - torch_threads)  # 1 <-> 2: the path may differ
        assert torch.equal(lin(x), fresh_first_call())
        torch.set_num_threads(torch_threads)
        lin.double()
        assert torch.equal(lin(x.double()), torch.nn.functional.linear(x.double(), lin.weight,
                                                                        lin.bias))  # fmt: skip


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_dropout_in_training_only(norm_first, monkeypatch):
    """§5.4: dropout on the embeddings' sums and on every sub-layer's output before the
    residual add, while training; none at all in eval mode (not even a call)."""
    cfg = dataclasses.replace(layer_cfg(norm_first), dropout=0.5)
    model = Transformer(cfg)
    src, tgt = torch.randint(4, 11, (2, 5)), torch.randint(4, 11, (2, 4))
    calls = []
    dropout = torch.nn.functional.dropout

    def counted(x, *args, **kwargs):
        calls.append(x.shape)
        return dropout(x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "dropout", counted)
    model.train()
    first, second = model(src, tgt), model(src, tgt)
    assert not torch.equal(first, second)
    # per pass: 2 embeddings, 2 sub-layers per encoder layer, 3 per decoder layer
    assert len(calls) == 2 * (2 + 2 * cfg.n_layers + 3 * cfg.n_layers)
    calls.clear()
    model.eval()
    assert torch.equal(model(src, tgt), model(src, tgt)) and calls == []


def test_padded_linear_is_linear():
    from aiayn.runtime.kernels import PLAIN_MIN_ROWS, padded_linear

    torch.manual_seed(6)
    w, b = torch.randn(12, 8), torch.randn(12)
    for rows in range(1, PLAIN_MIN_ROWS + 2):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(padded_linear(x, w, b), torch.nn.functional.linear(x, w, b))
    x_BTD = torch.randn(1, 2, 8)  # 2 rows in a 3-D input: padded, shape kept
    out = padded_linear(x_BTD, w, None)
    assert out.shape == (1, 2, 12)
    torch.testing.assert_close(out, torch.nn.functional.linear(x_BTD, w))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "swish"])
def test_encoding_skips_padding_with_the_same_bits(norm_first, activation, torch_threads):
    """Inference on a CPU encodes a padded batch through `aiayn.nn.packed.encode_packed` (every
    position-wise product on the real positions only): each real position gets the bits of the
    padded forward, and padding gets zeros; the glass box traces the padded forward."""
    cfg = ModelConfig(vocab_size=300, d_model=64, n_heads=4, n_layers=2, d_ff=256, dropout=0.0,
                      max_len=64, norm_first=norm_first, activation=activation)  # fmt: skip
    torch.manual_seed(11)
    model = Transformer(cfg).eval()
    lengths = [1, 9, 3, 17, 17, 5, 2, 12, 4]
    src = torch.full((len(lengths), max(lengths)), cfg.pad_id)
    for b, n in enumerate(lengths):
        src[b, :n] = torch.randint(4, cfg.vocab_size, (n,))
    keep_BS = src != cfg.pad_id
    with torch.no_grad():
        assert skips_padding(model, keep_BS)
        packed = model.encode(src).out_BSD
        padded = model.encoder(model.src_embed(src), keep_BS[:, None, None, :])
        with tracing():
            traced = model.encode(src).out_BSD
        assert not skips_padding(model, keep_BS[:1, :1])  # no padding: the padded path
    assert torch.equal(packed[keep_BS], padded[keep_BS])
    assert not packed[~keep_BS].any()
    # traced: the paper's explicit attention over the padded layout (other bits than the fused
    # kernel's), padding included
    torch.testing.assert_close(traced, padded, **TOL)
    assert model.encode(src).out_BSD.requires_grad  # training: the padded path, with autograd
