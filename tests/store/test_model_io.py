"""The model directory: save/load round trips, and clear errors for everything that is not one."""

import dataclasses
import json

import pytest
import torch

from aiayn.cli.main import main
from aiayn.errors import CheckpointError
from aiayn.nn.model import Transformer
from aiayn.nn.variants import MODEL_CLASSES, DecoderLM, EncoderClassifier
from aiayn.store.model_dir import CONFIG_FILE, WEIGHTS_FILE, load_model_dir, save_model_dir


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"share_embeddings": False, "tie_output": False},
        {"positional": "learned", "norm_first": True},
    ],
)
def test_save_load_round_trip_is_exact(tmp_path, tiny_cfg, overrides):
    cfg = dataclasses.replace(tiny_cfg, **overrides)
    model = Transformer(cfg).eval()
    save_model_dir(model, tmp_path / "m")
    loaded = load_model_dir(tmp_path / "m")
    assert loaded.cfg == cfg
    for (n1, p1), (n2, p2) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2), n1
    src = torch.randint(4, 50, (2, 5))
    torch.testing.assert_close(loaded(src, src), model(src, src), rtol=0, atol=0)
    if cfg.tie_output:  # tying survives the round trip (stored once, shared again on load)
        assert loaded.generator.weight is loaded.tgt_embed.tokens.weight


def test_variants_round_trip(tmp_path, tiny_cfg):
    save_model_dir(EncoderClassifier(tiny_cfg, n_classes=4), tmp_path / "clf")
    save_model_dir(DecoderLM(tiny_cfg), tmp_path / "lm")
    assert load_model_dir(tmp_path / "clf").n_classes == 4
    assert isinstance(load_model_dir(tmp_path / "lm"), DecoderLM)
    with pytest.raises(CheckpointError, match="holds a DecoderLM, not a Transformer"):
        load_model_dir(tmp_path / "lm", expect=Transformer)


def test_nothing_is_pickled(tmp_path, tiny_cfg):
    save_model_dir(Transformer(tiny_cfg), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    json.loads((tmp_path / CONFIG_FILE).read_text())  # plain JSON


def test_missing_and_foreign_directories(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_model_dir(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="not an aiayn model directory"):
        load_model_dir(tmp_path)
    (tmp_path / CONFIG_FILE).write_text('{"model_type": "marian"}')
    with pytest.raises(CheckpointError, match="not an aiayn model config"):
        load_model_dir(tmp_path)
    (tmp_path / CONFIG_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model_dir(tmp_path)


def test_corrupt_weights(tmp_path, tiny_cfg):
    save_model_dir(Transformer(tiny_cfg), tmp_path)
    data = (tmp_path / WEIGHTS_FILE).read_bytes()
    (tmp_path / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_model_dir(tmp_path)
    (tmp_path / WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match="missing model.safetensors"):
        load_model_dir(tmp_path)


def test_weights_that_do_not_fit_the_config(tmp_path, tiny_cfg):
    save_model_dir(Transformer(tiny_cfg), tmp_path / "a")
    save_model_dir(Transformer(dataclasses.replace(tiny_cfg, d_ff=48)), tmp_path / "b")
    (tmp_path / "a" / WEIGHTS_FILE).write_bytes((tmp_path / "b" / WEIGHTS_FILE).read_bytes())
    with pytest.raises(CheckpointError, match=r"d_ff=32 but .*w_1.weight of shape \(48, 16\)"):
        load_model_dir(tmp_path / "a")
    save_model_dir(Transformer(dataclasses.replace(tiny_cfg, n_layers=3)), tmp_path / "c")
    (tmp_path / "a" / WEIGHTS_FILE).write_bytes((tmp_path / "c" / WEIGHTS_FILE).read_bytes())
    with pytest.raises(CheckpointError, match="n_layers=2 but model.safetensors holds 3 decoder"):
        load_model_dir(tmp_path / "a")
    # Sizes that do not scale an allocation are left to the full check after the build.
    untied = dataclasses.replace(tiny_cfg, share_embeddings=False)
    save_model_dir(Transformer(untied), tmp_path / "d")
    (tmp_path / "a" / WEIGHTS_FILE).write_bytes((tmp_path / "d" / WEIGHTS_FILE).read_bytes())
    with pytest.raises(CheckpointError, match="unexpected"):
        load_model_dir(tmp_path / "a")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("d_model", 1_000_000_000, "d_model=1000000000 but model.safetensors holds 16-wide"),
        ("vocab_size", 10**12, "vocab_size=1000000000000 but model.safetensors holds 50 token"),
        ("d_ff", 10**9, "d_ff=1000000000 but model.safetensors holds"),
        ("n_layers", 10**9, "n_layers=1000000000 but model.safetensors holds 2 decoder layers"),
    ],
)
def test_config_sizes_are_checked_against_the_weights_before_building(
    tmp_path, tiny_cfg, capsys, monkeypatch, field, value, message
):
    """A config.json claiming a huge model is refused from the safetensors header alone."""
    save_model_dir(Transformer(tiny_cfg), tmp_path)
    meta = json.loads((tmp_path / CONFIG_FILE).read_text())
    meta["model"][field] = value
    (tmp_path / CONFIG_FILE).write_text(json.dumps(meta))

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before its sizes were checked")

    monkeypatch.setitem(MODEL_CLASSES, "Transformer", no_build)
    assert main(["info", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("aiayn info: error: ") and "\n" not in err
    assert message in err, err


def test_a_model_past_the_machines_memory_is_refused_before_it_is_built(
    tmp_path, tiny_cfg, capsys, monkeypatch
):
    """No weight's shape bounds a sinusoidal table: a config that agrees with its weights but
    claims max_len=10^9 was a 512 GB allocation's traceback after 15 s; now one line. Weights
    past half the machine's memory (the model and the file's tensors are held at once) are
    refused from the file's size."""
    import aiayn.runtime.device as device

    save_model_dir(Transformer(tiny_cfg), tmp_path)
    meta = json.loads((tmp_path / CONFIG_FILE).read_text())
    meta["model"]["max_len"] = 10**9
    (tmp_path / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="sinusoidal table of max_len=1,000,000,000"):
        load_model_dir(tmp_path)
    assert main(["info", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "choose a smaller max_len" in err
    meta["model"]["max_len"] = tiny_cfg.max_len
    (tmp_path / CONFIG_FILE).write_text(json.dumps(meta))
    load_model_dir(tmp_path)
    size = (tmp_path / WEIGHTS_FILE).stat().st_size
    monkeypatch.setattr(device, "total_memory", lambda device: 2 * size - 1)
    with pytest.raises(CheckpointError, match="loading holds it twice"):
        load_model_dir(tmp_path)
    monkeypatch.setattr(device, "total_memory", lambda device: 2 * size)
    load_model_dir(tmp_path)


def test_learned_positions_and_classes_are_checked_against_the_weights(tmp_path, tiny_cfg):
    cfg = dataclasses.replace(tiny_cfg, positional="learned")
    save_model_dir(EncoderClassifier(cfg, n_classes=4), tmp_path)
    meta = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**meta, "extra": {"n_classes": 10**9}}))
    with pytest.raises(CheckpointError, match="n_classes=1000000000 but .* for 4 classes"):
        load_model_dir(tmp_path)
    meta["model"]["max_len"] = 10**9
    (tmp_path / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"max_len=1000000000 .* shape \(64, 16\)"):
        load_model_dir(tmp_path)


def test_bad_config_json_value(tmp_path, tiny_cfg):
    save_model_dir(Transformer(tiny_cfg), tmp_path)
    meta = json.loads((tmp_path / CONFIG_FILE).read_text())
    meta["model"]["n_heads"] = 3
    (tmp_path / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="not divisible by n_heads"):
        load_model_dir(tmp_path)


def test_cli_reports_a_bad_model_directory_in_one_line(tmp_path, capsys):
    assert main(["info", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not an aiayn model directory" in err


def test_cli_info_on_a_preset(capsys, tmp_path, monkeypatch):
    assert main(["info", "--preset", "paper_base", "--vocab-size", "37000"]) == 0
    assert '"parameters": 63082496' in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # no directory named paper_base here
    assert main(["info", "paper_base"]) == 0  # was "model directory not found: paper_base"
    assert '"parameters": 63082496' in capsys.readouterr().out
    assert main(["info", "paper_bass"]) == 2
    assert "nor a preset (cpu_small, cpu_tiny, paper_base" in capsys.readouterr().err
    # Counted on the meta device: 10^11 tokens x 1024 dims was an allocation of 400 TB.
    assert main(["info", "--preset", "paper_big", "--vocab-size", str(10**11)]) == 0
    assert '"parameters": 102400176357376' in capsys.readouterr().out


def test_cli_info_takes_the_model_directory_as_an_argument(tmp_path, tiny_cfg, capsys):
    save_model_dir(Transformer(tiny_cfg), tmp_path)
    outputs = []
    for argv in (["info", str(tmp_path)], ["info", "--model", str(tmp_path)]):
        assert main(argv) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and outputs[0]["architecture"] == "Transformer"
    assert outputs[0]["decode"]["beam_size"] == 4  # no [decode] saved: the paper's search
    decode = {"beam_size": 3, "alpha": 1.0, "length_penalty": "power"}
    (tmp_path / "run_config.json").write_text(json.dumps({"model": {}, "decode": decode}))
    assert main(["info", str(tmp_path)]) == 0  # the search translate runs without flags
    assert json.loads(capsys.readouterr().out)["decode"].items() >= decode.items()
    with pytest.raises(SystemExit):  # one of them, not both
        main(["info", str(tmp_path), "--preset", "paper_base"])
