"""decode.py: greedy, beam and sampling searches run whole: scripted greedy search and beam
size 1, cache parity, beam 1 == greedy, batch invariance, training mode restored, and the
special ids read from the model."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig
from aiayn.nn.kv_cache import KVCache, Memory
from aiayn.nn.model import Transformer
from aiayn.search.decode import beam_search, greedy_decode, greedy_search, search
from search.models import SRC, VOCAB, A, TableModel, random_batch


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


def test_decode_restores_training_mode(model: Transformer) -> None:
    model.train()
    try:
        greedy_decode(model, random_batch([4], seed=5), max_len=3)
        assert model.training
    finally:
        model.eval()


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
