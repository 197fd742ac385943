"""`train.task = "lm"`: a decoder-only model trained on text files, end to end (tiny, CPU)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from aiayn.config import Config, ModelConfig, TrainConfig
from aiayn.config_files import read_run_config
from aiayn.errors import AiaynError, ConfigError, DataError
from aiayn.generate.generator import Generator
from aiayn.store.model_dir import load_model_dir
from aiayn.text.lm_data import block_batch, block_offsets, eval_windows, window_batch
from aiayn.training.loop import train

run_training = train

LINES = [f"line {i}: the cat sat on the mat and the dog ran to the park." for i in range(300)]


def lm_config(tmp_path, **train) -> Config:
    text = tmp_path / "text.txt"
    text.write_text("\n".join(LINES) + "\n")
    model = ModelConfig(
        vocab_size=8, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=32
    )
    tc = TrainConfig(
        task="lm",
        text=str(text),
        tokenizer="char",
        out_dir=str(tmp_path / "run"),
        batch_size=8,
        lr_schedule="cosine",
        lr=3e-3,
        warmup_steps=5,
        max_steps=60,
        valid_every=30,
        save_every=30,
        label_smoothing=0.0,
        bleu_samples=0,
        threads=1,
        dtype="fp32",
    )
    return Config(model=model, train=dataclasses.replace(tc, **train))


def test_a_language_model_learns_its_text_and_records_its_held_out_share(tmp_path):
    cfg = lm_config(tmp_path, tensorboard=True)
    result = train(cfg, progress=False)
    records = [
        json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()
    ]
    valid = [r["valid_loss"] for r in records if "valid_loss" in r]
    assert len(valid) == 2 and valid[-1] < 0.6 * torch.log(torch.tensor(40.0)).item()
    assert all("valid_bits_per_char" in r for r in records if "valid_loss" in r)
    held = read_run_config(result.out_dir)["heldout_valid"]
    assert held["share"] == 0.1 and held["tokens"] > 0
    model = load_model_dir(result.out_dir)
    assert type(model).__name__ == "DecoderLM"
    text = Generator.load(result.out_dir, device="cpu").generate(
        ["line 1"], max_tokens=30, sample=False
    )[0]
    assert "the" in text  # greedy continuation of a memorised line
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(result.out_dir / "tb"))
    events.Reload()
    assert "valid/loss" in events.Tags()["scalars"] and "train/loss" in events.Tags()["scalars"]


def test_max_minutes_fits_the_budget_schedule(tmp_path, caplog):
    caplog.set_level("INFO")
    cfg = lm_config(
        tmp_path,
        lr_schedule="cosine_budget",
        max_minutes=0.05,
        max_steps=100000,
        average_last=2,
        keep_last=2,
    )
    result = train(cfg, progress=False)
    assert result.stopped in ("total_steps", "max_minutes")
    assert (result.out_dir / "averaged" / "model.safetensors").is_file()
    assert "the schedule ends at step" in caplog.text  # the budget was fitted and said so ...
    assert "translated" not in caplog.text  # ... without a translator's BLEU evidence


def test_blocks_are_a_function_of_seed_and_step_and_windows_score_every_token_once():
    stream = torch.arange(100)
    a = block_batch(stream, block_offsets(100, 10, 4, seed=1, step=7), 10)
    b = block_batch(stream, block_offsets(100, 10, 4, seed=1, step=7), 10)
    assert torch.equal(a.ids_BT, b.ids_BT) and torch.equal(a.next_BT, a.ids_BT + 1)
    w = window_batch(stream, eval_windows(100, 10), 10, pad_id=0)
    scored = w.next_BT[w.next_BT >= 0]
    assert sorted(scored.tolist()) == list(range(1, 100))


@pytest.mark.parametrize(
    "train, error",
    [
        ({"text": ""}, "train.text"),
        ({"tokenizer": "words"}, "train.tokenizer"),
        ({"valid_share": 1.0}, "valid_share"),
        ({"best_metric": "bleu", "bleu_samples": 10}, "bleu"),
        ({"src": "x.txt"}, "train.text"),
    ],
)
def test_bad_lm_settings_are_refused_before_anything_is_written(tmp_path, train, error):
    cfg = lm_config(tmp_path, **train)
    with pytest.raises(ConfigError, match=error):
        run_training(cfg, progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_text_too_short_for_a_block_and_binary_text_are_one_line(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("tiny\n")
    with pytest.raises(DataError, match="fewer than one block"):
        train(lm_config(tmp_path, text=str(short), valid_share=0.0), progress=False)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\x00\x01" * 50)
    with pytest.raises(AiaynError, match="binary"):
        train(lm_config(tmp_path, text=str(binary)), progress=False)


def test_every_block_target_is_scored_even_one_equal_to_pad():
    """GPT-2's <|endoftext|> is its PAD and its EOS: a block's end-of-text targets must count."""
    from aiayn.training.lm_setup import BlockLoader
    from aiayn.training.loss import label_smoothed_loss

    logits_PV, target_P = torch.randn(4, 6), torch.tensor([0, 3, 0, 5])  # 0: pad_id
    _, nll_all = label_smoothed_loss(logits_PV, target_P, 0.0, BlockLoader.unscored(0))
    want = torch.nn.functional.cross_entropy(logits_PV, target_P, reduction="sum")
    torch.testing.assert_close(nll_all, want)
