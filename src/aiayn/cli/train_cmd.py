"""`aiayn train`, `aiayn average` and `aiayn quickstart`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from aiayn.cli.flags import add_device_flag
from aiayn.config_files import builtin_configs

# Two files are enough: `aiayn train --set train.src=A --set train.tgt=B` runs the own-data recipe
DEFAULT_CONFIG = "own_data"


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train (or resume) a translation model into train.out_dir; torchrun-aware",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=Path(DEFAULT_CONFIG),
        help="a TOML file, or a built-in recipe by name: "
        + ", ".join(builtin_configs())
        + f" (default {DEFAULT_CONFIG}: your corpus in train.max_minutes, "
        "docs/training.md)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one field, e.g. --set train.max_tokens=4096 (repeatable)",
    )
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (logs only)")
    p.add_argument(
        "--device",
        help="auto | cpu | cuda | cuda:N | mps; the same as --set train.device=... "
        "(under torchrun, cuda means cuda:LOCAL_RANK)",
    )


def run_train(args: argparse.Namespace) -> int:
    import logging

    from aiayn.config_files import load_config
    from aiayn.training.loop import train

    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    overrides = [*args.overrides, *([f"train.device={args.device}"] if args.device else [])]
    result = train(load_config(args.config, overrides), progress=not args.no_progress)
    if rank == 0:
        where = "no model written" if result.stopped == "diverged" else "model"
        print(f"stopped ({result.stopped}) at step {result.step}; {where}: {result.out_dir}")
    return {"signal": 130, "diverged": 1}.get(result.stopped, 0)


def add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("average", help="average checkpoints into a new model directory (§6.1)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--inputs", type=Path, nargs="+", help="model/checkpoint directories")
    g.add_argument("--run", type=Path, help="a run directory: average its last --last checkpoints")
    p.add_argument("--last", type=int, default=5, help="with --run: how many, >= 1 (default 5)")
    p.add_argument("--out", type=Path, required=True, help="new model directory")


def run_average(args: argparse.Namespace) -> int:
    from aiayn.errors import CheckpointError
    from aiayn.store.checkpoints import CHECKPOINTS_DIR, list_checkpoints, write_average

    dirs = list(args.inputs or [])
    if args.run is not None:
        if args.last < 1:
            raise CheckpointError(f"--last must be at least 1, got {args.last}")
        if not args.run.is_dir():
            raise CheckpointError(f"run directory not found: {args.run}")
        if args.run.name == CHECKPOINTS_DIR and not (args.run / CHECKPOINTS_DIR).exists():
            raise CheckpointError(
                f"--run {args.run} is a run's checkpoints directory; give the "
                f"run directory it is in, {args.run.parent}"
            )
        found = list_checkpoints(args.run)
        if len(found) < args.last:
            raise CheckpointError(f"{args.run} has {len(found)} checkpoints, --last {args.last}")
        dirs = found[-args.last :]
    write_average(dirs, args.out)
    print(f"averaged {len(dirs)} checkpoints into {args.out}: {', '.join(d.name for d in dirs)}")
    return 0


def add_quickstart(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quickstart",
        help="no download: generate English->German numbers, train, evaluate, draw attention",
        description="Generate a numbers corpus (num2words), train the cpu_tiny Transformer for "
        "a few minutes, score held-out pairs, write a cross-attention picture and a model "
        "directory. Writes OUT/metrics.json.",
    )
    p.add_argument("--out", type=Path, default=Path("quickstart"), help="output directory")
    p.add_argument("--minutes", type=float, default=3.5, help="training budget (default 3.5)")
    p.add_argument("--n-train", type=int, default=50_000, help="training pairs (default 50000)")
    p.add_argument("--n-test", type=int, default=1000, help="held-out test pairs (default 1000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print metrics.json instead of a report")
    add_device_flag(p)


def run_quickstart(args: argparse.Namespace) -> int:
    import logging

    from aiayn.cli.quickstart import format_summary, run_quickstart, summary_json
    from aiayn.errors import ConfigError

    if args.minutes <= 0 or args.n_train < 100 or args.n_test < 1:
        raise ConfigError("--minutes must be > 0, --n-train >= 100 and --n-test >= 1")
    logging.basicConfig(level=logging.INFO, format="aiayn: %(message)s")
    summary = run_quickstart(
        args.out,
        minutes=args.minutes,
        n_train=args.n_train,
        n_test=args.n_test,
        seed=args.seed,
        device=args.device,
    )
    print(summary_json(summary) if args.json else format_summary(summary))
    return 0
