"""aiayn.runtime.device: which device and precision a run gets, and the CPU side of GPU training
(the reduce's tensor device, saved RNG states, bad --device / dtype input on every command)."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from paths import CONFIGS

from aiayn.cli.main import main
from aiayn.config_files import load_config
from aiayn.errors import ConfigError
from aiayn.runtime.device import (
    DeviceError,
    choose_precision,
    cpu_native_bf16,
    native_bf16,
    resolve_device,
    set_threads,
    usable_cpus,
)
from aiayn.runtime.distributed import Dist, all_sum, reduce_tensor
from aiayn.training.loop import train

CPU = torch.device("cpu")
NO_GPU = not torch.cuda.is_available()


# --- resolve_device -------------------------------------------------------------------------------


def test_cpu_and_auto_resolve():
    assert resolve_device("cpu") == CPU
    assert resolve_device(" CPU ") == CPU
    expected = (
        "cuda"
        if torch.cuda.is_available()
        else "mps"
        if torch.backends.mps.is_available()
        else "cpu"
    )
    assert resolve_device("auto").type == expected


@pytest.mark.parametrize("spec", ["tpu", "gpu", "cuda:x", "cpu:1", "mps:0", ""])
def test_names_that_are_not_devices_are_one_line_errors(spec):
    with pytest.raises(DeviceError, match="device") as e:
        resolve_device(spec)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:7"])
def test_cuda_without_a_gpu_is_an_error(spec):
    with pytest.raises(DeviceError, match="no CUDA GPU is available"):
        resolve_device(spec)


@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU")
def test_a_gpu_index_past_the_last_is_an_error():
    n = torch.cuda.device_count()
    with pytest.raises(DeviceError, match=f"has {n} CUDA device"):
        resolve_device(f"cuda:{n}")


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_mps_without_mps_is_an_error():
    with pytest.raises(DeviceError, match="no Apple MPS"):
        resolve_device("mps")


# --- choose_precision -----------------------------------------------------------------------------


def test_auto_picks_bf16_exactly_where_this_cpu_has_it_natively():
    p = choose_precision("auto", CPU)
    assert p.dtype == ("bf16" if cpu_native_bf16() else "fp32") and not p.tf32
    assert p.why.startswith("auto: ") and torch.backends.cpu.get_cpu_capability() in p.why
    assert native_bf16(CPU)[0] == cpu_native_bf16()


def test_decoding_on_a_cpu_stays_fp32_and_explicit_choices_are_honoured():
    assert choose_precision("auto", CPU, decoding=True).dtype == "fp32"
    strict = choose_precision("fp32", CPU)
    assert strict.dtype == "fp32" and not strict.tf32
    assert choose_precision("bf16", CPU).dtype == "bf16"
    with choose_precision("bf16", CPU).autocast():
        assert torch.is_autocast_enabled("cpu")
    with choose_precision("fp32", CPU).autocast():
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.skipif(cpu_native_bf16(), reason="this CPU has native bf16: no warning is due")
def test_bf16_on_a_cpu_without_native_bf16_warns_in_one_line(caplog):
    with caplog.at_level(logging.WARNING, logger="aiayn.runtime.device"):
        choose_precision("bf16", CPU, "train.dtype")
    (record,) = caplog.records
    assert "much slower" in record.getMessage() and "\n" not in record.getMessage()


def test_more_threads_than_usable_cpus_are_said_in_one_line(caplog):
    threads = torch.get_num_threads()
    try:
        with caplog.at_level(logging.WARNING, logger="aiayn.runtime.device"):
            set_threads(usable_cpus(), "train.threads")
            assert not caplog.records
            set_threads(usable_cpus() + 1, "train.threads")
    finally:
        torch.set_num_threads(threads)
    (record,) = caplog.records
    message = record.getMessage()
    assert f"train.threads={usable_cpus() + 1}" in message and "\n" not in message


@pytest.mark.parametrize("bad", ["fp16", "float32", "int8"])
def test_unknown_dtypes_are_config_errors(bad):
    with pytest.raises(ConfigError, match="choose one of"):
        choose_precision(bad, CPU)


# --- the reduce and the RNG states, CPU side ------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reduce_tensors_live_on_the_ranks_device_under_a_real_gloo_group():
    """NCCL reduces only GPU tensors; gloo, CPU ones: the reduce follows Dist.device."""
    values = torch.tensor([1.5, 2.0, 3.0])
    assert reduce_tensor(values, Dist(device=CPU)).device == CPU
    assert reduce_tensor([1.0], Dist(device=CPU)).dtype == torch.float64
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)  # fmt: skip
    try:
        assert all_sum(values, Dist(device=CPU)) == [1.5, 2.0, 3.0]
    finally:
        dist.destroy_process_group()


def test_one_process_sums_host_values_without_the_device():
    """The training loop's per-step stop check must not wait for a GPU: on one process,
    host values are summed without a copy to the rank's device. A meta device, which holds no
    data, stands in for a GPU: any round trip through it would raise."""
    meta = Dist(device=torch.device("meta"))
    assert all_sum([1.0, 0.0, 2.5], meta) == [1.0, 0.0, 2.5]
    with pytest.raises((NotImplementedError, RuntimeError)):
        reduce_tensor([1.0], meta).tolist()  # what all_sum did on one process before


def _copy_corpus(tmp_path: Path) -> list[str]:
    lines = "\n".join(f"{a} {b}" for a in "abcdef" for b in "ghijkl") + "\n"
    for name in ("src", "tgt"):
        (tmp_path / name).write_text(lines)
    return [f"train.src={tmp_path / 'src'}", f"train.tgt={tmp_path / 'tgt'}"]


def test_checkpoints_hold_the_rng_states_of_the_device_trained_on(tmp_path):
    from aiayn.store.checkpoints import list_checkpoints
    from aiayn.store.model_dir import load_tensors

    cfg = load_config(CONFIGS / "tiny_copy.toml", [
        *_copy_corpus(tmp_path), f"train.out_dir={tmp_path / 'run'}", "train.max_steps=2",
        "train.device=cpu", "train.vocab_size=280",
    ])  # fmt: skip
    train(cfg, progress=False)
    (ckpt,) = list_checkpoints(tmp_path / "run")
    rng = {k for k in load_tensors(ckpt / "optimizer.safetensors") if k.startswith("rng.")}
    assert rng == {"rng.torch"}  # a CPU run: no CUDA generator to save
    runtime = json.loads((tmp_path / "run" / "run_config.json").read_text())["runtime"]
    assert runtime["device"] == "cpu"


def test_a_run_saved_with_a_gpu_generator_resumes_on_the_cpu(tmp_path, caplog):
    """Saved on a GPU, resumed on a CPU: same weights and data position, a note in the log."""
    from aiayn.store.checkpoints import list_checkpoints
    from aiayn.store.model_dir import load_tensors, save_tensors

    sets = [*_copy_corpus(tmp_path), f"train.out_dir={tmp_path / 'run'}", "train.device=cpu",
            "train.vocab_size=280"]  # fmt: skip
    train(load_config(CONFIGS / "tiny_copy.toml", [*sets, "train.max_steps=2"]), progress=False)
    (ckpt,) = list_checkpoints(tmp_path / "run")
    tensors = load_tensors(ckpt / "optimizer.safetensors")  # add what a GPU run also saves
    tensors["rng.cuda"] = torch.zeros(16, dtype=torch.uint8)
    save_tensors(ckpt / "optimizer.safetensors", tensors)
    with caplog.at_level(logging.INFO, logger="aiayn.store.run_dir"):
        result = train(load_config(CONFIGS / "tiny_copy.toml", [*sets, "train.max_steps=4"]),
                       progress=False)  # fmt: skip
    assert result.step == 4
    assert any("exact resume needs the same kind of device" in r.getMessage()
               for r in caplog.records)  # fmt: skip


# --- bad --device / dtype: one line, exit 2, nothing created --------------------------------------


def _one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:7", "tpu"])
def test_train_with_a_device_that_is_not_here_creates_nothing(tmp_path, capsys, device):
    out = tmp_path / "run"
    sets = [a for s in _copy_corpus(tmp_path) for a in ("--set", s)]
    code = main(
        [
            "train",
            "--config",
            str(CONFIGS / "tiny_copy.toml"),
            *sets,
            "--set",
            f"train.out_dir={out}",
            "--device",
            device,
            "--no-progress",
        ]
    )
    assert "device" in _one_line_error(capsys, code) and not out.exists()


@pytest.mark.parametrize("dtype", ["fp16", "float64"])
def test_train_with_a_dtype_it_cannot_use_creates_nothing(tmp_path, capsys, dtype):
    out = tmp_path / "run"
    sets = [a for s in _copy_corpus(tmp_path) for a in ("--set", s)]
    code = main(
        [
            "train",
            "--config",
            str(CONFIGS / "tiny_copy.toml"),
            *sets,
            "--set",
            f"train.out_dir={out}",
            "--set",
            f"train.dtype={dtype}",
        ]
    )
    assert "train.dtype" in _one_line_error(capsys, code) and not out.exists()


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("command", ["translate", "evaluate", "explain", "attend", "quickstart"])
def test_every_command_refuses_a_missing_gpu_in_one_line(tmp_path, capsys, command):
    model = tmp_path / "model"  # never read: the device is checked first
    (tmp_path / "s.txt").write_text("a b\n")
    args = {
        "translate": ["--model", str(model), "--input", str(tmp_path / "s.txt")],
        "evaluate": ["--model", str(model), "--src", str(tmp_path / "s.txt"),
                     "--ref", str(tmp_path / "s.txt")],
        "explain": ["--model", str(model), "a b"],
        "attend": ["--model", str(model), "a b", "--out", str(tmp_path / "pics")],
        "quickstart": ["--out", str(tmp_path / "qs")],
    }[command]  # fmt: skip
    code = main([command, *args, "--device", "cuda"])
    assert "no CUDA GPU" in _one_line_error(capsys, code)
    assert not (tmp_path / "qs").exists() and not (tmp_path / "pics").exists()


def test_translate_on_the_cpu_with_an_explicit_dtype(tmp_path, capsys):
    """--device cpu --dtype fp32 and --dtype auto translate the same (auto is fp32 on a CPU)."""
    from aiayn.config import ModelConfig
    from aiayn.nn.model import Transformer
    from aiayn.store.model_dir import save_model_dir
    from aiayn.text.tokenizer import Tokenizer

    lines = [f"{a} {b} {a}" for a in "abcdef" for b in "ghijkl"]
    tok = Tokenizer.train(lines, vocab_size=280)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32)
    save_model_dir(Transformer(cfg), tmp_path / "m")
    tok.save(tmp_path / "m")
    (tmp_path / "in.txt").write_text("\n".join(lines[:5]) + "\n")
    outs = []
    for dtype in ("fp32", "auto"):
        out = tmp_path / f"{dtype}.txt"
        assert main(["translate", "--model", str(tmp_path / "m"), "--input",
                     str(tmp_path / "in.txt"), "--output", str(out), "--device", "cpu",
                     "--dtype", dtype, "--beam", "2", "--max-len-a", "0", "--max-len-b",
                     "5"]) == 0  # fmt: skip
        outs.append(out.read_text())
    assert outs[0] == outs[1] and outs[0].count("\n") == 5
