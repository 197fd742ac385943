"""The seeds' intuition demos in examples/: they run, and what they print is true."""

import importlib.util
import sys
import time

import pytest
import torch
from paths import EXAMPLES


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"aiayn_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def toy():
    return load("self_attention_toy")


@pytest.fixture(scope="module")
def recommender():
    return load("dot_product_recommender")


def test_self_attention_toy_weights_and_equivariance(toy):
    r = toy.run(seed=3)
    w, x, y = r["weights"], r["x"], r["y"]
    torch.testing.assert_close(w.sum(-1), torch.ones(len(r["words"]), dtype=w.dtype))
    torch.testing.assert_close(y, w @ x)  # each output is a weighted average of the inputs
    assert r["equivariance_error"] < 1e-12 and r["same_output_error"] == 0.0
    assert sorted(r["perm"]) == list(range(len(r["words"]))) and r["perm"] != sorted(r["perm"])
    # a distinct word attends to itself most: its dot product with itself is the largest here
    assert int(w[1].argmax()) == 1


def test_self_attention_toy_main_prints_the_story(toy, capsys):
    assert toy.main(["--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "each row sums to 1" in out and "permutation equivariance" in out
    assert "max difference = 0.00e+00" in out


def test_recommender_recovers_the_hidden_features(recommender, tmp_path):
    start = time.monotonic()
    r = recommender.run(seed=0)
    assert r["rmse"] < 0.2 * r["baseline_rmse"]  # far better than predicting the mean
    assert r["rmse"] < 1.5 * r["noise"]  # close to the noise floor
    assert min(r["cosines"]) > 0.99  # the learned movie factors span the true feature space
    assert min(r["r2"]) > 0.98
    recommender.plot(r, str(tmp_path / "rec.png"))
    assert (tmp_path / "rec.png").read_bytes().startswith(b"\x89PNG")
    assert time.monotonic() - start < 120  # seconds on an idle laptop; generous on shared CI


def test_recommender_without_training_recovers_nothing(recommender):
    """The oracle has teeth: random embeddings are far from the hidden structure."""
    r = recommender.run(seed=0, steps=0)
    assert r["rmse"] > 0.9 * r["baseline_rmse"] and min(r["r2"]) < 0.5


def test_principal_cosines(recommender):
    a = torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mix = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 3.0], [1.0, 0.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(
        recommender.principal_cosines(a, a @ mix), torch.ones(3, dtype=a.dtype)
    )
    b = torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert float(recommender.principal_cosines(a, b).min()) < 0.9


def test_recommender_main(recommender, tmp_path, capsys):
    assert recommender.main(["--plot", str(tmp_path / "r.png"), "--steps", "50"]) == 0
    out = capsys.readouterr().out
    assert "subspace alignment" in out and (tmp_path / "r.png").exists()
