"""loop.py: whole (tiny) runs on a copy task: learning, resuming bit for bit, compiling, bf16,
and the stopping rules (signals, kill -9, epochs, early stopping, a diverged loss)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from copy_task import CONFIGS, logged_losses, tiny

from aiayn.config_files import load_config
from aiayn.store.checkpoints import list_checkpoints
from aiayn.store.model_dir import load_model_dir, load_tensors
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.loop import train


def test_copy_task_learns_and_writes_a_model_directory(corpus, tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="aiayn.training.setup"):
        result = train(
            tiny(
                corpus,
                out,
                **{
                    "train.max_steps": 240,
                    "train.valid_every": 80,
                    "train.bleu_samples": 20,
                    "train.best_metric": "bleu",
                },
            ),
            progress=False,
        )
    assert result.stopped == "max_steps" and result.step == 240
    said = [r.getMessage() for r in caplog.records if "tokenizer on" in r.getMessage()]
    both = f"{corpus['train.src']} and {corpus['train.tgt']}"  # one vocabulary for both sides
    assert said == [f"training a joint 300-piece bpe tokenizer on {both}"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in records if "loss" in r]
    valid_recs = [r for r in records if "valid_loss" in r]
    assert {"step", "epoch", "loss", "ppl", "lr", "tokens_per_s", "elapsed_s"} <= set(train_recs[0])
    assert len(valid_recs) == 3 and "valid_bleu" in valid_recs[-1]
    assert valid_recs[-1]["valid_ppl"] < 0.5 * valid_recs[0]["valid_ppl"]
    assert valid_recs[-1]["valid_ppl"] < 3.0  # log(12) letters would be ppl ~ 12 untrained
    # sacreBLEU of greedy copies after 240 steps: 38-80 over seeds 1-5 (seed 1 gives 38), vs ~1
    # for an untrained model
    assert valid_recs[-1]["valid_bleu"] > 30
    assert 0.5 < valid_recs[-1]["valid_length_ratio"] < 2.0  # BLEU tokens of hyps / refs
    assert 0.0 < valid_recs[-1]["valid_bp"] <= 1.0
    assert result.best == max(r["valid_bleu"] for r in valid_recs)  # best_metric = "bleu"
    model = load_model_dir(out)  # the run directory is a model directory
    assert Tokenizer.load(out).vocab_size == model.cfg.vocab_size
    run_cfg = json.loads((out / "run_config.json").read_text())
    assert set(run_cfg) == {"model", "train", "decode", "data_sha256", "runtime"}
    runtime = run_cfg["runtime"]  # how this machine computed, chosen by train.dtype = "auto"
    assert runtime["device"] == "cpu" and runtime["dtype"] in ("fp32", "bf16")
    assert runtime["why"].startswith("auto: ") and runtime["world_size"] == 1
    assert set(run_cfg["data_sha256"]) == {"src", "tgt", "valid_src", "valid_tgt"}
    assert len(list_checkpoints(out)) == 3  # keep_last = 3


@pytest.mark.parametrize("alpha", [0.0, 0.1])
def test_resume_is_bit_identical(corpus, tok, tmp_path, alpha):
    """2N steps straight == N steps, stop, resume, N more (dropout on, so RNG state matters;
    with subword regularization, each epoch's sampled segmentations too: 30 steps are two
    epochs here)."""
    over = {"train.valid_every": 10, "train.save_every": 7, "train.log_every": 5,
            "train.subword_alpha": alpha}  # fmt: skip
    straight = train(
        tiny(corpus, tmp_path / "a", **over, **{"train.max_steps": 30}),
        tokenizer=tok,
        progress=False,
    )
    first = train(
        tiny(corpus, tmp_path / "b", **over, **{"train.max_steps": 15}),
        tokenizer=tok,
        progress=False,
    )
    assert first.step == 15
    second = train(tiny(corpus, tmp_path / "b", **over, **{"train.max_steps": 30}), progress=False)
    assert straight.step == second.step == 30
    a = load_tensors(list_checkpoints(tmp_path / "a")[-1] / "model.safetensors")
    b = load_tensors(list_checkpoints(tmp_path / "b")[-1] / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert straight.train_loss == second.train_loss


@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="torch.compile on CPU needs a C++ compiler (g++)",
)
def test_torch_compile_trains_the_same_steps(corpus, tok, tmp_path):
    """`train.compile = true` (torch.compile, inductor on CPU) follows the eager run's losses
    without dropout, and its run directory is an ordinary model directory. ~20 s of compiling.
    In fp32 on every machine: under "auto" a CPU with AVX512-BF16 trains in bf16 autocast, where
    inductor's fused kernels round otherwise than eager's ops (1.2e-4 relative apart after 12
    steps, measured on an AMD EPYC Zen 4), and the tolerance below is fp32's."""
    from torch._dynamo.utils import counters  # dynamo's own tally (private, long-standing)

    over = {
        "train.max_steps": 12,
        "train.log_every": 4,
        "model.dropout": 0.0,
        "train.dtype": "fp32",
    }
    counters.clear()
    eager = train(tiny(corpus, tmp_path / "eager", **over), tokenizer=tok, progress=False)
    compiled = train(
        tiny(corpus, tmp_path / "compiled", **over, **{"train.compile": True}),
        tokenizer=tok,
        progress=False,
    )
    assert compiled.step == eager.step == 12
    assert not counters["graph_break"], dict(counters["graph_break"])  # one graph, no breaks
    losses = [logged_losses(tmp_path / name) for name in ("eager", "compiled")]
    assert len(losses[0]) == 3
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    load_model_dir(tmp_path / "compiled")


def test_sigterm_saves_and_resume_continues(corpus, tok, tmp_path):
    out = tmp_path / "run"
    cfg = tiny(corpus, out, **{"train.max_steps": 100000, "train.save_every": 100000})
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        result = train(cfg, tokenizer=tok, progress=False)
    finally:
        timer.cancel()
    assert result.stopped == "signal" and 0 < result.step < 100000
    assert list_checkpoints(out)[-1].name == f"step_{result.step:08d}"
    more = train(tiny(corpus, out, **{"train.max_steps": result.step + 3}), progress=False)
    assert more.step == result.step + 3 and more.stopped == "max_steps"
    assert math.isfinite(more.train_loss) or math.isnan(more.train_loss)


def test_bf16_autocast_and_validation_at_each_epoch_end(corpus, tok, tmp_path):
    out = tmp_path / "run"
    result = train(
        tiny(
            corpus,
            out,
            **{
                "train.dtype": "bf16",
                "train.max_steps": 1000,
                "train.max_epochs": 2,
                "train.valid_every": 0,
            },
        ),
        tokenizer=tok,
        progress=False,
    )
    assert result.stopped == "max_epochs" and result.step == 20  # 10 batches per epoch
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if "valid_loss" in r]
    assert [r["step"] for r in valid] == [10, 20] and all(
        math.isfinite(r["valid_loss"]) for r in valid
    )


def test_kill_9_during_frequent_saves_leaves_a_resumable_run(corpus, tmp_path):
    """SIGKILL (no handler can run) while a checkpoint is saved every step: every listed
    checkpoint is complete and loadable, and the run resumes from the newest."""
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    sets = {
        **corpus,
        "train.out_dir": out,
        "train.max_steps": 100000,
        "train.save_every": 1,
        "train.keep_last": 2,
    }
    cmd = [
        sys.executable,
        "-m",
        "aiayn",
        "train",
        "--config",
        str(CONFIGS / "tiny_copy.toml"),
        "--no-progress",
        *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")],
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(list_checkpoints(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        proc.kill()
        proc.wait()
    found = list_checkpoints(out)
    assert found, "no checkpoint was written before the kill"
    for ckpt in found:
        load_model_dir(ckpt)
        load_tensors(ckpt / "optimizer.safetensors")
    step = int(found[-1].name[5:])
    more = train(
        tiny(corpus, out, **{"train.max_steps": step + 2, "train.keep_last": 2}), progress=False
    )
    assert more.step == step + 2


@pytest.mark.slow
def test_multi30k_short_run_gives_a_loadable_translator(multi30k_dir, tmp_path):
    """The shipped Multi30k preset, 60 steps in the machine's precision (dtype auto): validation
    improves, the run dir translates."""
    from aiayn.search.decode import greedy_decode

    raw = Path(multi30k_dir) / "raw"
    cfg = load_config(
        CONFIGS / "multi30k_de_en.toml",
        [
            f"train.src={raw / 'train.de'}",
            f"train.tgt={raw / 'train.en'}",
            f"train.valid_src={raw / 'val.de'}",
            f"train.valid_tgt={raw / 'val.en'}",
            f"train.out_dir={tmp_path / 'run'}",
            "train.max_steps=60",
            "train.valid_every=30",
            "train.bleu_samples=0",
            "train.best_metric=loss",
            "train.warmup_steps=60",
        ],
    )
    result = train(cfg, progress=False)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [r["valid_ppl"] for r in records if "valid_ppl" in r]
    assert result.step == 60 and len(valid) == 2 and valid[1] < valid[0]
    model, tok = load_model_dir(tmp_path / "run"), Tokenizer.load(tmp_path / "run")
    src = torch.tensor([tok.encode("Ein Hund läuft über eine Wiese.")])
    assert len(greedy_decode(model, src, max_len=20)[0]) <= 20


def test_early_stopping_after_patience_validations_without_improvement(corpus, tok, tmp_path):
    # A zero learning rate: the validation loss can never improve after the first validation.
    over = {
        "train.lr_schedule": "constant",
        "train.lr": 0.0,
        "train.valid_every": 5,
        "train.patience": 2,
        "train.max_steps": 1000,
    }
    result = train(tiny(corpus, tmp_path / "run", **over), tokenizer=tok, progress=False)
    assert result.stopped == "early_stopping" and result.step == 15


def test_a_run_whose_loss_is_nan_stops_and_saves_nothing_of_it(corpus, tmp_path, caplog):
    """A rate far too high: the loss becomes NaN within steps. Before, such a run trained on
    to max_steps and saved NaN checkpoints (and, without validation, a NaN model)."""
    from serving import child_env

    from aiayn.store.checkpoints import checkpoint_step
    from aiayn.store.model_dir import WEIGHTS_FILE

    over = {"train.lr_schedule": "constant", "train.lr": 1e30, "train.warmup_steps": 0,
            "train.valid_every": 0}  # fmt: skip
    # Found at a save (step 1's loss is finite, so its checkpoint is kept), or at a log.
    for name, when in (("save", {"train.save_every": 1}), ("log", {"train.log_every": 2})):
        out = tmp_path / name
        with caplog.at_level(logging.ERROR, logger="aiayn.training.finish"):
            result = train(tiny(corpus, out, **over, **when), progress=False)
        assert result.stopped == "diverged" and result.step < 10, name
        assert "diverged and stopped" in caplog.text and "train.lr (now 1e+30)" in caplog.text
        kept = list_checkpoints(out)
        assert [checkpoint_step(c) for c in kept] == ([1] if name == "save" else [])
        for ckpt in kept:  # saved before the loss went bad, never after
            assert all(t.isfinite().all() for t in load_tensors(ckpt / WEIGHTS_FILE).values())
        assert not (out / WEIGHTS_FILE).exists()  # no model of these weights either
    # The command, with stderr a pipe as under nohup: exit 1; log lines, and no bar (before,
    # its carriage-return redraws piled up on one line of the log, and no line was logged).
    cli = {**corpus, **over, "train.log_every": 2, "train.out_dir": str(tmp_path / "cli")}
    sets = [x for k, v in cli.items() for x in ("--set", f"{k}={v}")]
    proc = subprocess.run([sys.executable, "-m", "aiayn", "train", "--config",
                           str(CONFIGS / "tiny_copy.toml"), *sets], capture_output=True,
                          text=True, timeout=300, env=child_env())  # fmt: skip
    assert proc.returncode == 1 and "stopped (diverged)" in proc.stdout, proc.stderr[-500:]
    assert "\r" not in proc.stderr and re.search(r"INFO step 2/\d+ epoch 1: loss", proc.stderr)
