"""checkpoint.py, training-state part: optimizer state in safetensors, atomic checkpoint
directories, pruning, corrupt-state errors, and checkpoint averaging (plus `aiayn average`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from aiayn.cli.main import main
from aiayn.errors import CheckpointError, ConfigError
from aiayn.nn.model import Transformer
from aiayn.store.checkpoints import (
    list_checkpoints,
    load_checkpoint_state,
    load_optimizer_tensors,
    optimizer_tensors,
    prune_checkpoints,
    save_checkpoint,
    write_average,
)
from aiayn.store.model_dir import load_model_dir, load_tensors, save_model_dir, save_tensors


def _step(model: Transformer, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, model.cfg.vocab_size, (3, 7), generator=g)
    tgt = torch.randint(4, model.cfg.vocab_size, (3, 5), generator=g)
    opt.zero_grad()
    model(src, tgt).square().mean().backward()
    opt.step()


def _model_and_opt(cfg, seed: int = 0):
    torch.manual_seed(seed)
    model = Transformer(cfg)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)


def test_optimizer_state_round_trips_exactly(tiny_cfg, tmp_path):
    model, opt = _model_and_opt(tiny_cfg)
    for s in range(3):
        _step(model, opt, s)
    tensors, meta = optimizer_tensors(opt)
    save_tensors(tmp_path / "optim.safetensors", tensors)  # through the file, as on resume
    tensors = load_tensors(tmp_path / "optim.safetensors")
    twin, twin_opt = _model_and_opt(tiny_cfg, seed=1)
    twin.load_state_dict(model.state_dict())
    load_optimizer_tensors(twin_opt, tensors, meta, "test")
    _step(model, opt, 9)
    _step(twin, twin_opt, 9)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_optimizer_state_for_another_model_is_refused(tiny_cfg):
    model, opt = _model_and_opt(tiny_cfg)
    _step(model, opt, 0)
    tensors, meta = optimizer_tensors(opt)
    other_cfg = dataclasses.replace(tiny_cfg, n_layers=1)
    _, other_opt = _model_and_opt(other_cfg)
    with pytest.raises(CheckpointError, match="does not fit"):
        load_optimizer_tensors(other_opt, tensors, meta, "ckpt")


def test_checkpoints_are_whole_listed_in_order_and_pruned(tiny_cfg, tmp_path):
    model, opt = _model_and_opt(tiny_cfg)
    _step(model, opt, 0)
    state = {"step": 0, "epoch": 0, "batch_in_epoch": 0}
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, model, opt, {**state, "step": step}, {"torch": torch.zeros(3)})
    (tmp_path / "checkpoints" / ".tmp_step_00000025").mkdir()  # a save killed half way
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step_00000005",
        "step_00000010",
        "step_00000015",
        "step_00000020",
    ]
    prune_checkpoints(tmp_path, 2)
    save_checkpoint(tmp_path, model, opt, {**state, "step": 20}, {"torch": torch.zeros(3)})
    assert not (tmp_path / "checkpoints" / ".tmp_step_00000025").exists()  # cleared by a save
    kept = list_checkpoints(tmp_path)
    assert [p.name for p in kept] == ["step_00000015", "step_00000020"]
    tensors, saved = load_checkpoint_state(kept[-1])
    assert saved["step"] == 20 and torch.equal(tensors["rng.torch"], torch.zeros(3))
    assert isinstance(load_model_dir(kept[-1]), Transformer)  # each is a model directory


def test_corrupt_or_foreign_state_is_a_clear_error(tiny_cfg, tmp_path):
    model, opt = _model_and_opt(tiny_cfg)
    ckpt = save_checkpoint(tmp_path, model, opt, {"step": 1, "epoch": 0, "batch_in_epoch": 0}, {})
    (ckpt / "train_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint_state(ckpt)
    (ckpt / "train_state.json").write_text('{"format": "something-else"}')
    with pytest.raises(CheckpointError, match="not an aiayn training state"):
        load_checkpoint_state(ckpt)
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        load_checkpoint_state(tmp_path)


def test_average_is_the_elementwise_mean(tiny_cfg, tmp_path):
    dirs = []
    for seed in range(3):
        model, _ = _model_and_opt(tiny_cfg, seed)
        save_model_dir(model, tmp_path / f"m{seed}")
        dirs.append(tmp_path / f"m{seed}")
    (tmp_path / "m0" / "tokenizer.model").write_bytes(b"spm")  # copied along, not parsed
    write_average(dirs, tmp_path / "avg")
    got = load_tensors(tmp_path / "avg" / "model.safetensors")
    parts = [load_tensors(d / "model.safetensors") for d in dirs]
    for name, t in got.items():
        torch.testing.assert_close(t, sum(p[name] for p in parts) / 3, rtol=1e-6, atol=1e-7)
    assert (tmp_path / "avg" / "tokenizer.model").read_bytes() == b"spm"
    load_model_dir(tmp_path / "avg")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        write_average(dirs, tmp_path / "avg")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")  # not a model, but not ours either
    with pytest.raises(ConfigError, match="exists and is not empty"):
        write_average(dirs, tmp_path / "taken")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]


def test_average_is_written_whole_or_not_at_all(tiny_cfg, tmp_path, monkeypatch):
    import aiayn.store.checkpoints as ckpt

    dirs = []
    for seed in range(2):
        model, _ = _model_and_opt(tiny_cfg, seed)
        save_model_dir(model, tmp_path / f"m{seed}")
        dirs.append(tmp_path / f"m{seed}")

    def crash(*_a, **_k):
        raise KeyboardInterrupt  # e.g. Ctrl-C while the copies are written

    monkeypatch.setattr(ckpt, "atomic_write_bytes", crash)
    (tmp_path / "m0" / "tokenizer.model").write_bytes(b"spm")
    with pytest.raises(KeyboardInterrupt):
        write_average(dirs, tmp_path / "avg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m0", "m1"]  # no avg, no temp dir


def test_average_refuses_mixed_configs(tiny_cfg, tmp_path):
    a, _ = _model_and_opt(tiny_cfg)
    b, _ = _model_and_opt(dataclasses.replace(tiny_cfg, d_ff=48))
    save_model_dir(a, tmp_path / "a")
    save_model_dir(b, tmp_path / "b")
    with pytest.raises(CheckpointError, match="different model config"):
        write_average([tmp_path / "a", tmp_path / "b"], tmp_path / "avg")


def test_average_refuses_other_runs_tokenizers_and_says_a_repeated_input(
    tiny_cfg, tmp_path, caplog
):
    """Two runs' models of one config but different vocabularies averaged without a word (the
    config holds only the vocabulary's size); a directory given twice counts twice, said."""
    for name, spm in (("a", b"spm one"), ("b", b"spm two"), ("c", b"spm one")):
        model, _ = _model_and_opt(tiny_cfg)
        save_model_dir(model, tmp_path / name)
        (tmp_path / name / "tokenizer.model").write_bytes(spm)
    a, b, c = (tmp_path / n for n in "abc")
    with pytest.raises(CheckpointError, match="has another tokenizer than .*different runs"):
        write_average([a, b], tmp_path / "ab")
    assert not (tmp_path / "ab").exists()
    with caplog.at_level("WARNING"):
        write_average([a, c, a], tmp_path / "aca")
    assert caplog.text.count("is given more than once") == 1


def test_cli_average_last_k_of_a_run(tiny_cfg, tmp_path, capsys):
    model, opt = _model_and_opt(tiny_cfg)
    for step in (1, 2, 3):
        _step(model, opt, step)
        save_checkpoint(
            tmp_path / "run", model, opt, {"step": step, "epoch": 0, "batch_in_epoch": 0}, {}
        )
    assert (
        main(
            [
                "average",
                "--run",
                str(tmp_path / "run"),
                "--last",
                "2",
                "--out",
                str(tmp_path / "avg"),
            ]
        )
        == 0
    )
    assert "step_00000002, step_00000003" in capsys.readouterr().out
    assert (
        main(
            [
                "average",
                "--run",
                str(tmp_path / "run"),
                "--last",
                "9",
                "--out",
                str(tmp_path / "avg2"),
            ]
        )
        == 2
    )
    assert "has 3 checkpoints" in capsys.readouterr().err
    for last in ("0", "-2"):  # not "every checkpoint" nor a slice from the wrong end
        assert main(["average", "--run", str(tmp_path / "run"), "--last", last,
                     "--out", str(tmp_path / "avg3")]) == 2  # fmt: skip
        assert "--last must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "avg3").exists()
    # a missing run, or its checkpoints/ given for it, was "has 0 checkpoints"
    cases = [(tmp_path / "nope", "run directory not found"),
             (tmp_path / "run" / "checkpoints", "give the run directory it is in")]  # fmt: skip
    for run, said in cases:
        assert main(["average", "--run", str(run), "--out", str(tmp_path / "avg4")]) == 2
        assert said in capsys.readouterr().err
