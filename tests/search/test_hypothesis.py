"""hypothesis.py's length penalty, in one test of the search's pure functions with limits.py's
output lengths and sampling.py's top-p and top-k filters."""

from __future__ import annotations

import pytest
import torch

from aiayn.search.hypothesis import length_penalty
from aiayn.search.limits import max_output_lengths
from aiayn.search.sampling import top_k_filter, top_p_filter


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
