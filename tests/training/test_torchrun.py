"""Training under torchrun: two CPU ranks (gloo) against one process with the same global
batch, their resume, and a time budget fitted on a held-out validation set."""

from __future__ import annotations

import json
import os

import torch
from copy_task import CONFIGS, logged_losses

from aiayn.store.checkpoints import list_checkpoints
from aiayn.store.model_dir import load_tensors


def test_torchrun_two_ranks_match_one_process_with_the_same_global_batch(corpus, tmp_path):
    """2 CPU ranks (gloo, loopback) x 1 batch == 1 process x 2 accumulated batches.

    The step's gradient is the mean over all its target tokens either way, so the logged losses
    agree to rtol 1e-5 and the final weights to atol 1e-5 (only summation order differs).
    Dropout is off: ranks draw their own dropout masks, a single process draws one stream.
    """
    import subprocess
    import sys

    sets = {**corpus, "train.max_steps": 6, "train.log_every": 1, "model.dropout": 0.0}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    # CPU ranks on purpose (gloo): on a GPU machine "auto" would pick NCCL and one GPU per rank.
    base = [
        "-m",
        "aiayn",
        "train",
        "--config",
        str(CONFIGS / "tiny_copy.toml"),
        "--no-progress",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    ddp = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *base,
    ]
    for cmd, out, extra in (
        (ddp, tmp_path / "ddp", []),
        ([sys.executable, *base], tmp_path / "single", ["--set", "train.accum_steps=2"]),
    ):
        proc = subprocess.run(
            [*cmd, *args, "--set", f"train.out_dir={out}", *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        # torchrun's failure summary alone is ~2,000 characters: show the ranks' lines before it
        assert proc.returncode == 0, proc.stderr[-8000:]
    assert (tmp_path / "ddp" / "tokenizer.model").read_bytes() == (
        tmp_path / "single" / "tokenizer.model"
    ).read_bytes()
    ddp_losses, single_losses = logged_losses(tmp_path / "ddp"), logged_losses(tmp_path / "single")
    assert len(ddp_losses) == len(single_losses) == 6
    assert ddp_losses[-1] < ddp_losses[0]
    torch.testing.assert_close(ddp_losses, single_losses, rtol=1e-5, atol=0.0)
    a = load_tensors(list_checkpoints(tmp_path / "ddp")[-1] / "model.safetensors")
    b = load_tensors(list_checkpoints(tmp_path / "single")[-1] / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0.0, atol=1e-5)


def test_torchrun_resume_is_bit_identical(corpus, tmp_path):
    """2 ranks with dropout: 6 steps straight == 3 steps, stop, resume, 3 more."""
    import subprocess
    import sys

    base = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "aiayn",
        "train",
        "--config",
        str(CONFIGS / "tiny_copy.toml"),
        "--no-progress",
        "--device",
        "cpu",
    ]  # gloo on CPU ranks, also where a GPU is
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    sets = [a for k, v in corpus.items() for a in ("--set", f"{k}={v}")]
    for out, steps in (("a", 6), ("b", 3), ("b", 6)):
        proc = subprocess.run(
            [
                *base,
                *sets,
                "--set",
                f"train.out_dir={tmp_path / out}",
                "--set",
                f"train.max_steps={steps}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-8000:]
    a = load_tensors(list_checkpoints(tmp_path / "a")[-1] / "model.safetensors")
    b = load_tensors(list_checkpoints(tmp_path / "b")[-1] / "model.safetensors")
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_torchrun_two_ranks_fit_a_budget_on_a_held_out_validation_set(corpus, tmp_path):
    """2 CPU ranks, two files, a 6-second budget: both ranks hold out the same validation set,
    rank 0's speed fixes (and re-fits) the schedule for both, the checks' collectives line up
    (no hang), and the averaged model gets its alpha."""
    import subprocess
    import sys

    sets = {"train.src": corpus["train.src"], "train.tgt": corpus["train.tgt"],
            "train.out_dir": tmp_path / "run", "train.lr_schedule": "cosine_budget",
            "train.lr": 1e-3, "train.warmup_steps": 1000, "train.max_minutes": 0.1,
            "train.max_steps": 10**6, "train.valid_every": 25, "train.bleu_samples": 5,
            "train.average_last": 3, "decode.beam_size": 2}  # fmt: skip
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "aiayn",
        "train",
        "--config",
        str(CONFIGS / "tiny_copy.toml"),
        "--no-progress",
        "--device",
        "cpu",
        *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")],
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-8000:]
    run = tmp_path / "run"
    assert json.loads((run / "run_config.json").read_text())["heldout_valid"]["pairs"] == 20
    state = json.loads((list_checkpoints(run)[-1] / "train_state.json").read_text())
    assert 0 < state["fit_step"] < state["total_steps"]
    if "stopped (total_steps)" in proc.stdout:  # a busy machine may overrun the last steps
        assert state["step"] == state["total_steps"]
        assert "alpha_choice" in json.loads((run / "averaged" / "run_config.json").read_text())
