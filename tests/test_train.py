"""train.py: the loss, the schedules, and whole (tiny) runs: learning, resuming, refusing."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.config import PAD_ID, Config, ModelConfig, TrainConfig, load_config
from aiayn.errors import CheckpointError
from aiayn.store.checkpoints import list_checkpoints
from aiayn.store.model_dir import load_model_dir, load_tensors
from aiayn.text.tokenizer import Tokenizer
from aiayn.training.loss import label_smoothed_loss
from aiayn.training.run import LOG_POINTS, log_interval
from aiayn.training.schedule import BudgetPlan, cosine_lr, inverse_sqrt_lr, learning_rate, noam_lr
from aiayn.training.loop import train

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

# --- the loss -------------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), eps=st.sampled_from([0.0, 0.1, 0.3]), n=st.integers(1, 40))
def test_loss_equals_torch_cross_entropy(seed, eps, n):
    """Value and gradient: the written-out backward against autograd through PyTorch's."""
    g = torch.Generator().manual_seed(seed)
    logits_NV = (torch.randn(n, 11, generator=g) * 3).requires_grad_()
    ref_logits_NV = logits_NV.detach().clone().requires_grad_()
    target_N = torch.randint(0, 11, (n,), generator=g)  # includes PAD_ID = 0 sometimes
    loss, nll = label_smoothed_loss(logits_NV, target_N, eps, PAD_ID)
    ref = F.cross_entropy(
        ref_logits_NV, target_N, label_smoothing=eps, ignore_index=PAD_ID, reduction="sum"
    )
    ref_nll = F.cross_entropy(ref_logits_NV, target_N, ignore_index=PAD_ID, reduction="sum")
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    (2.5 * loss).backward()  # an upstream gradient other than 1 reaches every row
    (2.5 * ref).backward()
    torch.testing.assert_close(logits_NV.grad, ref_logits_NV.grad, rtol=1e-5, atol=1e-6)
    assert not nll.requires_grad  # a reading for the log, not a second objective


def test_loss_gradient_comes_back_in_the_logits_dtype():
    """Under bf16 autocast the logits are bf16: the loss is computed in fp32 and its gradient
    is handed back as bf16, as autograd's cast would."""
    logits = torch.randn(5, 9).to(torch.bfloat16).requires_grad_()
    loss, _ = label_smoothed_loss(logits, torch.tensor([1, 2, PAD_ID, 4, 5]), 0.1, PAD_ID)
    assert loss.dtype == torch.float32
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loss_in_chunks_gives_every_row_the_bits_of_one_pass(monkeypatch, dtype):
    """The loss goes through the logits a few rows at a time on a CPU (`CHUNK_BYTES`): value,
    NLL and gradient are bit for bit those of one pass over the whole matrix, whatever the
    chunk and however the rows split (23 rows in chunks of 1, 3 and 7, and all at once)."""
    import aiayn.training.loss as loss_module

    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(23, 11, generator=g) * 3).to(dtype)
    target = torch.randint(0, 11, (23,), generator=g)

    def run(chunk_rows: int) -> tuple[torch.Tensor, ...]:
        monkeypatch.setattr(loss_module, "CHUNK_BYTES", 4 * 11 * chunk_rows)
        x = logits.clone().requires_grad_()
        loss, nll = label_smoothed_loss(x, target, 0.1, PAD_ID)
        (1.7 * loss).backward()
        return loss, nll, x.grad

    whole = run(23)
    for rows in (1, 3, 7):
        for a, b in zip(run(rows), whole, strict=True):
            assert torch.equal(a, b), rows


def test_loss_ignores_pad_completely():
    logits = torch.randn(4, 7, requires_grad=True)
    loss, _ = label_smoothed_loss(logits, torch.tensor([3, PAD_ID, 5, PAD_ID]), 0.1, PAD_ID)
    loss.backward()
    assert logits.grad[1].abs().sum() == 0 and logits.grad[3].abs().sum() == 0


# --- schedules --------------------------------------------------------------------------------


def test_noam_peaks_at_warmup_and_matches_equation_3():
    d_model, warmup = 512, 4000
    rates = [noam_lr(s, d_model, warmup) for s in range(1, 20001)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == warmup
    assert rates[warmup - 1] == pytest.approx(d_model**-0.5 * warmup**-0.5)
    assert noam_lr(100, d_model, warmup) == pytest.approx(d_model**-0.5 * 100 * warmup**-1.5)
    assert noam_lr(10000, d_model, warmup, 2.0) == pytest.approx(2 * d_model**-0.5 * 0.01)


def test_other_schedules():
    assert inverse_sqrt_lr(50, 100, 1e-3) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(100, 100, 1e-3) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(400, 100, 1e-3) == pytest.approx(5e-4)
    assert cosine_lr(100, 100, 1100, 1e-3) == pytest.approx(1e-3)
    assert cosine_lr(600, 100, 1100, 1e-3) == pytest.approx(5e-4)
    assert cosine_lr(1100, 100, 1100, 1e-3) == pytest.approx(0.0, abs=1e-12)
    tc = TrainConfig(lr_schedule="constant", lr=3e-4)
    assert learning_rate(7, tc, 512) == 3e-4


# --- whole runs on a copy task --------------------------------------------------------------------


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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_copy_corpus(tmp_path_factory.mktemp("copy"))


@pytest.fixture(scope="module")
def tok(corpus):
    lines = Path(corpus["train.src"]).read_text().splitlines()
    return Tokenizer.train(lines, vocab_size=300)


def tiny(corpus: dict[str, str], out: Path, **over: object):
    sets = {**corpus, "train.out_dir": str(out), **{k: str(v) for k, v in over.items()}}
    return load_config(CONFIGS / "tiny_copy.toml", [f"{k}={v}" for k, v in sets.items()])


def test_the_data_check_and_encoding_of_a_run_have_bars_only_where_training_has_one(
    corpus, tok, tmp_path, monkeypatch, capsys
):
    """Training's own data check and the encoding are passes over the corpus (minutes for a
    large one): on a terminal each shows a bar; with --no-progress, or in a log, none."""
    import aiayn.runtime.progress as progress
    import aiayn.training.setup as training

    monkeypatch.setattr(progress, "interactive", lambda: True)  # a terminal, as far as the bar
    monkeypatch.setattr(training, "interactive", lambda: True)  # and training can tell
    dropped = {"train.src": tmp_path / "train.src", "train.tgt": tmp_path / "train.tgt"}
    for key, extra in (("train.src", "a b\n" * 5), ("train.tgt", "\n" * 5)):  # 5 empty sides
        dropped[key].write_text(Path(corpus[key]).read_text() + extra)
    bar = tiny({**corpus, **{k: str(v) for k, v in dropped.items()}}, tmp_path / "bar",
               **{"train.max_steps": 1})  # fmt: skip
    train(bar, tokenizer=tok)
    err = capsys.readouterr().err
    assert "check train.src: 100%" in err and "405/405" in err
    # the encoding's bar ends at 100% of the pairs passed on, not at 400 of the file's 405
    assert "encode train.src: 100%" in err and "400/400" in err
    train(tiny(corpus, tmp_path / "quiet", **{"train.max_steps": 1}), tokenizer=tok,
          progress=False)  # fmt: skip
    err = capsys.readouterr().err
    assert "check train.src" not in err and "encode train.src" not in err


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


def test_two_files_are_enough_a_validation_set_is_held_out(corpus, tok, tmp_path):
    """Without valid_src/valid_tgt the run holds 5% of the corpus out, writes it into the run
    directory, records it in run_config.json, validates on it (best checkpoint, BLEU), never
    trains on its sources, and resumes with the same held-out set."""
    two_files = {k: v for k, v in corpus.items() if not k.startswith("train.valid")}
    out = tmp_path / "run"
    over = {"train.max_steps": 20, "train.valid_every": 10, "train.bleu_samples": 5}
    train(tiny(two_files, out, **over), tokenizer=tok, progress=False)
    run_cfg = json.loads((out / "run_config.json").read_text())
    held = run_cfg["heldout_valid"]
    src_lines = (out / held["src"]).read_text().splitlines()
    tgt_lines = (out / held["tgt"]).read_text().splitlines()
    assert held["corpus_lines"] == 400 and held["drawn"] == 20  # 5% of the copy corpus
    assert len(src_lines) == len(tgt_lines) == held["pairs"] > 0 and src_lines == tgt_lines
    corpus_src = Path(corpus["train.src"]).read_text().splitlines()
    repeats = sum(1 for line in corpus_src if line in set(src_lines))
    assert held["left_out_of_training"] == repeats >= held["pairs"]
    assert run_cfg["train"]["valid_src"] == ""  # the recipe is unchanged: a resume matches
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if "valid_loss" in r]
    assert [r["step"] for r in valid] == [10, 20] and all("valid_bleu" in r for r in valid)
    assert valid[-1]["best_step"] in (10, 20)
    more = train(tiny(two_files, out, **{**over, "train.max_steps": 30}), progress=False)
    assert more.step == 30 and (out / held["src"]).read_text().splitlines() == src_lines


def test_train_runs_the_data_check_and_says_what_it_found(corpus, tok, tmp_path, caplog):
    """The copy corpus is all copies, repeats some pairs, and its validation set is its first
    40 training pairs: the log says so, once per run (not again on resume)."""

    from aiayn.text.check import check_corpus

    expected = check_corpus(
        corpus["train.src"],
        corpus["train.tgt"],
        {"valid": (corpus["train.valid_src"], corpus["train.valid_tgt"])},
    )
    assert expected.counts["copies"] == 400 and expected.counts["overlap"] == 40
    with caplog.at_level(logging.INFO, logger="aiayn.training.setup"):
        train(tiny(corpus, tmp_path / "run", **{"train.max_steps": 2}), tokenizer=tok,
              progress=False)  # fmt: skip
    found = [r.getMessage() for r in caplog.records if "data check" in r.getMessage()]
    assert len(found) == 1 and found[0].startswith(f"data check: {expected.summary()} (")
    assert "aiayn data check --src" in found[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aiayn.training.setup"):
        train(tiny(corpus, tmp_path / "run", **{"train.max_steps": 3}), progress=False)
    assert not [r for r in caplog.records if "data check" in r.getMessage()]


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


def test_refuses_foreign_dirs_incompatible_configs_and_corrupt_checkpoints(corpus, tok, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        train(tiny(corpus, foreign, **{"train.max_steps": 2}), tokenizer=tok, progress=False)
    assert (foreign / "notes.txt").read_text() == "mine" and len(list(foreign.iterdir())) == 1

    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 4}), tokenizer=tok, progress=False)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match=r"model.d_model was 32, now 48"):
        train(tiny(corpus, out, **{"train.max_steps": 8, "model.d_model": 48}), progress=False)
    with pytest.raises(CheckpointError, match=r"train.max_tokens was 256"):
        train(tiny(corpus, out, **{"train.max_steps": 8, "train.max_tokens": 512}), progress=False)
    last = list_checkpoints(out)[-1]
    (last / "optimizer.safetensors").write_bytes(b"garbage")
    before[last / "optimizer.safetensors"] = b"garbage"
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        train(tiny(corpus, out, **{"train.max_steps": 8}), progress=False)
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # nothing overwritten by any refused attempt


def test_a_run_from_before_a_field_existed_resumes_under_its_default(corpus, tok, tmp_path):
    """A field added after the run started is missing from its run_config.json: the default
    (new options start off) is what the run ran, so it resumes under it, and only under it."""
    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 4}), tokenizer=tok, progress=False)
    path = out / "run_config.json"
    saved = json.loads(path.read_text())
    del saved["train"]["subword_alpha"], saved["model"]["activation"]
    path.write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match=r"train.subword_alpha was 0.0, now 0.1"):
        train(tiny(corpus, out, **{"train.max_steps": 8, "train.subword_alpha": 0.1}),
              progress=False)  # fmt: skip
    assert train(tiny(corpus, out, **{"train.max_steps": 8}), progress=False).step == 8


def test_resume_follows_moved_data_and_refuses_edited_data(corpus, tok, tmp_path):
    """The data is checked by content (sha256 in run_config.json): moved files resume, edited
    files are refused, whatever their path."""
    moved = tmp_path / "moved"
    moved.mkdir()
    new_paths = {}
    for key, path in corpus.items():
        new_paths[key] = str(moved / Path(path).name)
        Path(new_paths[key]).write_bytes(Path(path).read_bytes())
    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 4}), tokenizer=tok, progress=False)
    result = train(tiny(new_paths, out, **{"train.max_steps": 8}), progress=False)
    assert result.step == 8
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["train"]["src"] == new_paths["train.src"]
    tgt = Path(new_paths["train.tgt"])
    tgt.write_text(tgt.read_text().replace("a", "b", 1))  # same lines, one letter changed
    with pytest.raises(CheckpointError, match=r"train.tgt .* differs from the file the run"):
        train(tiny(new_paths, out, **{"train.max_steps": 12}), progress=False)


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
    losses = [_losses(tmp_path / name) for name in ("eager", "compiled")]
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


def _losses(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "loss" in r]


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
    ddp_losses, single_losses = _losses(tmp_path / "ddp"), _losses(tmp_path / "single")
    assert len(ddp_losses) == len(single_losses) == 6
    assert ddp_losses[-1] < ddp_losses[0]
    torch.testing.assert_close(ddp_losses, single_losses, rtol=1e-5, atol=0.0)
    a = load_tensors(list_checkpoints(tmp_path / "ddp")[-1] / "model.safetensors")
    b = load_tensors(list_checkpoints(tmp_path / "single")[-1] / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0.0, atol=1e-5)


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


def test_cli_train_runs_and_bad_input_is_one_line(corpus, tmp_path, capsys):
    from aiayn.cli.main import main

    base = ["train", "--config", str(CONFIGS / "tiny_copy.toml"), "--no-progress"]
    sets = [a for k, v in corpus.items() for a in ("--set", f"{k}={v}")]
    out = tmp_path / "run"
    assert main([*base, *sets, "--set", f"train.out_dir={out}", "--set", "train.max_steps=3"]) == 0
    assert "stopped (max_steps) at step 3" in capsys.readouterr().out
    bad = [
        *base,
        "--set",
        f"train.src={tmp_path / 'missing.de'}",
        "--set",
        f"train.tgt={tmp_path / 'missing.en'}",
        "--set",
        f"train.out_dir={tmp_path / 'x'}",
    ]
    assert main(bad) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "corpus file not found" in err
    assert not (tmp_path / "x").exists()  # nothing created for a run that could not start
    no_bleu = ["--set", "train.best_metric=bleu", "--set", "train.bleu_samples=0"]
    assert main([*base, *sets, "--set", f"train.out_dir={tmp_path / 'y'}", *no_bleu]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs train.bleu_samples >= 1" in err
    # 361 billion parameters: torch's allocation traceback after the tokenizer and the held-out
    # files were written; now one line, sized on the meta device, before anything is written
    huge = ["--set", "model.d_model=65536", "--set", "model.d_ff=262144"]
    assert main([*base, *sets, "--set", f"train.out_dir={tmp_path / 'z'}", *huge]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "parameters: training holds at least 16 bytes each" in err
    assert not (tmp_path / "z").exists()
    # a small model with a position table of 10^9 rows (a buffer: no parameter counts it)
    table = ["--set", "model.max_len=1000000000"]
    assert main([*base, *sets, "--set", f"train.out_dir={tmp_path / 'v'}", *table]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "sinusoidal table of max_len=1,000,000,000" in err
    assert not (tmp_path / "v").exists()
    # train.max_len past the positional table: refused before the tokenizer is trained too
    long = ["--set", "train.max_len=100000"]
    assert main([*base, *sets, "--set", f"train.out_dir={tmp_path / 'w'}", *long]) == 2
    assert "exceeds model.max_len" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    # every pair filtered out (a side over MAX_LINE_CHARS, or empty) was "cannot train a
    # tokenizer on empty text"; now the filter's own report
    for name, line in (("long", "wort " * 3000), ("empty", " ")):
        for side in ("src", "tgt"):
            (tmp_path / f"{name}.{side}").write_text(f"{line}\n" * 3)
        files = [
            "--set",
            f"train.src={tmp_path / name}.src",
            "--set",
            f"train.tgt={tmp_path / name}.tgt",
        ]
        assert main([*base, *files, "--set", f"train.out_dir={tmp_path / name}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "no training pairs left after filtering" in err
        assert "read 3 pairs, kept 0" in err


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


def test_the_last_weights_are_validated_and_a_model_is_always_saved(corpus, tok, tmp_path):
    """Stopping between validations still validates the final weights (they may be the best),
    and a run stopped before its first validation still leaves a loadable model directory."""
    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 13, "train.valid_every": 5}), tokenizer=tok,
          progress=False)  # fmt: skip
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "valid_loss" in r] == [5, 10, 13]
    early = tmp_path / "early"
    over = {"train.max_steps": 3, "train.valid_every": 1000, "train.save_every": 1000}
    train(tiny(corpus, early, **over), tokenizer=tok, progress=False)
    assert load_model_dir(early).cfg.vocab_size == tok.vocab_size


# --- a recipe that fits the budget (lr_schedule = "cosine_budget", average_last) --------------


def test_fit_total_steps_is_the_step_where_the_budget_runs_out():
    from aiayn.training.schedule import BUDGET_MARGIN, fit_total_steps

    # 100 steps done in 60 s of a 600 s budget at 2 steps/s: 540 s left -> 1080 more steps
    assert fit_total_steps(100, 2.0, 60.0, 600.0, 10**6) == 100 + int(BUDGET_MARGIN * 1080)
    assert fit_total_steps(100, 2.0, 60.0, 600.0, 500) == 500  # max_steps caps it
    assert fit_total_steps(100, 2.0, 700.0, 600.0, 10**6) == 100  # over budget: stop now
    # a 50 s validation every 100 steps, counted one by one: the 513 s planned for (95% of
    # 540 s) hold 526 more steps (263 s) and the validations at 200, ..., 600 (250 s)
    assert round(BUDGET_MARGIN * 540) == 513
    assert fit_total_steps(100, 2.0, 60.0, 600.0, 10**6, valid_every=100, valid_s=50.0) == 626


def test_average_steps_are_evenly_spaced_over_the_last_fifth():
    from aiayn.training.schedule import average_steps

    assert average_steps(200, 5) == [168, 176, 184, 192, 200]
    assert average_steps(1000, 4) == [850, 900, 950, 1000]
    assert average_steps(3, 5) == [1, 2, 3]  # a tiny schedule: one step apart, never below 1
    # fitted at step 190 of 200: the last fifth (from 168) is partly past, so closer together
    assert average_steps(200, 5, after=190) == [192, 194, 196, 198, 200]
    assert average_steps(200, 5, after=150) == [168, 176, 184, 192, 200]
    # warmup-stable-decay falling over the last quarter: the span is a quarter as long, so
    # the first averaged checkpoint sees the rate the full cosine's first one sees
    from aiayn.training.schedule import BudgetPlan, budget_lr

    wsd = average_steps(1000, 5, decay=0.25)
    assert wsd == [960, 970, 980, 990, 1000]
    plan = BudgetPlan(1000, 10, 100)
    first_cosine = budget_lr(average_steps(1000, 5)[0], 1e-3, 100, plan)
    first_wsd = budget_lr(wsd[0], 1e-3, 100, plan, decay=0.25)
    assert first_wsd == pytest.approx(first_cosine) and first_cosine < 0.1e-3


def test_a_refit_moves_an_end_earlier_more_readily_than_later():
    """An end set too late is cut off by max_minutes (no rate at 0, planned checkpoints
    missing); one set too early costs a few steps: 0.5% earlier moves it, later needs 2%."""
    from aiayn.training.schedule import refit_moves

    assert not refit_moves(1000, 1000)
    assert not refit_moves(1000, 996) and refit_moves(1000, 994)  # earlier: over 0.5%
    assert not refit_moves(1000, 1020) and refit_moves(1000, 1021)  # later: over 2%
    assert refit_moves(1000, 980)


def test_a_stop_inside_the_averaged_span_stands_in_for_the_checkpoints_not_reached():
    from aiayn.training.finish import averaged_steps

    planned = [840, 879, 918, 957, 996]
    assert averaged_steps(planned, 996) == planned  # on schedule
    assert averaged_steps(planned, 991) == [840, 879, 918, 957, 991]  # max_minutes, 5 short
    assert averaged_steps(planned, 957) == [840, 879, 918, 957]  # on a planned step: itself
    assert averaged_steps(planned, 800) == []  # before the span: nothing to stand in for
    assert averaged_steps([], 50) == []


def test_budget_rate_warms_up_without_waiting_for_the_fit_and_never_jumps():
    from aiayn.training.schedule import BudgetPlan, budget_lr, fit_warmup_end

    peak, warmup = 1e-3, 1000
    # before the fit: the configured slope
    assert budget_lr(20, peak, warmup, BudgetPlan()) == pytest.approx(2e-5)
    # fitted at step 20 to 300 steps: the warmup ends at 30 (10% of the total), not at 1000
    end = fit_warmup_end(300, warmup)
    assert end == 30
    plan = BudgetPlan(300, 20, end)
    rates = [budget_lr(s, peak, warmup, plan) for s in range(1, 301)]
    assert rates[19] == pytest.approx(2e-5) and rates[29] == pytest.approx(peak)
    assert max(rates) == pytest.approx(peak) and rates[-1] == pytest.approx(0.0, abs=1e-15)
    assert all(b <= a for a, b in itertools.pairwise(rates[29:]))  # decays to the end
    steps_up = [b - a for a, b in itertools.pairwise(rates[:30])]
    assert max(steps_up) <= (peak - 2e-5) / 10 + 1e-12  # the fit does not jump the rate
    # the speed measured over 40 steps of a 100-step run (a slow machine): the rate goes on
    # rising to the peak over a tenth of the 60 steps left, then decays
    assert fit_warmup_end(100, warmup, 40) == 46
    late = BudgetPlan(100, 40, fit_warmup_end(100, warmup, 40))
    rates = [budget_lr(s, peak, warmup, late) for s in range(40, 101)]
    assert rates[0] == pytest.approx(4e-5) and rates[6] == pytest.approx(peak) == max(rates)
    # a plan whose warmup ended before the fit (not made any more): decay from the rate reached
    odd = BudgetPlan(100, 40, 10)
    assert budget_lr(41, peak, warmup, odd) <= budget_lr(40, peak, warmup, odd)
    # a checkpoint from before fit_step/warmup_end were saved: the configured warmup, as then
    assert budget_lr(1000, peak, warmup, BudgetPlan(3000)) == pytest.approx(peak)
    assert budget_lr(2000, peak, warmup, BudgetPlan(3000)) == pytest.approx(peak / 2)


def test_budget_decay_holds_the_peak_then_falls_over_its_share():
    from aiayn.training.schedule import BudgetPlan, budget_lr

    peak, warmup = 1e-3, 1000
    plan = BudgetPlan(300, 20, 30)  # cosine from step 30 to 300: 270 steps
    rates = [budget_lr(s, peak, warmup, plan, decay=0.25) for s in range(1, 301)]
    cosine = [budget_lr(s, peak, warmup, plan) for s in range(1, 301)]
    assert rates[:30] == cosine[:30]  # the warmup is the same
    flat_until = 30 + int(0.75 * 270)  # step 232: the last quarter of the cosine's way falls
    assert all(r == pytest.approx(peak) for r in rates[29:flat_until])
    assert rates[265] == pytest.approx(peak / 2, rel=0.02)  # step 266: half way down
    assert rates[-1] == pytest.approx(0.0, abs=1e-15)
    assert all(b <= a for a, b in itertools.pairwise(rates[29:]))
    assert all(r >= c for r, c in zip(rates, cosine, strict=True))  # never below the cosine
    # re-fitted in the fall (a slower machine: the end moves from 300 to 280), no jump
    moved = BudgetPlan(280, 20, 30, refit_step=260, refit_progress=plan.progress(260, 30))
    before, after = (
        budget_lr(260, peak, warmup, plan, 0.25),
        budget_lr(261, peak, warmup, moved, 0.25),
    )
    assert after <= before and before - after < peak / 20
    assert budget_lr(280, peak, warmup, moved, 0.25) == pytest.approx(0.0, abs=1e-15)


def test_a_refit_moves_the_end_and_the_rate_goes_on_from_where_it_was():
    """Re-fitted at step 150 of 300 (the machine slowed: the end is now 250): the rate at 150
    is kept, the cosine's rest is spread over 150-250, and it reaches 0 at the new end."""
    from aiayn.training.schedule import BudgetPlan, budget_lr

    peak, warmup = 1e-3, 30
    before = BudgetPlan(300, 20, 30)
    at = before.progress(150, 30)
    after = BudgetPlan(250, 20, 30, refit_step=150, refit_progress=at)
    assert budget_lr(150, peak, warmup, after) == pytest.approx(budget_lr(150, peak, warmup,
                                                                          before))  # fmt: skip
    rates = [budget_lr(s, peak, warmup, after) for s in range(150, 251)]
    assert all(b < a for a, b in itertools.pairwise(rates))
    assert abs(rates[1] - rates[0]) < 2 * abs(budget_lr(150, peak, warmup, before)
                                              - budget_lr(149, peak, warmup, before))  # fmt: skip
    assert rates[-1] == pytest.approx(0.0, abs=1e-15)
    assert budget_lr(200, peak, warmup, after) == pytest.approx(
        0.5 * peak * (1 + math.cos(math.pi * (at + (1 - at) * 0.5)))
    )


def test_budget_schedule_reaches_zero_at_the_total_and_survives_a_resume(corpus, tok, tmp_path):
    """Without a time budget the total is max_steps, fixed once: a resume with a larger
    max_steps keeps it, ends there at a rate of ~0 and averages the planned checkpoints."""
    out = tmp_path / "run"
    over = {
        "train.lr_schedule": "cosine_budget",
        "train.lr": 1e-3,
        "train.warmup_steps": 10,
        "train.average_last": 3,
        "train.valid_every": 1000,
        "train.save_every": 20,
    }
    first = train(tiny(corpus, out, **over, **{"train.max_steps": 60, "train.max_epochs": 1}),
                  tokenizer=tok, progress=False)  # fmt: skip
    assert first.stopped == "max_epochs" and first.step < 48  # before the averaging span
    saved = json.loads((list_checkpoints(out)[-1] / "train_state.json").read_text())
    assert saved["total_steps"] == 60 and saved["fit_step"] == 0 and saved["warmup_end"] == 6
    assert not (out / "averaged").exists()  # logged: stopped before the schedule's end
    second = train(tiny(corpus, out, **over, **{"train.max_steps": 500}), progress=False)
    assert second.stopped == "total_steps" and second.step == 60
    steps = [int(c.name[5:]) for c in list_checkpoints(out)]
    assert steps[-3:] == [52, 56, 60]  # average_steps(60, 3): the last 20% of the schedule
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if "lr" in r][-1]["lr"] == pytest.approx(0.0, abs=1e-12)
    tc = tiny(corpus, out, **over).train
    plan = BudgetPlan(total=60, fit_step=0, warmup_end=6)  # warmup: 10% of the total
    assert learning_rate(6, tc, 32, plan) == pytest.approx(1e-3)
    assert learning_rate(33, tc, 32, plan) == pytest.approx(5e-4)
    assert learning_rate(60, tc, 32, plan) == pytest.approx(0.0, abs=1e-12)
    averaged = load_model_dir(out / "averaged")  # a model directory, with its tokenizer
    assert Tokenizer.load(out / "averaged").vocab_size == averaged.cfg.vocab_size
    assert_mean_of_checkpoints(out, (52, 56, 60))


def assert_mean_of_checkpoints(out: Path, steps: tuple[int, ...]) -> None:
    """OUT/averaged's weights are the mean of the checkpoints of `steps`."""
    averaged = load_model_dir(out / "averaged")
    ckpts = [load_tensors(out / "checkpoints" / f"step_{s:08d}" / "model.safetensors")
             for s in steps]  # fmt: skip
    for name, t in averaged.state_dict().items():
        if name in ckpts[0]:
            mean = sum(c[name].double() for c in ckpts) / len(ckpts)
            torch.testing.assert_close(t.double(), mean, rtol=1e-6, atol=1e-6)


def test_a_run_stopped_inside_the_averaged_span_still_averages(corpus, tok, tmp_path, caplog,
                                                               monkeypatch):  # fmt: skip
    """max_minutes stops the run at step 58 of a schedule ending at 60 (a machine slower than
    its last re-fit knew): averaged/ is the mean of the planned checkpoints 52 and 56 and the
    stop's own at 58, and the log says which stood in."""

    from aiayn.training.run import Run

    should_stop = Run.should_stop

    def late_at_58(self: Run, flag: dict[str, int]) -> str | None:
        return "max_minutes" if self.state.step == 58 else should_stop(self, flag)

    monkeypatch.setattr(Run, "should_stop", late_at_58)
    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 1e-3, "train.warmup_steps": 10,
            "train.average_last": 3, "train.valid_every": 1000, "train.save_every": 20,
            "train.max_steps": 60}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="aiayn.training.finish"):
        result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    assert result.stopped == "max_minutes" and result.step == 58
    said = [r.getMessage() for r in caplog.records if "averaged the checkpoints" in r.getMessage()]
    assert len(said) == 1 and "[52, 56, 58]" in said[0] and "stands in" in said[0]
    assert_mean_of_checkpoints(out, (52, 56, 58))


def test_a_stale_trash_averaged_does_not_stop_the_average(corpus, tok, tmp_path):
    """An interrupted earlier swap can leave `.trash_averaged`: the next average clears it."""
    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.max_steps": 20,
            "train.average_last": 2, "train.save_every": 10, "train.valid_every": 1000}  # fmt: skip
    train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    first = (out / "averaged" / "model.safetensors").read_bytes()
    (out / ".trash_averaged").mkdir()
    (out / ".trash_averaged" / "model.safetensors").write_bytes(b"stale")
    train(tiny(corpus, out, **over), tokenizer=tok, progress=False)  # a rerun: averages again
    assert (out / "averaged" / "model.safetensors").read_bytes() == first
    assert not (out / ".trash_averaged").exists()


def test_budget_schedule_is_fitted_to_max_minutes(corpus, tok, tmp_path):
    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 1e-3, "train.warmup_steps": 5,
            "train.max_minutes": 0.05, "train.max_steps": 10**6, "train.valid_every": 10,
            "train.average_last": 2}  # fmt: skip
    result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    state = json.loads((list_checkpoints(out)[-1] / "train_state.json").read_text())
    total = state["total_steps"]
    # measured from step 1 over 10 steps (or 0.3 s on a slow machine), then fitted to 3 s
    assert 1 <= state["fit_step"] <= 11 and state["fit_step"] < total < 10**6
    assert result.stopped in ("total_steps", "max_minutes")  # a busy machine may overrun
    if result.stopped == "total_steps":
        assert result.step == total and (out / "averaged" / "model.safetensors").is_file()


def test_a_budget_shorter_than_the_warmup_still_decays_to_its_end_and_averages(
    corpus, tok, tmp_path
):
    """6 seconds with warmup_steps = 1000, far more steps than the budget holds: the speed is
    measured from the first steps, the warmup shrinks to 10% of the fitted total, and the run
    decays to 0 at its end and writes averaged/ from checkpoints planned after the fit. Its
    training curve has ~LOG_POINTS records up to its last step, though log_every is 1000."""
    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 1e-3, "train.warmup_steps": 1000,
            "train.max_minutes": 0.1, "train.max_steps": 10**6, "train.valid_every": 1000,
            "train.save_every": 1000, "train.average_last": 3, "train.log_every": 1000}  # fmt: skip
    result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    state = json.loads((list_checkpoints(out)[-1] / "train_state.json").read_text())
    total, fit_step, warmup_end = state["total_steps"], state["fit_step"], state["warmup_end"]
    # A busy machine may overrun the 5% margin by a few steps; the averaging still happens.
    assert result.stopped in ("total_steps", "max_minutes") and result.step > 0.8 * total
    # warmup: a tenth of the fitted total (or, if measuring outlasted that, a tenth of the
    # rest after the fit); a re-fit may have moved the total a little since
    assert fit_step < warmup_end <= 0.25 * total and warmup_end < 1000
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["lr"] for r in records if "lr" in r]
    assert max(rates) == pytest.approx(1e-3, rel=0.2)  # the peak is reached ...
    assert rates[-1] < 0.1 * max(rates)  # ... and the rate decays to ~0 at the end
    logged = [r["step"] for r in records if "loss" in r]
    assert len(logged) >= LOG_POINTS // 2 and logged[-1] == result.step, logged
    planned = [int(c.name[5:]) for c in list_checkpoints(out)]
    assert len(planned) >= 2 and planned[0] > fit_step
    if result.stopped == "total_steps":
        assert len(planned) == 3 and planned[-1] == total
    load_model_dir(out / "averaged")


def test_log_interval_gives_a_short_fitted_run_a_curve():
    assert log_interval(50, 0) == 50  # no fitted schedule: log_every as set
    assert log_interval(50, 100_000) == 50  # a long run: log_every as set
    assert log_interval(50, 540) == 540 // LOG_POINTS  # a 20-minute CPU budget: ~40 records
    assert log_interval(50, 26) == 1  # a few dozen steps: every step
    assert log_interval(0, 540) == 0  # no training records asked for: none


def test_a_run_slower_than_its_measured_speed_refits_its_end_and_still_averages(
    corpus, tok, tmp_path, caplog
):
    """The speed is measured over the first 20 steps, before any validation; then a costly
    validation (BLEU over 40 greedy translations) every 25 steps slows the run down. The total
    is re-fitted (the log says so, the plan in train_state.json records it) and the run still
    ends on its schedule, with averaged/."""

    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 1e-3, "train.warmup_steps": 1000,
            "train.max_minutes": 0.1, "train.max_steps": 10**6, "train.valid_every": 25,
            "train.bleu_samples": 40, "train.save_every": 1000,
            "train.average_last": 3}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="aiayn.training.budget"):
        result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    refits = [r.getMessage() for r in caplog.records if "now ends at step" in r.getMessage()]
    state = json.loads((list_checkpoints(out)[-1] / "train_state.json").read_text())
    assert refits and state["refit_step"] > state["fit_step"] and 0 < state["refit_progress"] < 1
    # On schedule; a machine slowed further after the last re-fit (another job on the other
    # core) may stop it at max_minutes a few steps short, still with averaged/ written.
    if result.stopped == "max_minutes":
        assert result.step >= 0.9 * state["total_steps"]
    else:
        assert result.stopped == "total_steps" and result.step == state["total_steps"]
    load_model_dir(out / "averaged")


def test_a_budget_run_chooses_alpha_on_validation_for_its_averaged_model(
    corpus, tok, tmp_path, capsys
):
    """At the end of a cosine_budget run the averaged model's [decode] alpha is the best of
    ALPHA_GRID on validation (unless within chance of the recipe's own), found by the same sweep
    as `evaluate --alphas` (same BLEUs), and
    saved where translate reads its defaults; the run directory's own model keeps its alpha."""
    from aiayn.cli.main import main
    from aiayn.training.finish import ALPHA_GRID
    from aiayn.translate.translator import best_alpha_row, saved_decode_config

    out = tmp_path / "run"
    over = {"train.lr_schedule": "cosine_budget", "train.lr": 3e-3, "train.warmup_steps": 10,
            "train.max_steps": 60, "train.valid_every": 1000, "train.average_last": 2,
            "decode.beam_size": 2}  # fmt: skip
    train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    saved = json.loads((out / "averaged" / "run_config.json").read_text())
    choice = saved["alpha_choice"]
    assert choice["sentences"] == 40 and choice["beam_size"] == 2  # the whole validation set
    rows = choice["rows"]
    assert [r["alpha"] for r in rows] == list(ALPHA_GRID)
    # sweep_alpha's choice: the highest, unless within chance of the recipe's own 0.6
    best = rows[best_alpha_row(rows, keep=[r["current"] for r in rows].index(True))]
    assert [r["best"] for r in rows].count(True) == 1 and best["best"]
    assert saved["decode"]["alpha"] == best["alpha"] == saved_decode_config(out / "averaged").alpha
    assert saved_decode_config(out).alpha == 0.6  # the run's own [decode] is untouched
    capsys.readouterr()
    args = ["evaluate", "--model", str(out / "averaged"), "--src", corpus["train.valid_src"],
            "--ref", corpus["train.valid_tgt"], "--beam", "2", "--json",
            "--alphas", ",".join(str(a) for a in ALPHA_GRID)]  # fmt: skip
    assert main(args) == 0
    swept = json.loads(capsys.readouterr().out)
    assert [(r["alpha"], r["bleu"]) for r in swept] == [(r["alpha"], r["bleu"]) for r in rows]


def test_a_run_of_any_schedule_averages_its_last_checkpoints(corpus, tok, tmp_path, capsys):
    """average_last with the paper's schedule (not cosine_budget): at the end the last n
    checkpoints kept (save_every apart, and the final step's) are averaged into
    OUT_DIR/averaged, the same weights as `aiayn average --last n`, and its alpha is chosen on
    validation as a budget run's is."""
    from aiayn.cli.main import main
    from aiayn.translate.translator import saved_decode_config

    out = tmp_path / "run"
    over = {"train.lr_schedule": "noam", "train.max_steps": 50, "train.save_every": 20,
            "train.keep_last": 3, "train.average_last": 3, "train.valid_every": 1000,
            "decode.beam_size": 2}  # fmt: skip
    train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    assert [int(c.name[5:]) for c in list_checkpoints(out)] == [20, 40, 50]
    assert main(["average", "--run", str(out), "--last", "3", "--out", str(tmp_path / "cli")]) == 0
    ours = load_tensors(out / "averaged" / "model.safetensors")
    theirs = load_tensors(tmp_path / "cli" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=0)
    saved = json.loads((out / "averaged" / "run_config.json").read_text())
    assert saved["alpha_choice"]["beam_size"] == 2
    assert saved_decode_config(out / "averaged").alpha == saved["decode"]["alpha"]
    capsys.readouterr()


def test_choose_alpha_false_keeps_the_recipes_length_penalty(corpus, tok, tmp_path, caplog):
    """A published recipe's own search (fairseq's lenpen 1: "power", alpha 1.0) stays the
    averaged model's with train.choose_alpha = false; turning it back on is no new experiment
    (the run resumes), and its sweep keeps the recipe's form."""
    from aiayn.translate.translator import saved_decode_config

    out = tmp_path / "run"
    over = {"train.lr_schedule": "noam", "train.max_steps": 30, "train.save_every": 10,
            "train.keep_last": 2, "train.average_last": 2, "train.valid_every": 1000,
            "train.choose_alpha": False, "decode.beam_size": 2, "decode.alpha": 1.0,
            "decode.length_penalty": "power"}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="aiayn"):
        train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    assert "alpha not chosen (train.choose_alpha = false)" in caplog.text
    saved = json.loads((out / "averaged" / "run_config.json").read_text())
    assert "alpha_choice" not in saved
    kept = saved_decode_config(out / "averaged")
    assert (kept.alpha, kept.length_penalty) == (1.0, "power")
    over |= {"train.max_steps": 40, "train.choose_alpha": True}
    result = train(tiny(corpus, out, **over), tokenizer=tok, progress=False)
    assert result.step == 40  # resumed, not refused
    chosen = saved_decode_config(out / "averaged")
    assert chosen.length_penalty == "power" and "alpha_choice" in json.loads(
        (out / "averaged" / "run_config.json").read_text()
    )


@pytest.mark.parametrize(
    "over, message",
    [
        ({"train.average_last": 5, "train.keep_last": 3}, "exceeds train.keep_last=3"),
        ({"train.spm_model_type": "word", "train.subword_alpha": 0.1}, "keeps the text's own"),
        ({"train.average_last": 1}, "average at least 2"),
        ({"train.budget_decay": 0}, r"budget_decay=0.0 must be in \(0, 1\]"),
    ],
)
def test_bad_averaging_recipes_are_one_line_config_errors(corpus, tmp_path, over, message):
    from aiayn.errors import ConfigError

    over = {"train.lr_schedule": "cosine_budget", **over}
    with pytest.raises(ConfigError, match=message) as e:
        train(tiny(corpus, tmp_path / "run", **over), progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()  # refused before anything was written


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


@pytest.mark.parametrize(
    "field, value",
    [("lr", math.inf), ("lr", -1.0), ("lr", math.nan), ("max_minutes", -1.0),  # ran forever
     ("max_minutes", math.nan), ("label_smoothing", 1.0), ("adam_betas", (0.9, 1.0)),
     ("adam_eps", math.inf), ("clip_norm", -1.0), ("weight_decay", math.nan),
     ("warmup_steps", -1), ("max_steps", 0), ("valid_every", -1), ("keep_last", -1),
     ("log_every", 0), ("threads", -2)],
)  # fmt: skip
def test_out_of_range_training_values_are_one_line_config_errors(field, value):
    """Each trained on before: lr=inf to a NaN loss, max_minutes=-1 without end, NaN minutes
    to a traceback. Refused before anything is written (check_recipe runs first)."""
    from aiayn.errors import ConfigError
    from aiayn.training.checks import check_recipe

    with pytest.raises(ConfigError, match=f"train.*{field}") as e:
        check_recipe(dataclasses.replace(TrainConfig(), **{field: value}))
    assert "\n" not in str(e.value)


def test_a_batch_whose_logits_cannot_fit_is_refused_but_a_small_corpus_is_not():
    """The logits of the largest batch (target positions x vocabulary) and their gradient are
    a lower bound of a step's memory. The plan's real batches are sized, not max_tokens: a
    corpus smaller than max_tokens makes one small batch, and trains."""
    from aiayn.errors import ConfigError
    from aiayn.runtime.device import choose_precision, total_memory
    from aiayn.text.batches import Example
    from aiayn.training.checks import check_batch_fits

    cpu = torch.device("cpu")
    fp32 = choose_precision("fp32", cpu)
    have = total_memory(cpu)
    assert have is not None
    pairs = [Example(tuple(range(4, 24)), tuple(range(2, 23))) for _ in range(100)]  # 20 each
    vocab = have // (100 * 20 * 8) + 1  # all 100 in one batch: fp32 logits x 2 pass `have`
    small = ModelConfig(vocab_size=1000, d_model=4, n_heads=1, n_layers=1, d_ff=4)
    check_batch_fits(small, pairs, TrainConfig(max_tokens=10**12), fp32)  # 16 MB of logits
    wide = dataclasses.replace(small, vocab_size=vocab)
    refused = r"max_tokens=1,000,000,000,000 makes batches of up to 2,000 target positions"
    with pytest.raises(ConfigError, match=refused + ".*lower train.max_tokens") as e:
        check_batch_fits(wide, pairs, TrainConfig(max_tokens=10**12), fp32)
    assert "\n" not in str(e.value)
    check_batch_fits(wide, pairs, TrainConfig(max_tokens=200), fp32)  # batches of 10: a tenth


def test_noam_needs_a_warmup_and_threads_are_checked_before_they_are_set():
    from aiayn.errors import ConfigError
    from aiayn.training.checks import check_recipe

    with pytest.raises(ConfigError, match="warmup_steps=0"):  # noam divides by it
        check_recipe(TrainConfig(lr_schedule="noam", warmup_steps=0))
    check_recipe(TrainConfig(lr_schedule="cosine", warmup_steps=0))
    with pytest.raises(ConfigError, match="train.threads=99999: give 0"):  # was a traceback
        train(Config(ModelConfig.preset("cpu_tiny", vocab_size=8), TrainConfig(threads=99999)))


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_is_a_valid_recipe(path):
    from aiayn.training.checks import check_recipe

    check_recipe(load_config(path).train)


def test_own_data_config_is_a_valid_budget_recipe():
    from aiayn.training.checks import check_recipe

    cfg = load_config(CONFIGS / "own_data.toml")
    tc = cfg.train
    assert tc.lr_schedule == "cosine_budget" and tc.max_minutes == 60 and tc.average_last == 5
    assert tc.bleu_samples > 0 and tc.label_smoothing == 0.1 and tc.dtype == tc.device == "auto"
    check_recipe(tc)
    # the measured recipe (docs/benchmarks.md, "The ablation repeated"): swish, Xavier init
    assert cfg.model.activation == "swish" and cfg.model.init == "xavier"
    assert tc.budget_decay == 0.25  # warmup-stable-decay ("A held-out corpus")
