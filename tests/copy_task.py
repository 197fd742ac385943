"""A tiny copy task for whole training runs: a corpus of random letters, each line its own
translation; the tiny_copy recipe over it; and readings of a run's log and checkpoints.
Shared by tests/training/ and test_cuda.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from paths import CONFIGS

from aiayn.config_files import load_config
from aiayn.store.model_dir import load_model_dir, load_tensors


def write_copy_corpus(directory: Path, n: int = 400, seed: int = 0) -> dict[str, str]:
    """Sentences of random letters, each its own translation; returns --set overrides."""
    rng = random.Random(seed)
    words = list("abcdefghijkl")
    lines = [" ".join(rng.choices(words, k=rng.randint(2, 8))) for _ in range(n)]
    text = "\n".join(lines) + "\n"
    for name in ("train.src", "train.tgt"):
        (directory / name).write_text(text)
    valid = "\n".join(lines[:40]) + "\n"
    for name in ("valid.src", "valid.tgt"):
        (directory / name).write_text(valid)
    return {
        "train.src": str(directory / "train.src"),
        "train.tgt": str(directory / "train.tgt"),
        "train.valid_src": str(directory / "valid.src"),
        "train.valid_tgt": str(directory / "valid.tgt"),
    }


def tiny(corpus: dict[str, str], out: Path, **over: object):
    sets = {**corpus, "train.out_dir": str(out), **{k: str(v) for k, v in over.items()}}
    return load_config(CONFIGS / "tiny_copy.toml", [f"{k}={v}" for k, v in sets.items()])


def logged_losses(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "loss" in r]


def assert_mean_of_checkpoints(out: Path, steps: tuple[int, ...]) -> None:
    """OUT/averaged's weights are the mean of the checkpoints of `steps`."""
    averaged = load_model_dir(out / "averaged")
    ckpts = [load_tensors(out / "checkpoints" / f"step_{s:08d}" / "model.safetensors")
             for s in steps]  # fmt: skip
    for name, t in averaged.state_dict().items():
        if name in ckpts[0]:
            mean = sum(c[name].double() for c in ckpts) / len(ckpts)
            torch.testing.assert_close(t.double(), mean, rtol=1e-6, atol=1e-6)
