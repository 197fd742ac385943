"""Multi30k de->en with a small CPU config: tokens/s, seconds per epoch, validation ppl per epoch.

Runs `aiayn.training.loop.train` (the real training loop: SentencePiece on the training text,
token-budget batches, label smoothing, Adam + noam) on `../shared/data/multi30k/raw` for a few
epochs into a temporary directory and summarises its metrics log, so that the real-data work
can plan its budget.

    python bench/multi30k_epoch.py --epochs 2      # last line: one JSON object
    python bench/multi30k_epoch.py --steps 20 --dtype bf16   # a few steps: what a dtype costs

`--dtype auto` (the default, as in the shipped configs) lets `aiayn.runtime.device` choose; the JSON
says what it chose (`runtime`) and names the CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from aiayn.config_files import load_config
from aiayn.runtime.memory import keep_freed_memory
from aiayn.training.loop import train

ROOT = Path(__file__).resolve().parent.parent
DATA = (ROOT / ".." / "shared" / "data" / "multi30k" / "raw").resolve()


def cpu_name() -> str:
    """The CPU's model name (Linux), for the figures' provenance."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0 = epochs)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="extra config overrides, e.g. train.max_tokens=2048",
    )
    args = p.parse_args()
    keep_freed_memory()  # malloc as aiayn's commands set it, for every side measured here
    if not (DATA / "train.de").is_file():
        raise SystemExit(f"Multi30k not found at {DATA}; this benchmark needs it")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        sets = [
            f"train.src={DATA / 'train.de'}",
            f"train.tgt={DATA / 'train.en'}",
            f"train.valid_src={DATA / 'val.de'}",
            f"train.valid_tgt={DATA / 'val.en'}",
            f"train.out_dir={out}",
            f"train.max_epochs={args.epochs}",
            "train.valid_every=0",
            "train.save_every=0",
            "train.bleu_samples=0",
            "train.best_metric=loss",
            f"train.dtype={args.dtype}",
            f"train.max_steps={args.steps or 1_000_000}",
            *([f"train.log_every={max(1, args.steps // 4)}"] if args.steps else []),
            *args.overrides,
        ]
        cfg = load_config(ROOT / "configs" / "multi30k_de_en.toml", sets)
        t0 = time.perf_counter()
        result = train(cfg, progress=False)
        wall = time.perf_counter() - t0
        records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        runtime = json.loads((out / "run_config.json").read_text())["runtime"]
    valid = [r for r in records if "valid_loss" in r]
    train_recs = [r for r in records if "tokens_per_s" in r]
    epochs = []
    prev_t = 0.0
    for r in valid:
        epochs.append(
            {
                "epoch": r["epoch"],
                "step": r["step"],
                "seconds": round(r["elapsed_s"] - prev_t, 1),
                "valid_loss": round(r["valid_loss"], 4),
                "valid_ppl": round(r["valid_ppl"], 2),
            }
        )
        prev_t = r["elapsed_s"]
    last = train_recs[-1] if train_recs else {"tokens": 0, "elapsed_s": 1.0}
    summary = {
        "config": "configs/multi30k_de_en.toml",
        "dtype": args.dtype,
        "overrides": args.overrides,
        "runtime": runtime,
        "cpu": cpu_name(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "epochs": epochs,
        "steps": result.step,
        # all target tokens over all time, validation included: what an epoch really costs
        "tokens_per_s": round(last["tokens"] / last["elapsed_s"], 1),
        "seconds_per_epoch": round(sum(e["seconds"] for e in epochs) / max(len(epochs), 1), 1),
        "wall_seconds_incl_tokenizer": round(wall, 1),
        "threads": torch.get_num_threads(),
        "allocator": os.environ.get("LD_PRELOAD", ""),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
