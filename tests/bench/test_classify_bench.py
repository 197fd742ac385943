"""bench/classify_baselines.py, classify_pretraining.py and classify_speed.py: their pure parts,
and each script end to end on a few SST-2 sentences with a tiny model and a few steps, so that
they keep running (docs/lab/classify.md has the real runs). Skipped without ../shared/data/sst2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from paths import BENCH, SHARED

SST2 = os.path.normpath(os.path.join(SHARED, "data", "sst2"))
needs_sst2 = pytest.mark.skipif(
    not os.path.isfile(os.path.join(SST2, "stsa.binary.train")),
    reason=f"SST-2 not found at {SST2} (shared data absent)",
)


def load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def run_script(name: str, *args: str) -> dict:
    cmd = [sys.executable, str(BENCH / f"{name}.py"), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_peer_schedule_warms_up_then_falls_to_zero_at_the_budget():
    lr_at = load("classify_baselines").lr_at
    assert lr_at(0.0, 0, 100.0, 10, 1.0) == pytest.approx(0.1)
    assert lr_at(1.0, 9, 100.0, 10, 1.0) == pytest.approx(1.0)
    assert lr_at(50.0, 500, 100.0, 10, 1.0) == pytest.approx(0.5)
    assert lr_at(150.0, 900, 100.0, 10, 1.0) == pytest.approx(0.0)


def test_a_stratified_sample_keeps_the_label_shares_and_is_seeded():
    bench = load("classify_baselines")
    pairs = [("1", f"p{i}") for i in range(60)] + [("0", f"n{i}") for i in range(40)]
    got = bench.stratified_sample(pairs, 10, seed=3)
    assert sorted(label for label, _ in got) == ["0"] * 4 + ["1"] * 6
    assert got == bench.stratified_sample(pairs, 10, seed=3)
    assert bench.stratified_sample(pairs, 500, seed=3) == pairs


def test_a_pretrained_row_counts_the_pretraining_cpu_time():
    bench = load("classify_pretraining")
    test = {"accuracy": 0.8}
    arm = {"test": test, "best_dev_accuracy": 0.8, "steps": 10, "cpu_s": 60.0, "wall_s": 61.0}
    arms = {"mlm": {"cpu_s": 100.0, "wall_s": 101.0}, "pre_500": arm, "scratch_f_500": arm,
            "scratch_total_500": {**arm, "cpu_s": 160.0}}  # fmt: skip
    args = type("A", (), {"pretrain_minutes": 2.0, "finetune_minutes": 1.0})()
    got = {r["arm"]: r for r in bench.rows(arms, {"500": None}, args)}
    assert got["pre_500"]["cpu_s"] == 160.0 and got["pre_500"]["wall_s"] == 162.0
    assert got["scratch_f_500"]["cpu_s"] == 60.0 and got["scratch_total_500"]["cpu_s"] == 160.0
    assert got["scratch_total_500"]["row"] == "scratch 3 min (P + F)"


def check_score(test: dict, n: int) -> None:
    assert test["examples"] == n
    for key in ("accuracy", "macro_f1"):
        lo, hi = test[f"{key}_95"]
        assert 0.0 <= lo <= test[key] <= hi <= 1.0


@needs_sst2
def test_baselines_run_all_three_systems_on_the_same_sentences(tmp_path):
    report = run_script("classify_baselines", "--out", str(tmp_path), "--tiny", "--limit", "120",
                        "--steps", "8", "--minutes", "0.2")  # fmt: skip
    assert report["cpu"]["model"] and report["load_before"] and report["load_after"]
    for side in ("aiayn", "hf_bert", "tfidf_logreg"):
        check_score(report[side]["test"], 120)
        # the linear baseline on 120 sentences takes under the 0.1 s its CPU time is rounded to
        assert report[side]["cpu_s"] > 0 or (side == "tfidf_logreg" and report[side]["cpu_s"] == 0)
    assert report["aiayn"]["steps"] == 8 and report["hf_bert"]["steps"] == 8
    assert report["aiayn"]["cpus"] != report["hf_bert"]["cpus"] or os.cpu_count() == 1
    assert report["hf_bert"]["bert_config"]["vocab_size"] <= 1000  # aiayn's vocabulary
    assert report["tfidf_logreg"]["C"] in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


@needs_sst2
def test_pretraining_rows_compare_pretrained_and_scratch(tmp_path):
    report = run_script("classify_pretraining", "--out", str(tmp_path), "--tiny", "--limit", "120",
                        "--steps", "6", "--pretrain-minutes", "0.1", "--finetune-minutes", "0.1",
                        "--labels", "40", "--rows", "pre,scratch_total",
                        "--corpus", "sst2,shakespeare")  # fmt: skip
    corpora = report["unlabelled"]["corpora"]
    assert corpora["sst2"]["lines"] == 120 and corpora["shakespeare"]["lines"] == 120
    assert report["arms"]["mlm"]["valid_loss"] is not None
    rows = {r["arm"]: r for r in report["rows"]}
    assert set(rows) == {"pre_40", "scratch_total_40"}
    for row in rows.values():
        check_score(row["test"], 120)
    assert rows["pre_40"]["cpu_s"] > report["arms"]["mlm"]["cpu_s"]
    assert "init_from" in report["arms"]["pre_40"]["command"]


@needs_sst2
def test_speed_measures_aiayn_and_the_pipeline_in_one_run(tmp_path):
    report = run_script("classify_speed", "--out", str(tmp_path), "--tiny", "--n", "64",
                        "--repeats", "1", "--skip-bs1", "--hf-batch", "16")  # fmt: skip
    assert report["sizes"]["hf_vocab"] > 500  # the WordPiece trained here, not 5 specials
    got = report["by_threads"]["1"]
    for side in ("aiayn_inprocess", "hf_pipeline_bs16", "aiayn_cli", "aiayn_cli_8_lines"):
        assert got[side]["best_per_s"] > 0
    assert got["ratio_inprocess_vs_best_pipeline"] > 0
    split = got["where_the_time_goes"]["aiayn"]
    assert split["tokenize_s"] >= 0 and split["forward_s"] > 0
    assert (tmp_path / "labels.txt").read_text().count("\n") == 64
