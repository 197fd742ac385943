"""The searches over every switch after the paper (the models of tests/nn/test_switches.py):
greedy with the KV cache == greedy recomputing the whole prefix, beam search of width 1 ==
greedy, a batch == its rows alone (a decoder-only model's prompts of different lengths, left
padded), and sentences that join a running search (`RowSearch`, `BeamSearch` over
`SlotCache` and `join_caches`) get what they get alone, windowed models included: their
caches are rings (`KVCache.window`), which the slots keep in place, and a window of 8 starts
as a plain cache that a joining sentence's longer limit grows past the window.

Token sequences must be equal; log-probabilities and scores agree to 1e-4 (sums of ~20 fp32
log-softmax values computed by different paths), as in test_row_search.py.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from nn.test_switches import LM_SWITCHES, SWITCHES, TINY

from aiayn.config import EOS_ID, DecodeConfig, ModelConfig
from aiayn.nn.model import Transformer
from aiayn.nn.variants import DecoderLM
from aiayn.search.beam import BeamSearch
from aiayn.search.decode import beam_search, greedy_search
from aiayn.search.hypothesis import Hypothesis
from aiayn.search.row_search import RowSearch
from search.models import feed_arrivals, random_batch

LOG_PROB_TOL = 1e-4
JOINING = {**SWITCHES, "window8": {"positional": "rope", "attn_window": 8, "kv_heads": 2}}


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Any:
    """Tiny products: one thread is faster (see tests/nn/test_switches.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def translator(name: str) -> Transformer:
    """A tiny random translator whose EOS bias makes rows end at different steps (some at once,
    some at their limit), so rows leave a running search while others join."""
    torch.manual_seed(sorted(JOINING).index(name))
    cfg = ModelConfig(**{**TINY, **JOINING[name], "logits_bias": True})
    model = Transformer(cfg).eval()
    with torch.no_grad():
        model.generator.bias.zero_()
        model.generator.bias[EOS_ID] = 1.5
    return model


@functools.cache
def language_model(name: str) -> DecoderLM:
    torch.manual_seed(sorted(LM_SWITCHES).index(name))
    return DecoderLM(ModelConfig(**{**TINY, **LM_SWITCHES[name]})).eval()


def same(got: list[Hypothesis], want: list[Hypothesis]) -> None:
    assert [(h.tokens, h.eos) for h in got] == [(h.tokens, h.eos) for h in want]
    for g, w in zip(got, want, strict=True):
        assert g.log_prob == pytest.approx(w.log_prob, abs=LOG_PROB_TOL)
        assert g.score == pytest.approx(w.score, abs=LOG_PROB_TOL)


def prompts(lengths: list[int], seed: int) -> torch.Tensor:
    """Right-padded prompts of real tokens (no EOS: a prompt goes on)."""
    g = torch.Generator().manual_seed(seed)
    batch = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        batch[i, :n] = torch.randint(4, TINY["vocab_size"], (n,), generator=g)
    return batch


@pytest.mark.parametrize("name", SWITCHES)
def test_a_translators_greedy_search_is_the_same_with_or_without_the_cache(name: str) -> None:
    """Cached == recomputed, beam 1 == greedy, a batch == its sentences alone; at least 10
    tokens each (a window's ring wraps)."""
    model = translator(name)
    src = random_batch([5, 9, 2], seed=1)
    cfg = DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=8, min_len=10)  # EOS from 10 on
    cached = greedy_search(model, src, cfg)
    same(cached, greedy_search(model, src, cfg, use_cache=False))
    same(cached, [hyps[0] for hyps in beam_search(model, src, cfg)])
    same(cached, [greedy_search(model, src[i : i + 1], cfg)[0] for i in range(3)])
    assert min(len(h.tokens) for h in cached) >= 10 > 2 * model.cfg.attn_window


@pytest.mark.parametrize("name", LM_SWITCHES)
def test_a_language_models_greedy_search_is_the_same_with_or_without_the_cache(
    name: str,
) -> None:
    """Prompts of different lengths (left padded in one batch): cached == recomputed, beam
    1 == greedy, the batch == each prompt alone. Long enough for a window's ring to wrap."""
    model = language_model(name)
    src = prompts([5, 9, 2], seed=2)
    cfg = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=14, min_len=14)
    cached = greedy_search(model, src, cfg)
    same(cached, greedy_search(model, src, cfg, use_cache=False))
    same(cached, [hyps[0] for hyps in beam_search(model, src, cfg)])
    same(cached, [greedy_search(model, src[i : i + 1], cfg)[0] for i in range(3)])
    assert all(len(h.tokens) == 14 for h in cached)


@pytest.mark.parametrize("name", ["window", "long", "long_alibi", "nope_long", "llama_mqa"])
def test_a_language_models_beams_in_a_batch_are_its_beams_alone(name: str) -> None:
    """Beam search reorders the rows of ring caches (`KVCache.index_select`) under left
    padding: a batch of prompts of different lengths gets each prompt's N-best alone."""
    model = language_model(name)
    src = prompts([5, 9, 2], seed=3)
    cfg = DecodeConfig(beam_size=3, nbest=3, max_len_a=0.0, max_len_b=12, min_len=8)
    batch = beam_search(model, src, cfg)
    for i in range(3):
        same(batch[i], beam_search(model, src[i : i + 1], cfg)[0])


# (lengths, the step each sentence joins at, (the admission dropped, at step) or None)
ARRIVALS = [
    ([2, 9, 4, 7, 1], [0, 0, 2, 3, 7], (1, 4)),
    ([1, 3, 8, 5], [0, 1, 1, 6], None),
]


@pytest.mark.parametrize("arrivals", ARRIVALS, ids=["drop", "no_drop"])
@pytest.mark.parametrize(
    "name", ["window", "long", "long_alibi", "window8", "llama", "alibi", "rope", "kv1"]
)
def test_sentences_that_join_a_running_search_get_what_they_get_alone(
    name: str, arrivals: tuple[list[int], list[int], tuple[int, int] | None]
) -> None:
    """Continuous batching over the switches' caches (rings that wrap included), for greedy
    (`RowSearch`: rows in slots) and beam search (`BeamSearch`: `join_caches`)."""
    model = translator(name)
    lengths, joins, drop_at = arrivals
    src = random_batch(lengths, seed=sum(lengths))
    greedy = DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=3)
    beam = DecodeConfig(beam_size=2, nbest=2, max_len_a=1.0, max_len_b=3)
    rows = range(len(lengths))
    for run, alone in [
        (RowSearch(model, greedy), [greedy_search(model, src[i : i + 1], greedy) for i in rows]),
        (BeamSearch(model, beam), [beam_search(model, src[i : i + 1], beam)[0] for i in rows]),
    ]:
        got, dropped = feed_arrivals(run, src, joins, drop_at)
        if dropped is not None:
            got.setdefault(dropped, alone[dropped])  # it may have ended before its drop
        assert sorted(got) == list(rows)
        for i, want in enumerate(alone):
            same(got[i] if isinstance(got[i], list) else [got[i]], want)
