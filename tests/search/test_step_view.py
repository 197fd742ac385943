"""step_view.py: the step observer: what it reports of a scripted beam search, that observing
changes nothing and reports what was returned, and what a greedy observer sees."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig
from aiayn.nn.model import Transformer
from aiayn.search.decode import beam_search, search
from aiayn.search.step_view import StepView
from search.models import B_, SCRIPTED, SRC, A, TableModel, random_batch


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
