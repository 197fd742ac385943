"""bench/marian_baseline.py runs end to end (a tiny model, a few steps, two test sets): the
benchmark's plumbing, not its figures (docs/lab/budget_recipe.md has those)."""

from __future__ import annotations

import importlib.util
import math
import random

import paths
import pytest

BENCH = paths.BENCH / "marian_baseline.py"


def test_marian_baseline_trains_validates_and_scores(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers", reason="the baseline needs transformers (.[bench])")
    monkeypatch.syspath_prepend(str(BENCH.parent))  # as `python bench/...` runs it: its siblings
    spec = importlib.util.spec_from_file_location("marian_baseline", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = random.Random(0)
    lines = [" ".join(rng.choices("abcdefgh", k=rng.randint(2, 6))) for _ in range(300)]
    files = {}
    for split, part in (
        ("train", lines),
        ("valid", lines[:20]),
        ("test", lines[20:30]),
        ("test2", [*lines[30:40], " ".join(lines[:150])]),  # over SOURCE_MAX tokens: cut
    ):
        for side in ("src", "tgt"):
            files[f"{split}.{side}"] = tmp_path / f"{split}.{side}"
            files[f"{split}.{side}"].write_text("".join(x + "\n" for x in part))
    args = ["--src", files["train.src"], "--tgt", files["train.tgt"],
            "--valid-src", files["valid.src"], "--valid-tgt", files["valid.tgt"],
            "--test-src", files["test.src"], "--test-tgt", files["test.tgt"],
            "--test2-src", files["test2.src"], "--test2-tgt", files["test2.tgt"],
            "--vocab-size", "300", "--minutes", "1", "--max-steps", "6", "--warmup", "2",
            "--max-tokens", "256", "--d-model", "32", "--layers", "1", "--heads", "2",
            "--ffn", "64", "--beam", "2", "--lr", "3e-3"]  # fmt: skip
    result = bench.main([str(a) for a in args])
    assert result["steps"] == 6 and 256 < result["model"]["vocab"] <= 300  # bytes + pieces
    assert math.isfinite(result["val_loss"]) and result["val_ppl"] > 1
    for search in ("greedy", "beam2", "test2_greedy", "test2_beam2"):  # --test2-*: scored alike
        assert 0 <= result[search]["bleu"] <= 100 and 0 <= result[search]["bp"] <= 1
        assert 0 <= result[search]["chrf"] <= 100 and 0 <= result[search]["exact_match"] <= 100
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('{"script"')
