"""`aiayn` command line: thin argparse subcommands over library functions.

Each subcommand is a pair: `_add_<name>(subparsers)` declares its flags and `_run_<name>(args)`
calls the library. Bad input (an `AiaynError`, a missing file) is printed as one line on
stderr with exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from aiayn import __version__
from aiayn.errors import AiaynError

# --- info -----------------------------------------------------------------------------------------


def _add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe a preset or a model directory (sizes, parameters)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--preset", help="a ModelConfig preset, e.g. paper_base")
    g.add_argument("--model", type=Path, help="a model directory")
    p.add_argument("--vocab-size", type=int, default=37000, help="with --preset (default 37000)")


def _run_info(args: argparse.Namespace) -> int:
    from aiayn.checkpoint import load_model_dir
    from aiayn.config import ModelConfig, to_dict
    from aiayn.model import Transformer, count_parameters

    if args.preset:
        model = Transformer(ModelConfig.preset(args.preset, vocab_size=args.vocab_size))
    else:
        model = load_model_dir(args.model)
    info = {
        "architecture": type(model).__name__,
        "parameters": count_parameters(model),
        "config": to_dict(model.cfg),
    }
    print(json.dumps(info, indent=2))
    return 0


# --- data -----------------------------------------------------------------------------------------


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="make corpora (`data synth`: the built-in corpus)")
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    s = data_sub.add_parser(
        "synth",
        help="numbers or dates in words, as line-aligned parallel files (docs/synthetic.md)",
    )
    s.add_argument("--task", choices=("numbers", "dates"), required=True)
    s.add_argument("--src", required=True, help="source language, e.g. en")
    s.add_argument("--tgt", required=True, help="target language, e.g. de")
    s.add_argument("--n", type=int, required=True, help="training pairs")
    s.add_argument("--valid", type=int, default=1000, help="validation pairs (default 1000)")
    s.add_argument("--test", type=int, default=1000, help="test pairs (default 1000)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, required=True, help="directory for {train,valid,test}.LANG")


def _run_data(args: argparse.Namespace) -> int:
    from aiayn.synthetic import write_corpus

    written = write_corpus(
        args.out, args.task, args.src, args.tgt, args.n, args.valid, args.test, args.seed
    )
    for split, (src_path, tgt_path, n) in written.items():
        print(f"{split}: {n} pairs  {src_path}  {tgt_path}")
    return 0


# --- main -----------------------------------------------------------------------------------------

COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[..., int]]] = {
    "info": (_add_info, _run_info),
    "data": (_add_data, _run_data),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need': train, translate, explain.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except AiaynError as e:
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        print(f"aiayn {args.command}: error: {e.strerror}: {e.filename}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aiayn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
