"""sampling.py: seeded sampling, independent of batching, greedy where the temperature or top_p
vanishes, and each sentence's seed mixed from the seed and its line."""

from __future__ import annotations

import itertools
import math

import pytest

from aiayn.config import DecodeConfig
from aiayn.nn.model import Transformer
from aiayn.search.decode import greedy_search, sample_search
from aiayn.search.hypothesis import Hypothesis
from aiayn.search.sampling import sample_seed
from search.models import random_batch


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


def test_sample_seed_mixes_seed_and_line() -> None:
    seeds = {sample_seed(s, line) for s in range(4) for line in range(1, 50)}
    assert len(seeds) == 4 * 49 and all(0 <= x < 2**63 for x in seeds)
