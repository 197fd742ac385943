"""limits.py: bad settings are ConfigErrors, min_len forbids an early EOS, max_tokens caps every
sentence and nothing else."""

from __future__ import annotations

import pytest

from aiayn.config import DecodeConfig
from aiayn.errors import ConfigError
from aiayn.nn.model import Transformer
from aiayn.search.decode import beam_search, greedy_search, search
from search.models import SRC, V_FAKE, TableModel, random_batch


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


def test_min_len_forbids_early_eos() -> None:
    cfg = DecodeConfig(beam_size=2, nbest=2, max_len_a=1.0, max_len_b=0, min_len=3)
    with pytest.raises(KeyError):  # sentence 0 must now go past the prefixes in its table
        beam_search(TableModel(), SRC, cfg)
    hyps = beam_search(TableModel(), SRC[1:], cfg)[0]
    assert all(len(h.tokens) >= 3 for h in hyps)


def test_max_tokens_caps_every_sentence_and_nothing_else(model: Transformer) -> None:
    src = random_batch([6, 8, 3], seed=4)
    free = greedy_search(model, src, DecodeConfig(max_len_b=20))
    capped = greedy_search(model, src, DecodeConfig(max_len_b=20, max_tokens=5))
    for f, c in zip(free, capped, strict=True):
        assert c.tokens == f.tokens[:5] and len(c.tokens) <= 5
    beams = beam_search(model, src, DecodeConfig(beam_size=3, max_len_b=20, max_tokens=4))
    assert all(len(h.tokens) <= 4 for hyps in beams for h in hyps)
