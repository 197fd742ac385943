"""bench/length_diagnosis.py's search without early termination (it swaps in its own
`BeamSearch._set_aside`): it keeps every hypothesis that ends, so its best can only score as
well or better, and it must keep up with the search's internals (a changed signature fails
here, not in a user's diagnosis)."""

from __future__ import annotations

import importlib.util

import paths
import torch

from aiayn.config import EOS_ID, PAD_ID, DecodeConfig, ModelConfig
from aiayn.nn.model import Transformer
from aiayn.search.decode import beam_search

BENCH = paths.BENCH / "length_diagnosis.py"


def test_without_early_termination_the_best_is_at_least_as_good(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("length_diagnosis", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("cpu_tiny", vocab_size=24, d_model=32, d_ff=64, max_len=64,
                             logits_bias=True)  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():
        model.generator.bias[EOS_ID] = 1.0  # EOS often among the 2N best: early ends happen
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 24, (12, 7), generator=g)
    src[:, -1], src[::3, 4:] = EOS_ID, PAD_ID
    src[::3, 3] = EOS_ID
    search = DecodeConfig(beam_size=3, nbest=3, max_len_b=6, alpha=2.0)  # favours the long
    early = beam_search(model, src, search)
    with bench.no_early_termination():
        full = beam_search(model, src, search)
    assert len(full) == len(early) == 12
    better = 0
    for e, f in zip(early, full, strict=True):
        assert f[0].score >= e[0].score - 1e-6
        better += f[0].score > e[0].score + 1e-6
    assert better > 0  # early termination cut a better hypothesis somewhere: the swap took effect
