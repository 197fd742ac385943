"""Search: scripted-probability beam search (fairseq-style), cache parity, invariances, the
step observer (what it reports, and that observing changes nothing)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig, ModelConfig
from aiayn.errors import ConfigError
from aiayn.nn.kv_cache import KVCache, Memory
from aiayn.nn.model import Transformer
from aiayn.search.decode import beam_search, greedy_decode, greedy_search, sample_search, search
from aiayn.search.hypothesis import Hypothesis, length_penalty
from aiayn.search.limits import max_output_lengths
from aiayn.search.sampling import sample_seed, top_k_filter, top_p_filter
from aiayn.search.step_view import StepView
from aiayn.text.batches import padding_parts

A, B_, C = 4, 5, 6  # the fake model's word ids
V_FAKE = 7

# Next-token probabilities of each sentence (keyed by its first source token) after each prefix.
# Chosen without ties among the candidates that matter; the expected searches are worked out
# by hand in `test_beam_search_scripted`.
TABLES: dict[int, dict[tuple[int, ...], dict[int, float]]] = {
    A: {  # sentence 0
        (): {EOS_ID: 0.1, A: 0.5, B_: 0.4},
        (A,): {EOS_ID: 0.4, A: 0.35, B_: 0.25},
        (B_,): {EOS_ID: 0.1, A: 0.8, B_: 0.1},
        (B_, A): {EOS_ID: 0.5625, A: 0.25, B_: 0.1875},
        (A, A): {EOS_ID: 0.3, A: 0.5, B_: 0.2},
    },
    B_: {  # sentence 1: runs into its length limit of 4
        (): {EOS_ID: 0.1, A: 0.6, B_: 0.3},
        (A,): {EOS_ID: 0.1, A: 0.5, B_: 0.4},
        (B_,): {EOS_ID: 0.05, A: 0.7, B_: 0.25},
        (A, A): {EOS_ID: 0.25, A: 0.4, B_: 0.35},
        (A, B_): {EOS_ID: 0.2, A: 0.45, B_: 0.35},
        (A, A, A): {EOS_ID: 0.3, A: 0.5, B_: 0.2},
        (A, B_, A): {EOS_ID: 0.4, A: 0.35, B_: 0.25},
    },
}


class TableModel(nn.Module):
    """A fake model with the narrow decoding interface whose probabilities come from TABLES.

    It keeps each row's token history in the (real) KVCache, so a search that reorders the
    cache wrongly asks for the wrong prefix, and it fails if a row that ended is extended.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cfg = ModelConfig(vocab_size=V_FAKE, d_model=8, n_heads=2)
        self.calls = 0

    def encode(self, src_BS: torch.Tensor) -> Memory:
        return Memory(src_BS.float()[:, :, None], src_BS != PAD_ID)

    def init_cache(self, memory: Memory, capacity: int) -> KVCache:
        B = memory.out_BSD.size(0)
        hist = torch.zeros(B, 1, capacity, 1)
        sent = memory.out_BSD[:, None, :1, :]
        return KVCache([hist], [hist.clone()], [sent], [sent.clone()], 0)

    def decode_step(self, tokens_BT: torch.Tensor, memory: Memory, cache: KVCache):
        self.calls += 1
        k = tokens_BT.float()[:, None, :, None]
        hist_BHLK, _ = cache.append_self(0, k, k)
        cache.length += tokens_BT.size(1)
        logits_BV = torch.full((tokens_BT.size(0), V_FAKE), float("-inf"))
        for r in range(tokens_BT.size(0)):
            ids = [int(x) for x in hist_BHLK[r, 0, :, 0]]
            assert ids[0] == BOS_ID
            assert EOS_ID not in ids, f"row {r} extended after EOS: {ids}"
            sent = int(cache.cross_k[0][r, 0, 0, 0])  # a cached step reads only memory's mask
            assert memory.keep_BS.size(0) == tokens_BT.size(0), "memory rows out of sync"
            for tok, p in TABLES[sent][tuple(ids[1:])].items():
                logits_BV[r, tok] = math.log(p)
        return logits_BV, cache


# Sentence 0 may be 5 tokens long, sentence 1 only 4 (max_len = 1 * src_len + 0).
SRC = torch.tensor([[A, 7, 7, 7, EOS_ID], [B_, 7, 7, EOS_ID, PAD_ID]])
SCRIPTED = DecodeConfig(beam_size=2, nbest=2, max_len_a=1.0, max_len_b=0)


@pytest.mark.parametrize(("alpha", "form"), [(0.0, "gnmt"), (0.6, "gnmt"), (1.0, "power")])
def test_beam_search_scripted(alpha: float, form: str) -> None:
    # Sentence 0. Step 0: A .5, B .4 live. Step 1: B A .32, A EOS .2 (ends: [A]), A A .175,
    # A B .125 -> live B A, A A. Step 2: B A EOS .18 (ends: [B A]), A A A .0875 -> 2 ended, done.
    # Sentence 1. Step 1: A A .3, A B .24 live. Step 2: A A A .12, A B A .108 live.
    # Step 3 (the limit, 4): A A A A .06 ends without EOS, A B A EOS .0432 ends.
    model = TableModel()
    cfg = DecodeConfig(**{**SCRIPTED.__dict__, "alpha": alpha, "length_penalty": form})
    got = beam_search(model, SRC, cfg)
    lp = lambda n: length_penalty(n, alpha, form)  # noqa: E731
    expected = [
        [([A], math.log(0.2), 2, True), ([B_, A], math.log(0.18), 3, True)],
        [([A, A, A, A], math.log(0.06), 4, False), ([A, B_, A], math.log(0.0432), 4, True)],
    ]
    for hyps, exp in zip(got, expected, strict=True):
        exp = sorted(exp, key=lambda e: -e[1] / lp(e[2]))
        assert [h.tokens for h in hyps] == [e[0] for e in exp]
        assert [h.eos for h in hyps] == [e[3] for e in exp]
        for h, (_, log_p, n, _) in zip(hyps, exp, strict=True):
            assert h.log_prob == pytest.approx(log_p, abs=1e-6)
            assert h.score == pytest.approx(log_p / lp(n), abs=1e-6)
    # The length penalty changes the ranking of sentence 0: short [A] wins only without it.
    assert got[0][0].tokens == ([A] if alpha == 0.0 else [B_, A])


def test_beam_observer_reports_the_scripted_decisions() -> None:
    views: list[StepView] = []
    got = beam_search(TableModel(), SRC, SCRIPTED, on_step=views.append)
    assert [v.t for v in views] == [0, 1, 2, 3] and all(v.search == "beam" for v in views)

    def fates(t: int, sent: int) -> list[tuple[tuple[int, ...], str, str]]:
        v = views[t]
        return [
            ((*v.live[c.parent].tokens, c.token), c.fate, c.why)
            for c in v.candidates
            if c.sent == sent
        ]

    # Sentence 0, step 1 (worked out in test_beam_search_scripted): 2N = 4 candidates.
    assert fates(1, 0) == [
        ((B_, A), "live", "beam slot 1 of 2"),
        ((A, EOS_ID), "finished", "eos"),
        ((A, A), "live", "beam slot 2 of 2"),
        ((A, B_), "pruned", "beam full"),
    ]
    # Step 2: [B A] ends, the second hypothesis: early termination drops the live ones.
    assert fates(2, 0)[:3] == [
        ((B_, A, EOS_ID), "finished", "eos"),
        ((A, A, A), "pruned", "early termination"),
        ((B_, A, A), "pruned", "early termination"),
    ]
    assert (0, "beam full") in views[2].done
    # Sentence 1 reaches its limit of 4 at step 3: its two best end there, with or without EOS.
    assert [f for f in fates(3, 1) if f[1] == "finished"] == [
        ((A, A, A, A), "finished", "length limit"),
        ((A, B_, A, EOS_ID), "finished", "eos"),
    ]
    assert views[3].done == ((1, "length limit"),)
    # Live hypotheses carry the scores the search kept; finished ones are the returned ones.
    v1 = views[1]
    assert [h.tokens for h in v1.live] == [(A,), (B_,), (A,), (B_,)]
    assert v1.live[0].log_prob == pytest.approx(math.log(0.5))
    for s, hyps in enumerate(got):
        ended = [f.hyp for v in views for f in v.finished if f.sent == s]
        assert sorted(ended, key=lambda h: -h.score) == hyps


def test_greedy_scripted_and_beam_one() -> None:
    cfg = DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=0)
    greedy = greedy_search(TableModel(), SRC, cfg)
    # Sentence 0: A (.5), then EOS (.4). Sentence 1: A, A, A, A, cut at its limit of 4.
    assert [h.tokens for h in greedy] == [[A], [A, A, A, A]]
    assert [h.eos for h in greedy] == [True, False]
    assert greedy[0].log_prob == pytest.approx(math.log(0.2))
    assert greedy[1].log_prob == pytest.approx(math.log(0.6 * 0.5 * 0.4 * 0.5))
    beam1 = [b[0] for b in beam_search(TableModel(), SRC, cfg)]
    assert [(b.tokens, b.eos) for b in beam1] == [(g.tokens, g.eos) for g in greedy]
    for b, g in zip(beam1, greedy, strict=True):
        assert b.log_prob == pytest.approx(g.log_prob, abs=1e-6)


def test_min_len_forbids_early_eos() -> None:
    cfg = DecodeConfig(beam_size=2, nbest=2, max_len_a=1.0, max_len_b=0, min_len=3)
    with pytest.raises(KeyError):  # sentence 0 must now go past the prefixes in its table
        beam_search(TableModel(), SRC, cfg)
    hyps = beam_search(TableModel(), SRC[1:], cfg)[0]
    assert all(len(h.tokens) >= 3 for h in hyps)


def test_pure_functions() -> None:
    assert length_penalty(1, 0.6, "gnmt") == 1.0
    assert length_penalty(7, 0.6, "gnmt") == pytest.approx(2.0**0.6)
    assert length_penalty(30, 0.0, "gnmt") == 1.0
    assert length_penalty(7, 1.0, "power") == 7.0  # fmt: skip
    assert length_penalty(0, 1.0, "power") == 1.0  # an empty live hypothesis: no 0 to divide by
    lengths = max_output_lengths(torch.tensor([1, 10, 2000]), 1.0, 50, 1024)
    assert lengths.tolist() == [51, 60, 1024]
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    inf = float("-inf")
    assert top_p_filter(logits, 0.7).isinf().tolist() == [[False, False, True, True]]
    assert top_p_filter(logits, 0.5).isinf().tolist() == [[False, True, True, True]]
    assert top_p_filter(logits, 0.81).isinf().tolist() == [[False, False, False, True]]
    assert top_k_filter(logits, 2)[0, 2:].tolist() == [inf, inf]
    assert torch.equal(top_k_filter(logits, 0), logits)


def test_bad_settings_are_config_errors() -> None:
    wider_than_vocab = DecodeConfig(beam_size=V_FAKE + 1)  # was an IndexError in scatter_
    overflowing = (
        DecodeConfig(beam_size=2, alpha=1e308),  # OverflowError in the penalty
        DecodeConfig(min_len=2**63),  # past int64: OverflowError in a tensor
        DecodeConfig(max_len_b=2**63),
    )
    for cfg in (DecodeConfig(beam_size=0), DecodeConfig(nbest=5), DecodeConfig(top_p=0.0),
                wider_than_vocab, *overflowing):  # fmt: skip
        with pytest.raises(ConfigError):
            search(TableModel(), SRC, cfg)


# --- a real (random) Transformer ------------------------------------------------------------------

VOCAB = 40


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("cpu_tiny", vocab_size=VOCAB, d_model=32, d_ff=64, max_len=64)
    return Transformer(cfg).eval()


def random_batch(lengths: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD_ID)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(4, VOCAB, (n - 1,), generator=g)
        src[i, n - 1] = EOS_ID
    return src


def test_cached_equals_uncached(model: Transformer) -> None:
    src = random_batch([7, 3, 5], seed=1)
    cfg = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=12)
    cached = greedy_search(model, src, cfg)
    uncached = greedy_search(model, src, cfg, use_cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in uncached]
    for c, u in zip(cached, uncached, strict=True):
        assert c.log_prob == pytest.approx(u.log_prob, abs=1e-5)
    # Step logits through the cache == the full decoder's logits at every position.
    with torch.inference_mode():
        memory = model.encode(src)
        tgt = torch.tensor([[BOS_ID, *h.tokens[:6]] for h in cached])
        full_BTV = model.decode(tgt, memory)
        cache = model.init_cache(memory, tgt.size(1))
        for t in range(tgt.size(1)):
            step_BV, cache = model.decode_step(tgt[:, t : t + 1], memory, cache)
            torch.testing.assert_close(step_BV, full_BTV[:, t], rtol=1e-5, atol=1e-5)


def test_beam_one_equals_greedy(model: Transformer) -> None:
    src = random_batch([9, 4, 6, 2], seed=2)
    cfg = DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=5)
    greedy = greedy_search(model, src, cfg)
    beam = beam_search(model, src, cfg)
    assert [b[0].tokens for b in beam] == [g.tokens for g in greedy]
    for b, g in zip(beam, greedy, strict=True):
        assert b[0].log_prob == pytest.approx(g.log_prob, abs=1e-5)
    assert greedy_decode(model, src, max_len=10) == [
        h.tokens for h in greedy_search(model, src, DecodeConfig(max_len_a=0, max_len_b=10))
    ]


@settings(max_examples=6, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(1, 12), min_size=2, max_size=5), seed=st.integers(0, 999))
def test_batch_invariance(model: Transformer, lengths: list[int], seed: int) -> None:
    src = random_batch(lengths, seed)
    for cfg in (
        DecodeConfig(beam_size=1, max_len_b=8),
        DecodeConfig(beam_size=3, nbest=2, max_len_b=10),
    ):
        batched = search(model, src, cfg)
        for i, n in enumerate(lengths):
            alone = search(model, src[i : i + 1, :n], cfg)[0]
            assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
            for a, b in zip(alone, batched[i], strict=True):
                assert a.score == pytest.approx(b.score, abs=1e-4)


def test_nbest_sorted_and_distinct(model: Transformer) -> None:
    src = random_batch([6, 8], seed=3)
    for hyps in beam_search(model, src, DecodeConfig(beam_size=4, nbest=4, max_len_b=6)):
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4


def test_sampling_is_seeded(model: Transformer) -> None:
    src = random_batch([6, 8, 3], seed=4)
    cfg = DecodeConfig(sample=True, nbest=2, temperature=1.5, top_p=0.95, max_len_b=10)
    first = sample_search(model, src, cfg)
    assert sample_search(model, src, cfg) == first
    other = sample_search(model, src, DecodeConfig(**{**cfg.__dict__, "seed": 7}))
    assert other != first
    # top-k = 1 leaves one token per step: sampling collapses to greedy.
    greedy = greedy_search(model, src, DecodeConfig(max_len_b=10))
    top1 = sample_search(model, src, DecodeConfig(sample=True, top_k=1, max_len_b=10))
    assert [s[0].tokens for s in top1] == [g.tokens for g in greedy]


def test_decode_restores_training_mode(model: Transformer) -> None:
    model.train()
    try:
        greedy_decode(model, random_batch([4], seed=5), max_len=3)
        assert model.training
    finally:
        model.eval()


# --- the step observer on a real model ------------------------------------------------------------


def _observed(model: Transformer, src: torch.Tensor, cfg: DecodeConfig):
    views: list[StepView] = []
    return search(model, src, cfg, on_step=views.append), views


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(1, 10), min_size=1, max_size=4),
    seed=st.integers(0, 999),
    kind=st.sampled_from(["greedy", "beam", "sample"]),
    alpha=st.sampled_from([0.0, 0.6, 1.0]),
    min_len=st.integers(0, 2),
)
def test_observing_changes_nothing_and_reports_what_was_returned(
    model: Transformer, lengths: list[int], seed: int, kind: str, alpha: float, min_len: int
) -> None:
    src = random_batch(lengths, seed)
    cfg = DecodeConfig(
        beam_size=3 if kind == "beam" else 1, nbest=2 if kind != "greedy" else 1,
        sample=kind == "sample", alpha=alpha, min_len=min_len, max_len_a=0.5, max_len_b=4,
        top_p=0.9, seed=seed,
    )  # fmt: skip
    plain = search(model, src, cfg)
    observed, views = _observed(model, src, cfg)
    assert observed == plain
    assert [v.t for v in views] == list(range(len(views)))
    for v in views:
        assert v.logits_RV.shape[0] == v.log_probs_RV.shape[0] == len(v.live)
        assert all(c.fate in ("live", "finished", "pruned") for c in v.candidates)
    for s, hyps in enumerate(plain):
        ended = sorted(
            (f.hyp for v in views for f in v.finished if f.sent == s), key=lambda h: -h.score
        )
        assert ended[: len(hyps)] == hyps
        assert sum(d[0] == s for v in views for d in v.done) == 1  # each sentence ends once
    for before, after in itertools.pairwise(views):
        kept = [c for c in before.candidates if c.fate == "live"]
        assert [c.log_prob for c in kept] == [h.log_prob for h in after.live]


def test_greedy_observer_sees_the_chosen_token_and_its_distribution(model: Transformer) -> None:
    src = random_batch([5, 7], seed=6)
    cfg = DecodeConfig(beam_size=1, max_len_b=5)
    (hyps, views) = _observed(model, src, cfg)
    for v in views:
        for c in v.candidates:
            row_V = v.log_probs_RV[c.parent]
            assert c.token == int(row_V.argmax())
            assert bool(row_V[[PAD_ID, BOS_ID]].isinf().all())  # banned, as the search bans them
    for s, hyp in enumerate(h[0] for h in hyps):
        chosen = [c.token for v in views for c in v.candidates if c.sent == s]
        assert chosen == hyp.tokens + ([EOS_ID] if hyp.eos else [])


# --- sampling does not depend on batching ---------------------------------------------------------


def _same(a: list[list[Hypothesis]], b: list[list[Hypothesis]]) -> None:
    """Same tokens; scores equal up to float noise (a padded batch sums in another order)."""
    assert [[(h.tokens, h.eos) for h in hs] for hs in a] == [
        [(h.tokens, h.eos) for h in hs] for hs in b
    ]
    for x, y in zip(itertools.chain(*a), itertools.chain(*b), strict=True):
        assert x.score == pytest.approx(y.score, abs=1e-4)


def test_sampling_is_batch_invariant(model: Transformer) -> None:
    lengths = [6, 3, 9, 4]
    src = random_batch(lengths, seed=7)
    cfg = DecodeConfig(sample=True, nbest=3, temperature=1.3, max_len_b=8, seed=11)
    seeds = [sample_seed(cfg.seed, line) for line in (5, 6, 7, 8)]
    batched = sample_search(model, src, cfg, row_seeds=seeds)
    for i, n in enumerate(lengths):
        alone = sample_search(model, src[i : i + 1, :n], cfg, row_seeds=seeds[i : i + 1])
        _same(alone, batched[i : i + 1])
    # Reversed order (another batch composition) changes nothing either.
    _same(sample_search(model, src.flip(0), cfg, row_seeds=seeds[::-1])[::-1], batched)
    # By default every sentence samples as "line 1".
    line1 = sample_search(model, src[:1], cfg, row_seeds=[sample_seed(11, 1)])
    assert sample_search(model, src[:1], cfg) == line1


@pytest.mark.parametrize("edge", [{"temperature": 5e-324}, {"top_p": 5e-324}, {"top_p": 1e-12}])
def test_vanishing_temperature_or_top_p_is_greedy_not_nan(model: Transformer, edge) -> None:
    """A temperature or top_p that rounds to 0 in float32 once gave NaN rows and PAD tokens
    with -inf scores (found by fuzzing the server): both limits are greedy search."""
    src = random_batch([6, 8, 3], seed=4)
    greedy = greedy_search(model, src, DecodeConfig(max_len_b=10))
    sampled = sample_search(model, src, DecodeConfig(sample=True, max_len_b=10, **edge))
    assert [s[0].tokens for s in sampled] == [g.tokens for g in greedy]
    assert all(math.isfinite(s[0].log_prob) for s in sampled)


def test_max_tokens_caps_every_sentence_and_nothing_else(model: Transformer) -> None:
    src = random_batch([6, 8, 3], seed=4)
    free = greedy_search(model, src, DecodeConfig(max_len_b=20))
    capped = greedy_search(model, src, DecodeConfig(max_len_b=20, max_tokens=5))
    for f, c in zip(free, capped, strict=True):
        assert c.tokens == f.tokens[:5] and len(c.tokens) <= 5
    beams = beam_search(model, src, DecodeConfig(beam_size=3, max_len_b=20, max_tokens=4))
    assert all(len(h.tokens) <= 4 for hyps in beams for h in hyps)


def test_sample_seed_mixes_seed_and_line() -> None:
    seeds = {sample_seed(s, line) for s in range(4) for line in range(1, 50)}
    assert len(seeds) == 4 * 49 and all(0 <= x < 2**63 for x in seeds)


# --- special ids come from the model --------------------------------------------------------------


class Permuted(nn.Module):
    """`model` with its vocabulary permuted: id v of the model is id perm[v] here, so PAD, BOS
    and EOS get other ids (as in a Marian vocabulary). Searching it must give the permuted
    output of searching `model` if the search reads the special ids from `cfg`."""

    def __init__(self, model: Transformer, perm: torch.Tensor) -> None:
        super().__init__()
        self.inner, self.perm, self.inv = model, perm, perm.argsort()
        c = model.cfg
        self.cfg = dataclasses.replace(
            c, pad_id=int(perm[c.pad_id]), bos_id=int(perm[c.bos_id]), eos_id=int(perm[c.eos_id])
        )

    def encode(self, src_BS: torch.Tensor) -> Memory:
        return self.inner.encode(self.inv[src_BS])

    def init_cache(self, memory: Memory, capacity: int) -> KVCache:
        return self.inner.init_cache(memory, capacity)

    def decode_step(self, tokens_BT: torch.Tensor, memory: Memory, cache: KVCache):
        logits_BV, cache = self.inner.decode_step(self.inv[tokens_BT], memory, cache)
        return logits_BV[:, self.inv], cache


def test_special_ids_come_from_the_model(model: Transformer) -> None:
    perm = torch.arange(VOCAB).roll(5).flip(0)  # pad 0 -> 34, bos 2 -> 32, eos 3 -> 31
    permuted = Permuted(model, perm)
    assert (permuted.cfg.pad_id, permuted.cfg.eos_id) != (PAD_ID, EOS_ID)
    src = random_batch([6, 3, 8], seed=8)
    for cfg in (DecodeConfig(beam_size=1, max_len_b=6), DecodeConfig(beam_size=3, nbest=3)):
        ref = search(model, src, cfg)
        got = search(permuted, perm[src], cfg)
        for r_hyps, g_hyps in zip(ref, got, strict=True):
            assert [[int(perm[x]) for x in h.tokens] for h in r_hyps] == [h.tokens for h in g_hyps]
            assert [h.eos for h in r_hyps] == [h.eos for h in g_hyps]
            for r, g in zip(r_hyps, g_hyps, strict=True):
                assert g.score == pytest.approx(r.score, abs=1e-5)


@pytest.fixture(scope="module")
def eos_model() -> Transformer:
    """A tiny model whose EOS bias makes some rows end at EOS at once and others run to their
    limit, so rows leave a running search at different steps."""
    torch.manual_seed(0)
    cfg = ModelConfig.preset(
        "cpu_tiny", vocab_size=VOCAB, d_model=32, d_ff=64, max_len=64, logits_bias=True
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():
        model.generator.bias.zero_()
        model.generator.bias[EOS_ID] = 1.7
    return model


def feed_arrivals(
    run: Any,
    src: torch.Tensor,
    joins: list[int],
    drop_at: tuple[int, int] | None,
    split_first: bool = False,
    after_step: Callable[[], None] = lambda: None,
    slack: int | None = None,
) -> tuple[dict[int, Any], int | None]:
    """Run a steppable search (`RowSearch`, `BeamSearch`) as a server feeds it: sentence i of
    `src` joins at step `joins[i]` (an idle search takes the next arrival at once), the
    sentence admitted `drop_at[0]`-th is dropped at step `drop_at[1]`; `split_first` adds the
    first arrivals in two `add`s before any step. With `slack`, an `add` passes its sentences
    in parts of similar length, each trimmed to its longest (`padding_parts`), as the server
    does. Returns what each sentence ended with, and the dropped one (each ends once, never
    after its drop)."""
    order: list[int] = []
    got: dict[int, Any] = {}
    pending = sorted(range(src.size(0)), key=lambda i: joins[i])
    dropped = None
    with torch.inference_mode():
        step = 0
        while pending or run.live:
            now = [i for i in pending if joins[i] <= step]
            if not now and not run.live:
                now = pending[:1]
            if now:
                pending = [i for i in pending if i not in now]
                parts = [now[:1], now[1:]] if split_first and step == 0 else [now]
                for part in filter(None, parts):
                    if slack is None:
                        run.add(src[part])
                    else:
                        n = [int((src[i] != PAD_ID).sum()) for i in part]
                        cut = padding_parts(n, slack)
                        run.add(*[src[[part[j] for j in c], : n[c[0]]] for c in cut])
                        part = [part[j] for c in cut for j in c]  # the rows' order
                    order += part
            if drop_at is not None and drop_at[1] == step and drop_at[0] < len(order):
                dropped = order[drop_at[0]]
                run.drop({drop_at[0]})
            for row, found in run.step():
                assert order[row] != dropped and order[row] not in got
                got[order[row]] = found
            step += 1
            after_step()
    return got, dropped


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=2, max_size=7),
    joins=st.lists(st.integers(0, 8), min_size=7, max_size=7),
    min_len=st.integers(0, 1),
    seed=st.integers(0, 10_000),
    drop_at=st.one_of(st.none(), st.tuples(st.integers(0, 6), st.integers(0, 8))),
    slack=st.sampled_from([None, 0, 3]),
)
def test_rows_that_join_a_running_search_get_what_they_get_alone(
    eos_model: Transformer,
    lengths: list[int],
    joins: list[int],
    min_len: int,
    seed: int,
    drop_at: tuple[int, int] | None,
    slack: int | None,
) -> None:
    """Continuous batching: sentences admitted at later steps (their cache rows joining at the
    current column, in the slots of rows that ended) end with the hypotheses greedy search
    gives them in a batch of their own, whatever row is dropped meanwhile (`drop_at`: that
    sentence, at that step), and whether an admission is encoded as one batch or in parts of
    similar length (`slack`)."""
    from aiayn.search.row_search import RowSearch

    src = random_batch(lengths, seed)
    cfg = DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=4, min_len=min_len)
    alone = [greedy_search(eos_model, src[i : i + 1], cfg)[0] for i in range(len(lengths))]
    run = RowSearch(eos_model, cfg)

    def only_live_rows() -> None:  # rows that ended or were dropped left at once
        if run.live:
            assert len(run.ids_r) == run.live == run.slots.n == len(set(run.ids_r.tolist()))

    got, dropped = feed_arrivals(run, src, joins, drop_at, after_step=only_live_rows, slack=slack)
    if dropped is not None:
        got.setdefault(dropped, alone[dropped])  # it may have finished before its drop
    assert sorted(got) == list(range(len(lengths)))
    for i, want in enumerate(alone):
        assert (got[i].tokens, got[i].eos) == (want.tokens, want.eos)
        assert got[i].log_prob == pytest.approx(want.log_prob, abs=1e-4)
        assert got[i].score == pytest.approx(want.score, abs=1e-4)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=2, max_size=6),
    joins=st.lists(st.integers(0, 6), min_size=6, max_size=6),
    beam=st.integers(2, 3),
    min_len=st.integers(0, 1),
    alpha=st.sampled_from([0.0, 0.6, 2.0]),
    seed=st.integers(0, 10_000),
    split_first=st.booleans(),
    limits=st.sampled_from([(1.0, 4), (0.5, 0)]),  # (0.5, 0): some end at the first step
    drop_at=st.one_of(st.none(), st.tuples(st.integers(0, 5), st.integers(0, 6))),
    slack=st.sampled_from([None, 0, 3]),
)
def test_sentences_that_join_a_running_beam_search_get_what_they_get_alone(
    eos_model: Transformer,
    lengths: list[int],
    joins: list[int],
    beam: int,
    min_len: int,
    alpha: float,
    seed: int,
    split_first: bool,
    limits: tuple[float, int],
    drop_at: tuple[int, int] | None,
    slack: int | None,
) -> None:
    """Continuous batching for beam search: sentences admitted at later steps (N rows each,
    joining the cache at its current column) end with the N-best lists beam search gives them
    in a batch of their own, whatever sentence is dropped meanwhile, whether or not some end at
    their first step (`limits`), whether an admission is encoded as one batch or in parts
    (`slack`). `split_first`: the first arrivals come in two `add`s before any step (the
    second finds the first not fanned out)."""
    from aiayn.search.beam import BeamSearch

    src = random_batch(lengths, seed)
    cfg = DecodeConfig(beam_size=beam, nbest=beam, max_len_a=limits[0], max_len_b=limits[1],
                       min_len=min_len, alpha=alpha)  # fmt: skip
    alone = [beam_search(eos_model, src[i : i + 1], cfg)[0] for i in range(len(lengths))]
    run = BeamSearch(eos_model, cfg)

    def rows_per_sentence() -> None:  # N rows a live sentence, and no others
        assert run.live == len(run.sents) * beam
        if run.live:
            assert run.tokens_rT.size(0) == run.live == run.cache.self_k[0].size(0)

    got, dropped = feed_arrivals(run, src, joins, drop_at, split_first, rows_per_sentence, slack)
    if dropped is not None:
        got.setdefault(dropped, alone[dropped])  # it may have finished before its drop
    assert sorted(got) == list(range(len(lengths))) and not run.ended
    for i, want in enumerate(alone):
        assert [(h.tokens, h.eos) for h in got[i]] == [(h.tokens, h.eos) for h in want]
        for g, w in zip(got[i], want, strict=True):
            assert g.log_prob == pytest.approx(w.log_prob, abs=1e-4)
            assert g.score == pytest.approx(w.score, abs=1e-4)


def test_joining_rows_take_free_slots_and_steps_skip_the_columns_no_row_sees(
    eos_model: Transformer,
) -> None:
    from aiayn.search.row_search import RowSearch

    cfg = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=6, min_len=6)
    run = RowSearch(eos_model, cfg)
    with torch.inference_mode():
        run.add(random_batch([3], 1))
        for _ in range(3):
            run.step()
        run.cfg = dataclasses.replace(cfg, max_len_b=20)  # a longer limit than the cache has
        run.add(random_batch([4], 2))
        slots = run.slots
        assert slots.buf.start_B[:2].tolist() == [0, 3] and slots.buf.length == 3
        assert slots.buf.self_k[0].size(2) >= 3 + 20  # grown for the newcomer
        finished = [run.step() for _ in range(3)]
        assert [row for f in finished for row, _ in f] == [0]  # the first row's limit: 6
        assert slots.n == 1 and slots.starts == [3] and run.ids_r.tolist() == [1]  # moved up
        R = slots.buf.self_k[0].size(0)
        run.add(random_batch([2], 3))  # into the slot row 0 left: no copy of the buffers
        assert slots.buf.self_k[0].size(0) == R and slots.n == 2 and slots.starts == [3, 6]
        cache, keep = slots.view()  # no row sees columns 0..2: a step reads from column 3
        assert cache.length == 3 and cache.start_B.tolist() == [0, 3]
        assert cache.self_k[0].size(0) == keep.size(0) == 2


def _slot_rows(ids: list[int], S: int, capacity: int = 0) -> tuple[KVCache, torch.Tensor]:
    """A cache of rows `ids` (as `init_cache` makes one) whose cross K/V hold each row's id
    over its S source positions, and their source mask."""
    B = len(ids)
    cross = torch.tensor(ids, dtype=torch.float)[:, None, None, None].expand(B, 1, S, 1)
    self_k = [torch.full((B, 1, capacity, 1), float("nan"))]  # unwritten: never read
    cache = KVCache(self_k, [self_k[0].clone()], [cross.clone()], [cross.clone()], 0)
    return cache, torch.ones(B, S, dtype=torch.bool)


@settings(max_examples=500, deadline=None)
@given(
    first=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 12)),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("step"), st.integers(1, 3)),
            st.tuples(st.just("add"), st.integers(1, 4), st.integers(1, 8), st.integers(1, 8)),
            st.tuples(st.just("remove"), st.integers(0, 2**12)),
        ),
        max_size=25,
    ),
    keep_order=st.booleans(),
)
def test_slot_cache_rows_keep_what_they_wrote(
    first: tuple[int, int, int], ops: list[tuple[Any, ...]], keep_order: bool
) -> None:
    """Through any steps, joins and removals, every live row of a `SlotCache` view holds its own
    cross K/V and source mask and every key it wrote, from its own first column on; what it
    may not look at is finite (a mask weighs it by 0); `keep_order` keeps the rows' order."""
    from aiayn.search.slots import SlotCache

    wrote: dict[int, list[float]] = {}  # by row id: the keys it wrote, in order
    left: dict[int, int] = {}  # by row id: columns it may still write (its limit)
    source: dict[int, int] = {}
    next_id = 1

    def admit(rows: int, S: int, positions: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + rows))
        next_id += rows
        for i in ids:
            wrote[i], left[i], source[i] = [], positions, S
        return ids

    B, S, P = first
    cache, keep = _slot_rows(admit(B, S, P), S, P)
    slots = SlotCache.of(cache, keep)

    def live_ids() -> list[int]:
        view, _ = slots.view()
        return [int(x) for x in view.cross_k[0][:, 0, 0, 0]]

    def check() -> None:
        view, keep_rS = slots.view()
        assert sorted(live_ids()) == sorted(left)
        for r, i in enumerate(live_ids()):
            start = 0 if view.start_B is None else int(view.start_B[r])
            keys = view.self_k[0][r, 0, :, 0]
            assert keys[start : view.length].tolist() == wrote[i]
            assert keys[:start].isfinite().all()
            assert keep_rS[r, : source[i]].all() and not keep_rS[r, source[i] :].any()
            assert (view.cross_k[0][r, 0, : source[i], 0] == i).all()
            assert view.cross_k[0][r].isfinite().all() and view.cross_v[0][r].isfinite().all()

    def remove(dead: list[int]) -> None:
        before = live_ids()
        slots.remove(dead, keep_order=keep_order)
        for r in dead:
            del left[before[r]]
        if keep_order:
            assert live_ids() == [i for r, i in enumerate(before) if r not in dead]

    for op in ops:
        if not left:
            break
        if op[0] == "step":
            for _ in range(op[1]):
                view, _ = slots.view()
                k = torch.tensor([i * 100.0 + len(wrote[i]) for i in live_ids()])[
                    :, None, None, None
                ]
                view.append_self(0, k, k)
                slots.advance()
                for i in live_ids():
                    wrote[i].append(i * 100.0 + len(wrote[i]))
                    left[i] -= 1
                remove([r for r, i in enumerate(live_ids()) if left[i] == 0])  # as a search does
                if not left:
                    break
        elif op[0] == "add":
            _, rows, S, positions = op
            ids = admit(rows, S, positions)
            slots.reserve(rows, positions, S, S)
            slots.add(*_slot_rows(ids, S))
        else:
            remove([r for r in range(slots.n) if op[1] >> r & 1])
        check()


class HostReads(TorchDispatchMode):
    """Counts the ops that read a tensor's values on the host (`int(t)`, `bool(t)`, `nonzero`'s
    size, indexing with a boolean mask, which runs `nonzero` inside the kernel; `tolist` is
    counted by `reading_host`): on a GPU each is a wait for the device."""

    READS = frozenset({"item", "_local_scalar_dense", "is_nonzero", "nonzero"})
    MASKED = frozenset({"index", "index_put", "index_put_"})

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        self.count += name in self.READS
        if name in self.MASKED and len(args) > 1:
            self.count += any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
            )
        return func(*args, **(kwargs or {}))


def reading_host(monkeypatch: pytest.MonkeyPatch) -> HostReads:
    reads = HostReads()
    tolist = torch.Tensor.tolist

    def counted(t: torch.Tensor) -> Any:
        reads.count += 1
        return tolist(t)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    return reads


@pytest.mark.parametrize("joined", [False, True])
@pytest.mark.parametrize("beam", [1, 4])
def test_a_step_reads_the_host_a_fixed_number_of_times(
    eos_model: Transformer, monkeypatch: pytest.MonkeyPatch, beam: int, joined: bool
) -> None:
    """However many hypotheses end at a step, a search step copies values to the host a fixed
    number of times (a GPU waits for the device at each), not once per value it reads; rows
    that joined late (`joined`: per-row positions and masks) cost no more."""
    from aiayn.search.beam import BeamSearch
    from aiayn.search.row_search import RowSearch

    src = random_batch([3, 9, 5, 7, 4, 8, 6, 9, 3, 5, 7, 8] * 2, seed=3)
    cfg = DecodeConfig(beam_size=beam, nbest=beam, max_len_a=1.0, max_len_b=4)
    run = BeamSearch(eos_model, cfg) if beam > 1 else RowSearch(eos_model, cfg)

    def set_aside() -> int:  # hypotheses that ended so far, returned or not
        return returned + sum(map(len, run.ended.values())) if beam > 1 else returned

    reads = reading_host(monkeypatch)
    most_reads, most_ended, returned = 0, 0, 0
    with torch.inference_mode():
        run.add(src[:4] if joined else src)
        if joined:  # the rest join at column 1, as a server admits them
            run.step()
            run.add(src[4:])
        while run.live:
            before, reads.count = set_aside(), 0
            with reads:
                done = run.step()
            returned += sum(len(h) for _, h in done) if beam > 1 else len(done)
            most_reads = max(most_reads, reads.count)
            most_ended = max(most_ended, set_aside() - before)
    assert most_ended >= 8  # steps where many end: one read per value would be dozens
    assert most_reads <= (5 if beam > 1 else 3)


@pytest.mark.parametrize("beam", [1, 4])
def test_joining_a_running_search_reads_the_host_a_fixed_number_of_times(
    eos_model: Transformer, monkeypatch: pytest.MonkeyPatch, beam: int
) -> None:
    """Sentences joining a running search (a server admits some every few steps) cost a fixed
    number of host reads, rows that ended or not."""
    from aiayn.search.beam import BeamSearch
    from aiayn.search.row_search import RowSearch

    src = random_batch([3, 9, 5, 7, 4, 8, 6, 9, 3, 5, 7, 8] * 2, seed=3)
    cfg = DecodeConfig(beam_size=beam, nbest=beam, max_len_a=1.0, max_len_b=4)
    run = BeamSearch(eos_model, cfg) if beam > 1 else RowSearch(eos_model, cfg)
    reads = reading_host(monkeypatch)
    with torch.inference_mode():
        run.add(src[:16])
        for at in range(16, 24, 4):
            run.step()
            reads.count = 0
            with reads:
                run.add(src[at : at + 4])
            # encoder's id check, whether there is padding and where the real positions are
            # (these three on the CPU only), limits, dead rows left out, columns dropped
            assert reads.count <= (6 if beam > 1 else 7)
