"""On a CUDA GPU: the same oracles as on the CPU (nn.Transformer parity, cache == no cache,
CPU == GPU, exact resume, identical translations, served == in-process) and a torchrun NCCL run.

Every test here is marked `cuda` and skips, saying why, where there is no GPU (conftest.py).
Parity is checked in strict fp32: TF32 off, since TF32 matmuls keep 10 mantissa bits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from copy_task import CONFIGS, tiny, write_copy_corpus
from nn.test_model import copy_layer, layer_cfg, random_batch
from torch import nn

from aiayn.cli.main import main
from aiayn.nn.model import Transformer
from aiayn.store.checkpoints import list_checkpoints
from aiayn.store.model_dir import load_tensors
from aiayn.training.loop import train

pytestmark = pytest.mark.cuda
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def _strict_fp32():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.mha.set_fastpath_enabled(False)  # the oracle is nn's documented math path
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
    torch.backends.mha.set_fastpath_enabled(True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_copy_corpus(tmp_path_factory.mktemp("copy"))


@pytest.mark.parametrize("norm_first", [False, True])
def test_stack_matches_nn_transformer_on_cuda(norm_first):
    torch.manual_seed(5)
    ref = nn.Transformer(16, 4, 2, 2, 24, dropout=0.0, batch_first=True, norm_first=norm_first)
    if not norm_first:  # the paper's post-LN has no final norms
        ref.encoder.norm = ref.decoder.norm = None
    ours = Transformer(layer_cfg(norm_first))
    for r, o in zip([*ref.encoder.layers, *ref.decoder.layers],
                    [*ours.encoder.layers, *ours.decoder.layers], strict=True):  # fmt: skip
        copy_layer(r, o)
    if norm_first:
        ours.encoder.norm.load_state_dict(ref.encoder.norm.state_dict())
        ours.decoder.norm.load_state_dict(ref.decoder.norm.state_dict())
    ref, ours = ref.cuda().eval(), ours.cuda().eval()
    x, y = torch.randn(2, 7, 16, device="cuda"), torch.randn(2, 5, 16, device="cuda")
    keep_BS = torch.ones(2, 7, dtype=torch.bool, device="cuda")
    keep_BS[0, 5:] = False
    expected = ref(x, y, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5, device="cuda"),
                   src_key_padding_mask=~keep_BS, memory_key_padding_mask=~keep_BS,
                   tgt_is_causal=True)  # fmt: skip
    mem = ours.encoder(x, keep_BS[:, None, None, :])
    got = ours.decoder(y, mem, keep_BS[:, None, None, :])
    torch.testing.assert_close(got, expected, **TOL)


def test_cpu_and_gpu_give_the_same_logits_and_the_cache_changes_nothing(tiny_cfg):
    torch.manual_seed(10)
    cpu = Transformer(tiny_cfg).eval()
    gpu = Transformer(tiny_cfg).cuda().eval()
    gpu.load_state_dict(cpu.state_dict())
    src, tgt = random_batch(tiny_cfg)
    tgt[1] = 5  # no PAD in the fed prefix
    with torch.no_grad():
        full = gpu(src.cuda(), tgt.cuda())
        torch.testing.assert_close(full.cpu(), cpu(src, tgt), **TOL)
        memory = gpu.encode(src.cuda())
        cache = gpu.init_cache(memory, capacity=tgt.size(1))
        steps = []
        for t in range(tgt.size(1)):
            logits, cache = gpu.decode_step(tgt[:, t : t + 1].cuda(), memory, cache)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, **TOL)


def continuous_equals_alone(device: str) -> None:
    """Sentences joining a running search (greedy rows in slots, beam rows joined), admitted in
    parts, end with what their search alone gives, on `device`."""
    from search.models import VOCAB, feed_arrivals
    from search.models import random_batch as sentences

    from aiayn.config import EOS_ID, DecodeConfig, ModelConfig
    from aiayn.search.beam import BeamSearch
    from aiayn.search.decode import search
    from aiayn.search.row_search import RowSearch

    torch.manual_seed(0)
    cfg = ModelConfig.preset(
        "cpu_tiny", vocab_size=VOCAB, d_model=32, d_ff=64, max_len=64, logits_bias=True
    )
    model = Transformer(cfg).to(device).eval()
    with torch.no_grad():  # some rows end at EOS at once, others run to their limit
        model.generator.bias.zero_()
        model.generator.bias[EOS_ID] = 1.7
    src = sentences([3, 9, 5, 7, 4, 8, 6, 2], seed=4).to(device)
    joins = [0, 0, 1, 1, 3, 3, 5, 6]
    for beam in (1, 3):
        dcfg = DecodeConfig(beam_size=beam, nbest=beam, max_len_a=1.0, max_len_b=4)
        alone = [search(model, src[i : i + 1], dcfg)[0] for i in range(len(joins))]
        run = RowSearch(model, dcfg) if beam == 1 else BeamSearch(model, dcfg)
        got, _ = feed_arrivals(run, src, joins, (2, 2), slack=2)  # the 3rd admitted, dropped
        assert len(got) >= len(joins) - 1
        for i, want in enumerate(alone):
            if i in got:
                hyps = got[i] if beam > 1 else [got[i]]
                assert [h.tokens for h in hyps] == [h.tokens for h in want]
                for h, w in zip(hyps, want, strict=True):
                    assert h.log_prob == pytest.approx(w.log_prob, abs=1e-4)


def test_rows_joining_a_running_search_on_the_gpu_get_what_they_get_alone():
    continuous_equals_alone("cuda")


def test_training_steps_queue_without_waiting_for_the_gpu(tiny_cfg):
    """A step and the loop's per-step stop check never make the host wait for the GPU (batch
    copies through pinned memory, loss totals kept on the device, the stop check on host
    values), so the host queues the next step while the GPU runs this one. One warm-up step
    first: the optimizer's state is created lazily."""
    from aiayn.config import TrainConfig
    from aiayn.runtime.device import Precision
    from aiayn.runtime.distributed import Dist, all_sum
    from aiayn.text.batches import Batch
    from aiayn.training.loss import train_step

    torch.manual_seed(3)
    gpu = torch.device("cuda")
    net = Transformer(tiny_cfg).to(gpu).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    d, tc = Dist(device=gpu), TrainConfig(clip_norm=1.0, label_smoothing=0.1)
    precision = Precision(gpu, "bf16", False, "test")
    src, tgt = random_batch(tiny_cfg)
    host = Batch(src, tgt, tgt, int((tgt != tiny_cfg.pad_id).sum()))
    window = torch.zeros(2, device=gpu)

    def step() -> None:
        nonlocal window
        totals = train_step(net, opt, [host.to(gpu)], tokens=host.n_tgt_tokens, lr=1e-3,
                            pad_id=tiny_cfg.pad_id, tc=tc, d=d, precision=precision)  # fmt: skip
        window = window + totals
        assert all_sum([0.0, 0.0], d) == [0.0, 0.0]  # Run.should_stop's check

    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(window).all()


def test_resume_on_the_gpu_is_bit_identical(corpus, tmp_path):
    """30 steps straight == 15, stop, resume, 15 more, on the GPU with dropout on: the CUDA
    generator is saved and restored, and deterministic kernels make the two runs comparable."""
    over = {"train.valid_every": 10, "train.save_every": 7, "train.log_every": 5,
            "train.device": "cuda", "train.deterministic": "true"}  # fmt: skip
    straight = train(tiny(corpus, tmp_path / "a", **over, **{"train.max_steps": 30}),
                     progress=False)  # fmt: skip
    train(tiny(corpus, tmp_path / "b", **over, **{"train.max_steps": 15}), progress=False)
    second = train(tiny(corpus, tmp_path / "b", **over, **{"train.max_steps": 30}),
                   progress=False)  # fmt: skip
    assert straight.train_loss == second.train_loss
    a = load_tensors(list_checkpoints(tmp_path / "a")[-1] / "model.safetensors")
    b = load_tensors(list_checkpoints(tmp_path / "b")[-1] / "model.safetensors")
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert "rng.cuda" in load_tensors(list_checkpoints(tmp_path / "b")[-1]
                                      / "optimizer.safetensors")  # fmt: skip


def test_a_run_saved_on_the_gpu_resumes_on_the_cpu(corpus, tmp_path):
    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 4, "train.device": "cuda"}), progress=False)
    result = train(tiny(corpus, out, **{"train.max_steps": 8, "train.device": "cpu"}),
                   progress=False)  # fmt: skip
    assert result.step == 8


def test_translate_on_the_gpu_prints_the_cpu_lines(corpus, tmp_path):
    """A trained model, greedy and beam 4, in strict fp32: identical lines on both devices."""
    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 200, "train.device": "cuda"}), progress=False)
    src = Path(corpus["train.valid_src"])
    for beam in ("1", "4"):
        lines = {}
        for device in ("cpu", "cuda"):
            hyp = tmp_path / f"{device}{beam}.txt"
            assert (
                main(
                    [
                        "translate",
                        "--model",
                        str(out),
                        "--input",
                        str(src),
                        "--output",
                        str(hyp),
                        "--device",
                        device,
                        "--dtype",
                        "fp32",
                        "--beam",
                        beam,
                    ]
                )
                == 0
            )
            lines[device] = hyp.read_text().splitlines()
        assert lines["cuda"] == lines["cpu"]


def test_served_on_the_gpu_equals_translate_on_the_gpu(corpus, tmp_path):
    """`aiayn serve --device cuda`, strict fp32: concurrent greedy and beam requests (rows
    joining running searches from the model worker's thread) get what the same model's
    in-process search gives each request alone on the GPU, tokens exactly, scores to 1e-4."""
    from concurrent.futures import ThreadPoolExecutor

    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install .[serve])")
    import httpx
    from serving import ServerProcess

    from aiayn.translate.translator import Translator

    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 200, "train.device": "cuda"}), progress=False)
    lines = Path(corpus["train.valid_src"]).read_text().splitlines()[:12]
    requests = [(lines[i % 8 : i % 8 + 1 + i % 4], 1 if i % 3 else 4) for i in range(24)]
    server = ServerProcess(out, "--device", "cuda", "--dtype", "fp32")
    try:
        with httpx.Client(base_url=server.url, timeout=120) as c:

            def send(request):
                q, beam = request
                return c.post("/v1/translate", json={"q": q, "beam": beam}).json()

            with ThreadPoolExecutor(12) as pool:
                answers = list(pool.map(send, requests))
    finally:
        status = server.stop()[0]
    assert status == 0  # SIGTERM: a clean exit
    translator = Translator.load(out, device="cuda", dtype="fp32")
    for (q, beam), answer in zip(requests, answers, strict=True):
        want = translator.translate_hyps(q, translator.settings(beam=beam))
        got = answer["translations"]
        assert [t["text"] for t in got] == [w[0].text for w in want], (q, beam)
        for served, expected in zip(got, want, strict=True):
            assert [h["tokens"] for h in served["hypotheses"]] == [t.hyp.tokens for t in expected]
            for h, t in zip(served["hypotheses"], expected, strict=True):
                assert h["log_prob"] == pytest.approx(t.hyp.log_prob, abs=1e-4)


def test_explain_and_attend_run_on_the_gpu(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    train(tiny(corpus, out, **{"train.max_steps": 50, "train.device": "cuda"}), progress=False)
    traces = {}
    for device in ("cpu", "cuda"):
        assert main(["explain", "--model", str(out), "a b c", "--format", "json", "--beam", "2",
                     "--device", device]) == 0  # fmt: skip
        traces[device] = json.loads(capsys.readouterr().out)
    # The same search on both devices: the same tokens, and scores equal to float32 rounding
    # (the GPU sums in another order, TF32 off or not), not bit for bit.
    cpu, gpu = traces["cpu"]["translation"], traces["cuda"]["translation"]
    assert {k: v for k, v in gpu.items() if not isinstance(v, float)} == {
        k: v for k, v in cpu.items() if not isinstance(v, float)
    }
    for key, value in cpu.items():
        if isinstance(value, float):
            assert gpu[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert main(["attend", "--model", str(out), "a b c", "--out", str(tmp_path / "pics"),
                 "--device", "cuda"]) == 0  # fmt: skip
    assert (tmp_path / "pics" / "attention.html").is_file()


def test_torchrun_on_nccl(corpus, tmp_path):
    """One rank per GPU (at most 2), NCCL: the run trains, and rank 0 records the device."""
    ranks = min(2, torch.cuda.device_count())
    sets = {**corpus, "train.max_steps": 6, "train.log_every": 1,
            "train.out_dir": str(tmp_path / "run")}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={ranks}", "-m", "aiayn", "train", "--config",
           str(CONFIGS / "tiny_copy.toml"), "--no-progress", "--device", "cuda",
           *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]  # fmt: skip
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runtime = json.loads((tmp_path / "run" / "run_config.json").read_text())["runtime"]
    assert runtime["device"] == "cuda:0" and runtime["world_size"] == ranks
    losses = [r["loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl")
                                     .read_text().splitlines()) if "loss" in r]  # fmt: skip
    assert len(losses) == 6 and losses[-1] < losses[0]
