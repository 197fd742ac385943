"""Frozen configs, TOML files and typed --set overrides."""

import dataclasses

import pytest
from paths import CONFIGS as CONFIG_DIR

from aiayn.config import Config, ModelConfig, check_decode_config, check_recipe
from aiayn.config_files import apply_overrides, builtin_configs, load_config
from aiayn.errors import ConfigError


def test_presets_and_frozen():
    cfg = ModelConfig.preset("paper_big", vocab_size=100)
    assert (cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.dropout) == (
        1024,
        16,
        6,
        4096,
        0.3,
    )
    assert cfg.d_k == 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match="needs vocab_size"):
        ModelConfig.preset("paper_base")


def test_toml_with_preset_and_typed_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\npreset = "cpu_small"\ndropout = 0.2\n[train]\nmax_tokens = 2048\n')
    cfg = load_config(
        path,
        [
            "train.warmup_steps=8_000",
            "model.norm_first=true",
            "train.adam_betas=0.9,0.997",
            "train.lr_schedule=cosine",
        ],
    )
    assert cfg.model.d_model == 256 and cfg.model.dropout == 0.2 and cfg.model.norm_first is True
    assert cfg.train.max_tokens == 2048 and cfg.train.warmup_steps == 8000
    assert cfg.train.adam_betas == (0.9, 0.997) and cfg.train.lr_schedule == "cosine"


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.max_tokens=lots", "expected int"),
        ("train.max_token=5", "has no field 'max_token'"),
        ("model.norm_first=maybe", "expected bool"),
        ("train.lr_schedule=linear", "choose one of"),
        ("max_tokens=5", "expected model|train|decode.FIELD=VALUE"),
        ("model.n_heads=3", "not divisible"),
    ],
)
def test_bad_overrides_are_clear(override, message):
    cfg = Config(model=ModelConfig(vocab_size=10, d_model=8, n_heads=2))
    with pytest.raises(ConfigError, match=message):
        apply_overrides(cfg, [override])


def test_bad_files_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    bad.write_text("[modle]\n")
    with pytest.raises(ConfigError, match="unknown table"):
        load_config(bad)
    bad.write_text("[model]\nd_modle = 3\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(bad)


CONFIGS = sorted(CONFIG_DIR.glob("*.toml"))


def test_the_recipes_are_built_in_by_name(tmp_path, monkeypatch):
    """`aiayn train --config own_data` works from any directory (an installed aiayn has no
    configs/ beside it): the repository's configs/ is the package's, by name or file name."""
    assert builtin_configs() == [p.stem for p in CONFIGS] and "own_data" in builtin_configs()
    monkeypatch.chdir(tmp_path)
    by_path = load_config(CONFIGS[0])
    assert load_config(CONFIGS[0].stem) == by_path == load_config(CONFIGS[0].name)
    (tmp_path / "own_data.toml").write_text("[model]\nd_model = 64\nn_heads = 4\n")
    assert load_config("own_data.toml").model.d_model == 64  # a file given wins over a name
    with pytest.raises(ConfigError, match=r"not found: own_dta \(the built-in recipes, by "
                       r"name: classify, cpu_small, .*own_data"):  # fmt: skip
        load_config("own_dta")
    with pytest.raises(ConfigError, match="not found: sub/own_data.toml"):
        load_config("sub/own_data.toml")  # a path is never taken for a name
    with pytest.raises(ConfigError, match="not found: own_data"):
        load_config("own_data/")  # nor a directory's (Path drops the slash)
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="File name too long"):  # was OSError's traceback
        load_config("a" * 5000)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load_and_pass_the_checks(path):
    """Every configs/*.toml reads, and its recipe and search settings pass the same checks
    `aiayn train` makes before anything is written (schedule/averaging, decode values)."""
    cfg = load_config(path)
    check_recipe(cfg.train)
    check_decode_config(cfg.decode)
    assert cfg.train.average_last <= cfg.train.keep_last


def test_the_budget_recipe_is_the_measured_one():
    """configs/multi30k_tiny_budget.toml is the recipe docs/lab/budget_recipe.md measured:
    the published tiny architecture, dropout 0.1, cosine to 0 fitted to the time budget,
    the last 5 checkpoints of the schedule averaged."""
    cfg = load_config(CONFIG_DIR / "multi30k_tiny_budget.toml")
    m, t = cfg.model, cfg.train
    assert (m.d_model, m.n_heads, m.n_layers, m.d_ff, m.dropout) == (128, 4, 4, 256, 0.1)
    assert (t.lr_schedule, t.lr, t.warmup_steps, t.average_last) == ("cosine_budget", 3e-3, 300, 5)
