"""bench/block_ablation.py: every arm is a config aiayn accepts, the summary's arithmetic, and one
real pair (paper's block beside SwiGLU) trained for 3 steps on a tiny model and scored, through
the bench's own pairing machinery (docs/lab/blocks.md has the real runs)."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
from paths import BENCH, SHARED

from aiayn.config_files import load_config

TEXT = os.path.normpath(os.path.join(SHARED, "data", "tinyshakespeare", "input.txt"))


def _bench():
    spec = importlib.util.spec_from_file_location("block_ablation", BENCH / "block_ablation.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.parametrize("task", ["lm", "mt"])
def test_every_arm_is_a_valid_config_that_differs_from_the_papers(task):
    bench = _bench()
    path = bench.ROOT / "configs" / f"{bench.CONFIGS[task]}.toml"
    paper = load_config(path).model
    table = bench.arms(task)
    assert {"rope", "rmsnorm", "swiglu", "kv_heads", "window", "qk_norm", "llama"} <= set(table)
    assert table.pop("paper") == []  # the paper's block against itself: the noise floor
    for arm, sets in table.items():
        model = load_config(path, sets).model  # a bad --set raises ConfigError here
        assert model != paper, arm
    heads, max_len = bench.config_dims(task)
    llama = load_config(path, table["llama"]).model
    assert 1 < llama.n_kv_heads < heads  # grouped, neither multi-head nor multi-query
    assert llama.d_hidden == round(2 * paper.d_ff / 3) and not llama.bias and llama.norm_first
    assert load_config(path, table["kv_heads"]).model.n_kv_heads == max(1, heads // 4)
    if task == "lm":
        assert load_config(path, table["window"]).model.attn_window == max_len // 4


def test_summary_deltas_ratios_and_noise_floor():
    bench = _bench()

    def pair(arm, paper_loss, switched_loss, switched_steps):
        paper = {"steps": 100, "steps_per_s": 1.0, "valid_loss": paper_loss,
                 "scored": {"bleu": {"score": 10.0}}}  # fmt: skip
        switched = {"steps": switched_steps, "steps_per_s": switched_steps / 100,
                    "valid_loss": switched_loss, "scored": {"bleu": {"score": 12.5}}}  # fmt: skip
        return {"task": "mt", "arm": arm, "seed": 1, "load_during": [1.0, 3.0], "paper": paper,
                "switched": switched}  # fmt: skip

    rows = bench.summarize([pair("rope", 4.0, 3.75, 80), pair("qk_norm", 4.5, None, 90)])
    assert rows[0]["loss_delta"] == pytest.approx(-0.25, abs=1e-12)
    assert rows[0]["bleu_delta"] == pytest.approx(2.5, abs=1e-12)
    assert rows[0]["steps_per_s_ratio"] == pytest.approx(0.8, abs=1e-12)
    assert rows[0]["load_mean"] == 2.0
    assert "loss_delta" not in rows[1]  # a side without a loss has no delta, not a zero
    floor = bench.noise_floor(rows, "mt")
    assert floor["runs"] == 2 and floor["min"] == 4.0 and floor["max"] == 4.5
    assert floor["stdev"] == pytest.approx(math.sqrt(0.125), abs=1e-12)
    table = bench.markdown(rows)
    assert "| rope (1) | 4.0000 | 3.7500 | -0.2500 | 100 / 80 | 0.80 |" in table
    assert "crashed" in table


@pytest.mark.skipif(not os.path.exists(TEXT), reason=f"no tiny Shakespeare at {TEXT}")
def test_a_pair_trains_side_by_side_and_both_sides_are_scored(tmp_path):
    bench = _bench()
    text = tmp_path / "tiny.txt"
    with open(TEXT, encoding="utf-8") as f:
        text.write_text(f.read(6000), encoding="utf-8")
    valid = tmp_path / "valid.txt"
    valid.write_text(text.read_text()[-600:])
    tiny = ["model.d_model=32", "model.n_layers=2", "model.d_ff=64", "model.max_len=32",
            "train.batch_size=4", "train.max_steps=3", f"train.text={text}"]  # fmt: skip
    cpus = sorted(os.sched_getaffinity(0))
    pins = [{cpus[0]}, {cpus[-1]}]
    rec = bench.run_pair("lm", "swiglu", bench.arms("lm")["swiglu"], tiny, 1.0, 1, tmp_path,
                         pins, valid)  # fmt: skip
    for side in ("paper", "switched"):
        got = rec[side]
        assert got["rc"] == 0, got.get("log_tail")
        assert got["steps"] == 3 and got["cpu_s"] > 0, got
        assert math.isfinite(got["scored"]["nats_per_token"]), got["scored"]
        assert got["scored"]["chars"] == 600  # the whole validation text (+ EOS: 601 tokens)
    assert "model.activation=swiglu" in rec["commands"]["switched"]
    assert "model.activation" not in rec["commands"]["paper"]
    # same seed, same data, different block: the two sides' losses differ
    assert rec["paper"]["scored"]["nats_per_token"] != rec["switched"]["scored"]["nats_per_token"]
    assert len(rec["load_during"]) >= 1
    assert len(rec["code"]["commit"]) == 40  # the commit the pair ran from
