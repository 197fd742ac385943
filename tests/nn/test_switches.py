"""The switches after the paper (`ModelConfig`: positional, norm, activation, kv_heads,
attn_window, qk_norm, bias), each alone on top of the paper's block, together as LLaMA's
block ("llama", "llama_mqa") and as a long context over a small window ("long": sequences
longer than twice the window, so the blocked `local_attention` and the ring-buffer cache run):
the invariants every one of them must keep, on tiny random models (d_model 32, 4 heads,
2 layers, vocabulary 50, no dropout).

Tolerances: fp32 on a CPU. Two computations of the same function by different paths (fused
kernel vs explicit math, a cache vs a full forward, a padded batch vs one row, blocks vs a
dense band mask) agree to TOL = 2e-5 in logits of size ~1-10; what must not move at all
(earlier logits when later tokens change) to EXACT = 1e-6. The searches built on these are in
tests/search/test_switch_search.py.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

import aiayn.nn.attention as attention_module
from aiayn.config import ModelConfig
from aiayn.errors import ConfigError
from aiayn.nn.attention import attention
from aiayn.nn.encoder_only import EncoderClassifier, EncoderMLM
from aiayn.nn.local_attention import local_attention
from aiayn.nn.model import Transformer
from aiayn.nn.norms import make_norm
from aiayn.nn.positions import alibi_slopes, band_keep, rope_angles, rotate
from aiayn.nn.tracing import tracing
from aiayn.nn.variants import DecoderLM

TOL = 2e-5  # the same function by two paths (module docstring)
EXACT = 1e-6  # what a change elsewhere must not move
V = 50
TINY: dict[str, Any] = dict(
    vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=64
)
LLAMA: dict[str, Any] = dict(
    positional="rope", norm="rmsnorm", activation="swiglu", kv_heads=2, bias=False,
    norm_first=True,
)  # fmt: skip
SWITCHES: dict[str, dict[str, Any]] = {
    "paper": {},
    "rope": {"positional": "rope"},
    "alibi": {"positional": "alibi"},
    "rmsnorm": {"norm": "rmsnorm"},
    "relu2": {"activation": "relu2"},
    "swiglu": {"activation": "swiglu"},
    "swiglu_matched": {"activation": "swiglu", "ffn_match_params": True},
    "geglu": {"activation": "geglu"},
    "geglu_matched": {"activation": "geglu", "ffn_match_params": True},
    "kv2": {"kv_heads": 2},
    "kv1": {"kv_heads": 1},
    "window": {"attn_window": 4},
    "qk_norm": {"qk_norm": True},
    "no_bias": {"bias": False},
    "llama": LLAMA,
    "llama_mqa": {**LLAMA, "kv_heads": 1},
    "long": {**LLAMA, "attn_window": 3},
    "long_alibi": {"positional": "alibi", "attn_window": 3, "kv_heads": 2, "qk_norm": True},
}
# positional="none" exists for a decoder-only model only (an encoder would see a bag of tokens)
LM_SWITCHES = {**SWITCHES, "nope": {"positional": "none"}, "nope_long": {**LLAMA,
               "positional": "none", "attn_window": 3}}  # fmt: skip
T = 20  # every sequence: longer than twice every window here (the blocked path runs)


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Any:
    """Products this small are faster on one thread: two threads' synchronisation costs more
    than they share, and on a loaded machine many times more (a forward here: ~5 ms on one
    thread, up to ~0.8 s on two of a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cfg_of(name: str, **more: Any) -> ModelConfig:
    return ModelConfig(**{**TINY, **LM_SWITCHES[name], **more})


@functools.cache
def built(arch: str, name: str) -> torch.nn.Module:
    """One tiny random model per architecture and switch (eval mode; tests do not change it)."""
    torch.manual_seed(sorted(LM_SWITCHES).index(name))
    cfg = cfg_of(name)
    if arch == "lm":
        return DecoderLM(cfg).eval()
    if arch == "mt":
        return Transformer(cfg).eval()
    if arch == "cls":
        return EncoderClassifier(cfg, 3).eval()
    return EncoderMLM(cfg).eval()


def ids(*shape: int, seed: int = 0) -> Tensor:
    """Random ids of real tokens (4.. V-1: no PAD, BOS, EOS, UNK)."""
    return torch.randint(4, V, shape, generator=torch.Generator().manual_seed(seed))


def right_padded(lengths: list[int], seed: int = 0) -> Tensor:
    batch = ids(len(lengths), max(lengths), seed=seed)
    for i, n in enumerate(lengths):
        batch[i, n:] = 0
    return batch


def prompts(text: Tensor, lengths: list[int]) -> Tensor:
    """The first lengths[i] tokens of text row i, right-padded (a decoder-only model's prompts)."""
    batch = text[:, : max(lengths)].clone()
    for i, n in enumerate(lengths):
        batch[i, n:] = 0
    return batch


def close(got: Tensor, want: Tensor, atol: float = TOL) -> None:
    assert got.shape == want.shape
    err = (got - want).abs().max().item() if got.numel() else 0.0
    assert err <= atol, f"max |difference| {err:.2e} > {atol:.0e}"


# --- causality -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LM_SWITCHES)
@torch.no_grad()
def test_a_language_model_does_not_read_the_future(name: str) -> None:
    model = built("lm", name)
    x = ids(2, T, seed=1)
    later = x.clone()
    later[:, 11:] = ids(2, T - 11, seed=2)
    close(model(later)[:, :11], model(x)[:, :11], EXACT)


@pytest.mark.parametrize("name", SWITCHES)
@torch.no_grad()
def test_the_translators_decoder_does_not_read_the_future(name: str) -> None:
    model = built("mt", name)
    src, tgt = right_padded([15, 9]), ids(2, T, seed=1)
    later = tgt.clone()
    later[:, 11:] = ids(2, T - 11, seed=2)
    close(model(src, later)[:, :11], model(src, tgt)[:, :11], EXACT)


# --- the fast paths (fused, packed, blocked) against the traced explicit math -----------------


@pytest.mark.parametrize(
    ("arch", "name"),
    [(a, n) for a in ("lm", "mt", "cls") for n in (LM_SWITCHES if a == "lm" else SWITCHES)],
)
@torch.no_grad()
def test_the_fast_forward_is_the_traced_explicit_one(
    arch: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Untraced, a forward takes SDPA's kernels, and a window over T > 2W goes block by block
    (`local_attention`, counted here); traced, every score is computed and recorded. Padded
    sources and inputs included."""
    calls = []

    def counted(*args: Any, **kwargs: Any) -> Tensor:
        calls.append(1)
        return local_attention(*args, **kwargs)

    monkeypatch.setattr(attention_module, "local_attention", counted)
    model = built(arch, name)
    inputs: tuple[Tensor, ...] = (ids(2, T, seed=3),)
    if arch == "mt":
        inputs = (right_padded([T, 13], seed=4), ids(2, T, seed=3))
    elif arch == "cls":
        inputs = (right_padded([T, 13], seed=4),)
    fast = model(*inputs)
    blocked = len(calls)
    with tracing():
        explicit = model(*inputs)
    close(fast, explicit)
    window = model.cfg.attn_window
    if window and model.cfg.positional != "alibi":  # ALiBi's bias needs the dense scores
        assert blocked > 0 and len(calls) == blocked  # blocks untraced, never traced
    else:
        assert not calls


# --- padding and batches -----------------------------------------------------------------------


@pytest.mark.parametrize("name", SWITCHES)
@torch.no_grad()
def test_a_sentence_alone_is_the_same_sentence_padded_in_a_batch(name: str) -> None:
    """Right padding (a translator's source, a classifier's and a masked LM's input) and the
    other rows of a batch change nothing of a row's outputs."""
    lengths = [T, 13, 4]
    src, tgt = right_padded(lengths, seed=5), ids(3, 12, seed=6)
    mt, cls, mlm = built("mt", name), built("cls", name), built("mlm", name)
    batch_mt, batch_cls, batch_mlm = mt(src, tgt), cls(src), mlm(src)
    for i, n in enumerate(lengths):
        alone = src[i : i + 1, :n]
        close(mt(alone, tgt[i : i + 1]), batch_mt[i : i + 1])
        close(cls(alone), batch_cls[i : i + 1])
        close(mlm(alone), batch_mlm[i : i + 1, :n])


# --- the decoding cache ------------------------------------------------------------------------


@pytest.mark.parametrize("name", LM_SWITCHES)
@torch.no_grad()
def test_a_language_models_cache_gives_the_full_forwards_logits(name: str) -> None:
    """Prompts of different lengths decoded together (left padding, each row at its own
    position) give, step by step, the logits of each row's whole text run alone (a causal
    forward: position t's logits are those of the first t + 1 tokens). Every other step is
    traced (the glass box decodes so: the explicit path, masks made in every layer)."""
    model: DecoderLM = built("lm", name)  # type: ignore[assignment]
    steps, lengths = 12, [5, 9, 2]
    text = ids(3, 9 + steps, seed=7)
    alone = [model(text[i : i + 1, : n + steps])[0] for i, n in enumerate(lengths)]
    memory = model.encode(prompts(text, lengths))
    cache = model.init_cache(memory, steps)
    fed = model.first_tokens(memory)
    for step in range(steps):
        if step % 2:
            with tracing():
                logits, cache = model.decode_step(fed, memory, cache)
        else:
            logits, cache = model.decode_step(fed, memory, cache)
        for i, n in enumerate(lengths):
            close(logits[i], alone[i][n - 1 + step])
        fed = torch.stack([text[i, n + step] for i, n in enumerate(lengths)])[:, None]


@pytest.mark.parametrize("name", SWITCHES)
@torch.no_grad()
def test_a_translators_cache_gives_the_full_forwards_logits(name: str) -> None:
    """One position at a time, and in chunks (a prefill of 7, then 6 at once, then one by one),
    against the logits of the whole target."""
    model: Transformer = built("mt", name)  # type: ignore[assignment]
    src, tgt = right_padded([15, 9, 4], seed=8), ids(3, T, seed=9)
    full = model(src, tgt)
    memory = model.encode(src)
    cache = model.init_cache(memory, T)
    for t in range(T):
        logits, cache = model.decode_step(tgt[:, t : t + 1], memory, cache)
        close(logits, full[:, t])
    cache = model.init_cache(memory, T)
    start = 0
    for stop in [7, 13, *range(14, T + 1)]:
        logits, cache = model.decode_step(tgt[:, start:stop], memory, cache)
        close(logits, full[:, stop - 1])
        start = stop


@pytest.mark.parametrize(
    ("arch", "name"), [("lm", "long"), ("lm", "long_alibi"), ("lm", "nope_long"), ("mt", "long")]
)
@torch.no_grad()
def test_a_ring_cache_that_wraps_many_times_gives_what_recomputing_gives(
    arch: str, name: str
) -> None:
    """A window of 3 over 40 decoded positions: the cache is a ring of 3 slots, overwritten
    ~13 times, and every step's logits are those of the whole text recomputed from scratch
    (every 8th step, its prefix alone too)."""
    model = built(arch, name)
    W, steps = model.cfg.attn_window, 40
    text = ids(2, steps + 4, seed=10)
    if arch == "lm":
        lengths = [4, 2]
        memory = model.encode(prompts(text, lengths))
        cache = model.init_cache(memory, steps)
        fed = model.first_tokens(memory)

        def scratch(i: int, stop: int) -> Tensor:  # logits after text[i, :stop]
            return model(text[i : i + 1, :stop])[0]

    else:
        lengths = [1, 1]  # the target starts with its first token (BOS's place)
        src = right_padded([9, 5], seed=11)
        memory = model.encode(src)
        cache = model.init_cache(memory, steps)
        fed = text[:, :1]

        def scratch(i: int, stop: int) -> Tensor:
            return model(src[i : i + 1], text[i : i + 1, :stop])[0]

    assert cache.window == W and all(k.size(2) == W for k in cache.self_k + cache.self_v)
    whole = [scratch(i, n + steps - 1) for i, n in enumerate(lengths)]
    for step in range(steps):
        logits, cache = model.decode_step(fed, memory, cache)
        for i, n in enumerate(lengths):
            close(logits[i], whole[i][n - 1 + step])
            if step % 8 == 7:
                close(logits[i], scratch(i, n + step)[-1])
        fed = torch.stack([text[i, n + step] for i, n in enumerate(lengths)])[:, None]
    assert cache.length > 10 * W


def test_a_window_wider_than_max_len_allocates_max_len_slots_and_sees_everything() -> None:
    """attn_window = 10^9 (a careless or hostile config) must not allocate 10^9 slots: the
    ring holds max_len, which every position a row can reach fits in, and the steps give the
    full forward's logits (left-padded rows included)."""
    cfg = ModelConfig(vocab_size=V, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                      dropout=0.0, max_len=24, attn_window=10**9)  # fmt: skip
    torch.manual_seed(0)
    model = DecoderLM(cfg).eval()
    text = ids(2, 24, seed=12)
    lengths = [4, 2]
    memory = model.encode(prompts(text, lengths))
    cache = model.init_cache(memory, 20)
    assert cache.window == 24 and all(k.size(2) == 24 for k in cache.self_k)
    fed = model.first_tokens(memory)
    whole = [model(text[i : i + 1, : n + 19])[0] for i, n in enumerate(lengths)]
    for step in range(20):
        logits, cache = model.decode_step(fed, memory, cache)
        for i, n in enumerate(lengths):
            close(logits[i], whole[i][n - 1 + step])
        fed = torch.stack([text[i, n + step] for i, n in enumerate(lengths)])[:, None]


# --- ALiBi against its paper -------------------------------------------------------------------


def test_alibi_slopes_are_the_papers() -> None:
    """m_h = 2^(-8h/H), h = 1..H, for H a power of 2; otherwise (their rule) those of the
    power of 2 below H, then every other one of the next power's: H = 6 takes H = 4's four
    (2^-2, 2^-4, 2^-6, 2^-8) and the first two odd powers of H = 8's (2^-1, 2^-3)."""
    want = {
        1: [2.0**-8],
        2: [2.0**-4, 2.0**-8],
        4: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8],
        8: [2.0**-h for h in range(1, 9)],
        6: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3],
        3: [2.0**-4, 2.0**-8, 2.0**-2],
    }
    for H, slopes in want.items():
        assert alibi_slopes(H).tolist() == pytest.approx(slopes, rel=1e-12), H


SLOPES = {4: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], 6: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8,
          2.0**-1, 2.0**-3]}  # fmt: skip


@pytest.mark.parametrize("H", [4, 6])
@pytest.mark.parametrize("arch", ["lm", "cls"])
@torch.no_grad()
def test_alibi_biases_each_head_by_its_slope_times_the_distance(arch: str, H: int) -> None:
    """Read from the trace: head h's bias is -m_h |i - j| in an encoder, -m_h (i - j) in a
    causal model (on the keys it sees); and the attention weights and heads recomputed by hand
    from the traced Q, K, V with that bias are the model's."""
    torch.manual_seed(H)
    cfg = ModelConfig(**{**TINY, "d_model": 8 * H, "n_heads": H, "positional": "alibi"})
    model = DecoderLM(cfg).eval() if arch == "lm" else EncoderClassifier(cfg, 2).eval()
    n = 11
    x = right_padded([n, 7], seed=12)
    with tracing() as trace:
        model(x)
    causal = arch == "lm"
    prefix = ("decoder" if causal else "encoder") + ".layers.1.self_attn"
    bias = trace.tensors[f"{prefix}.alibi_bias"]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    m = torch.tensor(SLOPES[H])[:, None, None]
    want = -m * ((i - j).abs() if not causal else (i - j)).float()
    seen = (j <= i) if causal else torch.ones(n, n, dtype=torch.bool)
    assert bias.shape == (H, n, n)
    close(bias.masked_fill(~seen, 0), want.masked_fill(~seen, 0), EXACT)
    q, k, v = (trace.tensors[f"{prefix}.{name}"] for name in "qkv")
    scores = q @ k.transpose(-2, -1) / math.sqrt(cfg.d_k) + want
    # an encoder's padding keys are hidden; a padding query sees itself (never nothing)
    keep = seen if causal else (seen & (x != 0)[:, None, None, :]) | torch.eye(n, dtype=torch.bool)
    weights = scores.masked_fill(~keep, float("-inf")).softmax(-1)
    close(trace.tensors[f"{prefix}.weights"], weights)
    close(trace.tensors[f"{prefix}.heads"], weights @ v)


# --- local attention against the dense band mask ----------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    length=st.integers(1, 23),
    window=st.integers(1, 6),
    causal=st.booleans(),
    kv_heads=st.sampled_from([4, 2, 1]),
    pads=st.tuples(st.integers(0, 22), st.integers(0, 22)),
    seed=st.integers(0, 1000),
)
def test_local_attention_is_dense_attention_with_the_band_mask(
    length: int, window: int, causal: bool, kv_heads: int, pads: tuple[int, int], seed: int
) -> None:
    """Block by block == `attention` with `band_keep` (and each query seeing itself), for every
    window (1 included), lengths that are no multiple of it, padding keys and shared K/V
    heads; padding queries included (they see themselves)."""
    g = torch.Generator().manual_seed(seed)
    B, H, K = 2, 4, 8
    q = torch.randn(B, H, length, K, generator=g)
    k, v = (torch.randn(B, kv_heads, length, K, generator=g) for _ in range(2))
    real_BS = (
        torch.arange(length)[None, :] < torch.tensor([length - p % length for p in pads])[:, None]
    )
    keep_B11S = real_BS[:, None, None, :]
    dist = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    dense_keep = (band_keep(dist, window, causal) & keep_B11S) | (dist == 0)
    want, _ = attention(q, k, v, dense_keep)
    got = local_attention(q, k, v, window, causal=causal, keep_B11S=keep_B11S)
    close(got, want)
    close(local_attention(q, k, v, window, causal=causal), attention(
        q, k, v, band_keep(dist, window, causal) | (dist == 0))[0])  # fmt: skip


# --- grouped-query attention ------------------------------------------------------------------


@torch.no_grad()
def test_caches_hold_the_kv_heads_only() -> None:
    """(B, J, slots, K) self and cross K/V; with J = H / 4 a quarter of the paper's bytes."""
    src = right_padded([9, 5], seed=13)

    def cache_bytes(name: str) -> tuple[int, int]:
        lm, mt = built("lm", name), built("mt", name)
        J = lm.cfg.n_kv_heads
        lm_cache = lm.init_cache(lm.encode(src), 8)
        mt_cache = mt.init_cache(mt.encode(src), 8)
        for buffers, slots in [(lm_cache.self_k + lm_cache.self_v, 8 + 8),
                               (mt_cache.self_k + mt_cache.self_v, 8),
                               (mt_cache.cross_k + mt_cache.cross_v, 9)]:  # fmt: skip
            assert all(b.shape == (2, J, slots, 8) for b in buffers)
        mt_all = mt_cache.self_k + mt_cache.self_v + mt_cache.cross_k + mt_cache.cross_v
        lm_all = lm_cache.self_k + lm_cache.self_v
        return sum(b.nbytes for b in lm_all), sum(b.nbytes for b in mt_all)

    paper, kv2, kv1 = cache_bytes("paper"), cache_bytes("kv2"), cache_bytes("kv1")
    assert [4 * b for b in kv1] == list(paper) and [2 * b for b in kv2] == list(paper)


def repeat_kv_weights(grouped: torch.nn.Module, paper: torch.nn.Module) -> None:
    """Copy `grouped`'s weights into `paper` (the same config with kv_heads = n_heads), each
    query head h given a copy of K/V head h // (H / J) (Hugging Face's repeat_kv)."""
    state = grouped.state_dict()
    H, K = grouped.cfg.n_heads, grouped.cfg.d_k
    J, D = grouped.cfg.n_kv_heads, grouped.cfg.d_model
    heads = torch.arange(H) // (H // J)
    for name, w in list(state.items()):
        if not name.endswith("in_proj.weight") and not name.endswith("in_proj.bias"):
            continue
        q, kk, vv = w.split((D, J * K, J * K))
        kk = kk.reshape(J, K, *w.shape[1:])[heads].reshape(H * K, *w.shape[1:])
        vv = vv.reshape(J, K, *w.shape[1:])[heads].reshape(H * K, *w.shape[1:])
        state[name] = torch.cat([q, kk, vv])
    paper.load_state_dict(state)


@pytest.mark.parametrize("name", ["kv2", "kv1", "llama_mqa"])
@torch.no_grad()
def test_shared_kv_heads_are_the_papers_heads_holding_copies(name: str) -> None:
    """A GQA model is the paper's block whose query heads h read copies of K/V head
    h // (H / J); and kv_heads = n_heads is the paper's block itself (same weights, same
    function)."""
    x, src = ids(2, 12, seed=14), right_padded([12, 7], seed=15)
    for arch in ["lm", "mt"]:
        grouped = built(arch, name)
        full_cfg = ModelConfig(**{**TINY, **LM_SWITCHES[name], "kv_heads": 4})
        paper = (DecoderLM if arch == "lm" else Transformer)(full_cfg).eval()
        repeat_kv_weights(grouped, paper)
        inputs = (x,) if arch == "lm" else (src, x)
        close(paper(*inputs), grouped(*inputs))
    same = Transformer(ModelConfig(**{**TINY, "kv_heads": 4})).eval()
    same.load_state_dict(built("mt", "paper").state_dict())
    close(same(src, x), built("mt", "paper")(src, x), 0.0)


# --- RoPE --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [1, 7, 300])
def test_rope_scores_depend_on_the_distance_only_and_rotation_keeps_norms(shift: int) -> None:
    g = torch.Generator().manual_seed(shift)
    q, k = torch.randn(2, 4, 10, 8, generator=g), torch.randn(2, 4, 10, 8, generator=g)
    pos = torch.arange(10)

    def scores(offset: int) -> Tensor:
        cos, sin = rope_angles(pos + offset, 8)
        return rotate(q, cos, sin) @ rotate(k, cos, sin).transpose(-2, -1)

    close(scores(shift), scores(0), 1e-4 * (1 + shift / 100))  # fp32 angles of pos ~300
    cos, sin = rope_angles(pos + shift, 8)
    close(rotate(q, cos, sin).norm(dim=-1), q.norm(dim=-1), 1e-5)
    assert not torch.allclose(scores(0), q @ k.transpose(-2, -1), atol=1e-2)  # it turns


@torch.no_grad()
def test_rope_in_the_model_turns_self_attention_only_and_keeps_norms() -> None:
    model = built("mt", "rope")
    with tracing() as trace:
        model(right_padded([9, 6]), ids(2, 8))
    names = trace.tensors
    for prefix in ["encoder.layers.0.self_attn", "decoder.layers.1.self_attn"]:
        close(names[f"{prefix}.q"].norm(dim=-1), names[f"{prefix}.q_unrotated"].norm(dim=-1))
        close(names[f"{prefix}.k"].norm(dim=-1), names[f"{prefix}.k_unrotated"].norm(dim=-1))
    assert not any("cross_attn.q_unrotated" in n for n in names)  # cross-attention: unturned


# --- the other switches' own definitions ------------------------------------------------------


@torch.no_grad()
def test_rmsnorm_qk_norm_and_bias_are_what_they_say() -> None:
    x = torch.randn(3, 5, 32)
    rms = make_norm(cfg_of("rmsnorm"))
    close(rms(x), x / (x.square().mean(-1, keepdim=True) + 1e-5).sqrt())
    model = built("lm", "qk_norm")
    with tracing() as trace:
        model(ids(2, 9))
    q_raw = trace.tensors["decoder.layers.0.self_attn.q_raw"]
    q = trace.tensors["decoder.layers.0.self_attn.q"]  # sinusoidal: q is the normed q_raw
    mean, var = q_raw.mean(-1, keepdim=True), q_raw.var(-1, correction=0, keepdim=True)
    close(q, (q_raw - mean) / (var + 1e-5).sqrt())
    no_bias = built("lm", "no_bias")
    layer = no_bias.decoder.layers[0]
    linears = [layer.self_attn.in_proj, layer.self_attn.out_proj, layer.ffn.w_1, layer.ffn.w_2]
    assert all(lin.bias is None for lin in linears)


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_a_gated_ffn_matching_parameters_holds_the_papers_count(activation: str) -> None:
    """Three matrices of 2/3 d_ff hold what the paper's two of d_ff hold (rounding aside)."""
    paper, gated = built("lm", "paper"), built("lm", f"{activation}_matched")
    assert gated.cfg.d_hidden == round(2 * 64 / 3) == 43
    ffn = gated.decoder.layers[0].ffn
    assert ffn.w_1.out_features == ffn.w_3.out_features == ffn.w_2.in_features == 43
    count = [sum(p.numel() for p in m.decoder.layers[0].ffn.parameters()) for m in (paper, gated)]
    assert abs(count[1] / count[0] - 1) < 0.02


# --- configs no model can be built from -------------------------------------------------------


@pytest.mark.parametrize(
    ("switches", "message"),
    [
        ({"kv_heads": 3}, "kv_heads=3 must divide n_heads=4"),
        ({"kv_heads": 8}, "kv_heads=8 must divide n_heads=4"),
        ({"attn_window": -1}, "attn_window=-1: a window holds at least 1 position"),
        ({"positional": "rope", "d_model": 12}, "head size d_model / n_heads = 3 must be even"),
        ({"positional": "alibi+learned"}, "positional='alibi+learned': choose 'sinusoidal'"),
        ({"positional": "relative"}, "positional='relative': choose"),
    ],
)
def test_bad_configs_are_one_line_errors_at_construction(
    switches: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        ModelConfig(**{**TINY, **switches})
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "build",
    [Transformer, lambda cfg: EncoderClassifier(cfg, 2), EncoderMLM],
    ids=["Transformer", "EncoderClassifier", "EncoderMLM"],
)
def test_an_encoder_without_positions_is_refused(build: Any) -> None:
    cfg = ModelConfig(**{**TINY, "positional": "none"})
    with pytest.raises(ConfigError) as error:
        build(cfg)
    text = str(error.value)
    assert "\n" not in text and text.endswith(
        "positional='none' is for a decoder-only model: an encoder without positions sees its "
        "input as a bag of tokens"
    )
    DecoderLM(cfg)  # the one architecture it is for


# --- the switches through the trainer ---------------------------------------------------------


@pytest.mark.parametrize("positional", ["rope", "none"])
def test_aiayn_train_takes_the_switches_and_the_saved_model_generates(
    tmp_path: Any, positional: str
) -> None:
    """`aiayn train` with LLaMA's switches and a window (a few steps of a tiny LM on a text),
    saved, reloaded as the same architecture, and generating past its window. No positions at
    all is a decoder-only model's choice, which the run's checks must not refuse."""
    from aiayn.cli.main import main
    from aiayn.generate.generator import Generator
    from aiayn.store.model_dir import load_model_dir

    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: the cat sat on the mat.\n" for i in range(200)))
    out = tmp_path / "run"
    sets = {
        "model.positional": positional, "model.norm": "rmsnorm", "model.activation": "swiglu",
        "model.kv_heads": 2, "model.attn_window": 8, "model.d_model": 32, "model.n_heads": 4,
        "model.n_layers": 2, "model.d_ff": 64, "model.max_len": 32, "train.text": text,
        "train.out_dir": out, "train.max_steps": 4, "train.max_minutes": 0,
        "train.lr_schedule": "constant", "train.lr": 1e-3, "train.batch_size": 4,
        "train.valid_every": 0, "train.save_every": 4, "train.average_last": 0,
        "train.threads": 1, "train.device": "cpu", "train.dtype": "fp32",
    }  # fmt: skip
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    assert main(["train", "--config", "lm", "--no-progress", *args]) == 0
    model = load_model_dir(out)
    assert isinstance(model, DecoderLM)
    switches = {k: getattr(model.cfg, k) for k in ["positional", "norm", "activation"]}
    assert switches == {"positional": positional, "norm": "rmsnorm", "activation": "swiglu"}
    assert (model.cfg.n_kv_heads, model.cfg.attn_window) == (2, 8)
    generated = Generator.load(out, device="cpu").generate(
        ["line 1", "the"], max_tokens=20, sample=False, min_len=20
    )
    assert [len(g) for g in generated] == [20, 20]  # characters: past the window of 8
