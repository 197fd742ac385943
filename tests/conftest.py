"""Shared fixtures: a derandomised hypothesis profile and a tiny model config."""

import os
import shutil

import pytest
import torch
from hypothesis import settings
from paths import MULTI30K

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=20)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Two cores: keep torch from oversubscribing when pytest-xdist or helpers run beside us.
torch.set_num_threads(min(2, os.cpu_count() or 1))


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


@pytest.fixture
def chromium():
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("Chromium not installed (Debian: apt-get install -y chromium); "
                    "the interactive attention page is not checked in a browser")  # fmt: skip
    pytest.importorskip("websocket", reason="websocket-client not installed (pip install .[test])")
    from chromium import Chromium

    browser = Chromium(binary)
    yield browser
    browser.close()


@pytest.fixture(scope="session")
def served_model_dir(tmp_path_factory):
    """A real, briefly trained English -> German numbers model (the quick start's recipe cut to
    a few steps), with its run config: what `aiayn serve` tests run on."""
    import dataclasses

    from aiayn.cli.quickstart import quickstart_config
    from aiayn.text.synthetic import write_corpus
    from aiayn.training.loop import train

    out = tmp_path_factory.mktemp("served")
    data = out / "data"
    write_corpus(data, "numbers", "en", "de", 1000, 100, 20, seed=1)
    cfg = quickstart_config(data, out / "model", minutes=0.0, device="cpu")
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, vocab_size=300),
        train=dataclasses.replace(cfg.train, vocab_size=300, max_steps=6, max_tokens=1000,
                                  warmup_steps=3, valid_every=6, save_every=6),
    )  # fmt: skip
    train(cfg, progress=False)
    return out / "model"
