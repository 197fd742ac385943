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


# --- main -----------------------------------------------------------------------------------------

COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[..., int]]] = {
    "info": (_add_info, _run_info),
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
