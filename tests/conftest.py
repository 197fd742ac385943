"""Shared fixtures: a derandomised hypothesis profile and a tiny model config."""

import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=20)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Two cores: keep torch from oversubscribing when pytest-xdist or helpers run beside us.
torch.set_num_threads(min(2, os.cpu_count() or 1))

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared")
MULTI30K = os.path.normpath(os.path.join(SHARED, "data", "multi30k"))


@pytest.fixture
def tiny_cfg():
    from aiayn.config import ModelConfig

    return ModelConfig(
        vocab_size=50, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, max_len=64
    )


@pytest.fixture
def multi30k_dir():
    if not os.path.isdir(MULTI30K):
        pytest.skip(f"Multi30k not found at {MULTI30K} (shared data absent)")
    return MULTI30K


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` run where a GPU is, and say why they skip where there is none."""
    if torch.cuda.is_available():
        return
    build = "a CPU-only torch build" if torch.version.cuda is None else "no GPU visible"
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU ({build})")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
