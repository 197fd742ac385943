"""bench/attention_scaling.py at tiny sizes (L up to 512, a window of 32, contexts up to 256):
its JSON's structure, and what must hold whatever the machine: the explicit attention's
memory grows faster than local attention's, a GQA cache (heads / 4) holds exactly a quarter of
MHA's bytes, and a window's cache stops growing at the window."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import paths
import pytest

BENCH = paths.BENCH / "attention_scaling.py"
TINY = ["--lengths", "128", "256", "512", "--window", "32", "--d-model", "64", "--heads", "8",
        "--reps", "1", "--contexts", "32", "64", "128", "256", "--decode-window", "64",
        "--decode-layers", "2", "--steps", "2", "--decode-reps", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def bench(request: pytest.FixtureRequest) -> object:
    mp = pytest.MonkeyPatch()
    request.addfinalizer(mp.undo)
    mp.syspath_prepend(str(BENCH.parent))  # its `import device_info`
    spec = importlib.util.spec_from_file_location("attention_scaling", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result(bench: object, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("scaling")
    bench.main([*TINY, "--out", str(out), "--plots", str(out)])  # type: ignore[attr-defined]
    return {"json": json.loads((out / "results.json").read_text()), "dir": out}


def test_every_case_and_variant_is_reported(result: dict) -> None:
    r = result["json"]
    assert r["cpu"] and r["torch"] and r["threads"] == 1 and len(r["load_average_1_5_15"]) == 3
    for method in ("explicit", "fused", "local"):
        for mode in ("forward", "train"):
            rows = r["part_a"]["cases"][method][mode]
            assert [row["L"] for row in rows] == [128, 256, 512]
            for row in rows:
                assert row["fit"], row
                assert len(row["module_cpu_s"]) == len(row["attention_s"]) == row["reps"] == 1
                assert row["module_cpu_s"][0] > 0 and row["peak_rss_bytes"] >= 0
            assert set(r["part_a"]["exponents"][f"{method}_{mode}"]) == {
                "module_time", "attention_time", "module_wall_time", "memory"}  # fmt: skip
    for variant in ("mha", "gqa", "mqa", "window"):
        row = r["part_b"]["variants"][variant]
        assert row["contexts"] == [32, 64, 128, 256]
        assert all(t > 0 for t in row["tok_s"] + row["tok_s_wall"])
    assert set(r["goals"]) >= {"window_decoding_flat", "gqa_vs_mha"}
    for name in ("time", "memory", "decode", "cache"):
        png = result["dir"] / f"attention_scaling_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explicit_memory_grows_faster_than_local(result: dict) -> None:
    cases = result["json"]["part_a"]["cases"]
    for mode in ("forward", "train"):
        explicit = {row["L"]: row["peak_rss_bytes"] for row in cases["explicit"][mode]}
        local = {row["L"]: row["peak_rss_bytes"] for row in cases["local"][mode]}
        # 8 heads of 512 x 512 fp32 scores are 8 MiB a tensor, several held at once; the
        # window's blocks at W = 32 hold 1/8 of that
        assert explicit[512] > 16 * 2**20
        assert explicit[512] > 4 * local[512], (explicit, local)
        assert explicit[512] - explicit[256] > 4 * (local[512] - local[256]), (explicit, local)


def test_cache_bytes_gqa_a_quarter_and_the_window_flat(result: dict) -> None:
    dec = result["json"]["part_b"]["variants"]
    mha, gqa, mqa, window = (dec[v]["cache_bytes"] for v in ("mha", "gqa", "mqa", "window"))
    # 2 layers x K and V x (1, J, C, 8) fp32: J = 8 heads, 2 (GQA), 1 (MQA)
    assert mha == [2 * 2 * 8 * C * 8 * 4 for C in (32, 64, 128, 256)]
    assert [4 * g for g in gqa] == mha and [8 * m for m in mqa] == mha
    assert window == [mha[1]] * 4  # a ring of W = 64 slots from the start
    assert result["json"]["goals"]["gqa_vs_mha"]["cache_bytes_ratio"] == [0.25] * 4


def test_a_length_that_would_not_fit_is_recorded_not_run(bench: object) -> None:
    a = argparse.Namespace(lengths=[128, 256], window=32, d_model=64, heads=8, reps=1,
                           case_seconds=1.0, margin_gib=1e6,
                           methods=["explicit", "fused", "local"])  # fmt: skip
    cases = bench.part_a(a)  # type: ignore[attr-defined]  # no memory left: nothing runs
    for method in ("explicit", "fused", "local"):
        for mode in ("forward", "train"):
            (row,) = cases[method][mode]  # the first length ends the method
            assert row["L"] == 128 and not row["fit"] and "estimated" in row["why"]


def test_an_allocation_refused_in_the_child_is_recorded(bench: object) -> None:
    a = argparse.Namespace(lengths=[128, 1024], window=32, d_model=64, heads=8, reps=1,
                           case_seconds=1.0)  # fmt: skip
    # the child may grow by 16 MiB: 8 heads of 1024 x 1024 fp32 scores are 32 MiB
    row = bench.forked("explicit", "forward", 1024, a, 16 * 2**20)  # type: ignore[attr-defined]
    assert not row["fit"] and "refused" in row["why"], row
    assert Path("/proc/self/status").exists()
