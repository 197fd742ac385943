"""The real (random) Transformers the search tests run, once per test module: `model`, and
`eos_model`, whose rows end at different steps."""

from __future__ import annotations

import pytest
import torch

from aiayn.config import EOS_ID, ModelConfig
from aiayn.nn.model import Transformer
from search.models import VOCAB


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("cpu_tiny", vocab_size=VOCAB, d_model=32, d_ff=64, max_len=64)
    return Transformer(cfg).eval()


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
