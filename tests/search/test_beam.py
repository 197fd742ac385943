"""beam.py: scripted-probability beam search (fairseq-style), sorted and distinct n-best lists,
and sentences that join a running `BeamSearch`."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.config import DecodeConfig
from aiayn.nn.model import Transformer
from aiayn.search.decode import beam_search
from aiayn.search.hypothesis import length_penalty
from search.models import B_, SCRIPTED, SRC, A, TableModel, feed_arrivals, random_batch


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


def test_nbest_sorted_and_distinct(model: Transformer) -> None:
    src = random_batch([6, 8], seed=3)
    for hyps in beam_search(model, src, DecodeConfig(beam_size=4, nbest=4, max_len_b=6)):
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4


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
