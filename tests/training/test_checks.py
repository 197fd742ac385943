"""checks.py: recipes, models and batches that cannot train are one-line ConfigErrors, said
before anything is written (through `aiayn train` too); every shipped config is a valid recipe."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from copy_task import CONFIGS, tiny

from aiayn.config import Config, ModelConfig, TrainConfig
from aiayn.config_files import load_config
from aiayn.training.loop import train


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
    from aiayn.config import check_recipe
    from aiayn.errors import ConfigError

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
    from aiayn.config import check_recipe
    from aiayn.errors import ConfigError

    with pytest.raises(ConfigError, match="warmup_steps=0"):  # noam divides by it
        check_recipe(TrainConfig(lr_schedule="noam", warmup_steps=0))
    check_recipe(TrainConfig(lr_schedule="cosine", warmup_steps=0))
    with pytest.raises(ConfigError, match="train.threads=99999: give 0"):  # was a traceback
        train(Config(ModelConfig.preset("cpu_tiny", vocab_size=8), TrainConfig(threads=99999)))


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_is_a_valid_recipe(path):
    from aiayn.config import check_recipe

    check_recipe(load_config(path).train)


def test_own_data_config_is_a_valid_budget_recipe():
    from aiayn.config import check_recipe

    cfg = load_config(CONFIGS / "own_data.toml")
    tc = cfg.train
    assert tc.lr_schedule == "cosine_budget" and tc.max_minutes == 60 and tc.average_last == 5
    assert tc.bleu_samples > 0 and tc.label_smoothing == 0.1 and tc.dtype == tc.device == "auto"
    check_recipe(tc)
    # the measured recipe (docs/lab/budget_recipe.md, "The ablation repeated"): swish, Xavier init
    assert cfg.model.activation == "swish" and cfg.model.init == "xavier"
    assert tc.budget_decay == 0.25  # warmup-stable-decay ("A held-out corpus")
