"""`aiayn` command line: thin argparse subcommands over library functions.

Each subcommand is a pair in one module per command group (`*_cmd.py`): `add_<name>(sub)`
declares its flags and `run_<name>(args)` calls the library, importing it only when it runs,
so that `aiayn --help` stays fast. Bad input (an `AiaynError`, a missing file) is printed as
one line on stderr with exit status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from aiayn import __version__
from aiayn.cli.classify_cmd import add_classify, run_classify
from aiayn.cli.data_cmd import add_data, add_info, run_data, run_info
from aiayn.cli.generate_cmd import add_generate, run_generate
from aiayn.cli.glassbox_cmd import (
    add_attend,
    add_explain,
    add_plot_log,
    run_attend,
    run_explain,
    run_plot_log,
)
from aiayn.cli.interop_cmd import add_export, add_import, run_export, run_import
from aiayn.cli.serve_cmd import add_serve, run_serve
from aiayn.cli.train_cmd import (
    add_average,
    add_quickstart,
    add_train,
    run_average,
    run_quickstart,
    run_train,
)
from aiayn.cli.translate_cmd import add_evaluate, add_translate, run_evaluate, run_translate
from aiayn.errors import AiaynError
from aiayn.runtime.gc_pauses import freeze_startup
from aiayn.runtime.memory import keep_freed_memory

COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[..., int]]] = {
    "explain": (add_explain, run_explain),
    "attend": (add_attend, run_attend),
    "plot-log": (add_plot_log, run_plot_log),
    "info": (add_info, run_info),
    "data": (add_data, run_data),
    "translate": (add_translate, run_translate),
    "evaluate": (add_evaluate, run_evaluate),
    "generate": (add_generate, run_generate),
    "classify": (add_classify, run_classify),
    "train": (add_train, run_train),
    "average": (add_average, run_average),
    "export": (add_export, run_export),
    "import": (add_import, run_import),
    "quickstart": (add_quickstart, run_quickstart),
    "serve": (add_serve, run_serve),
}


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser, which refuses what it does not know itself. argparse leaves a
    subcommand's unknown arguments to the top parser, whose error shows `aiayn`'s usage
    (`aiayn COMMAND ...`) instead of the one that lists the command's flags; nested
    subcommands (`aiayn data check`) get this class too, as argparse makes them of their
    parent's class."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need': train, translate, explain.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=CommandParser
    )
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


# Commands that never load torch (the others import it before they run: `startup`)
WITHOUT_TORCH = {"data"}


def startup(command: str) -> None:
    """What the `aiayn` command does once its arguments are read, before the command runs:
    import torch where the command needs it (`import aiayn` does not, so that `--help` and
    `aiayn data` answer without its ~1.6 s), then freeze what the imports created out of the
    garbage collector's walks (aiayn.runtime.gc_pauses: ~0.6 s of a one-line translate)."""
    if command not in WITHOUT_TORCH:
        importlib.import_module("torch")
    freeze_startup(collect=False)


def main(argv: list[str] | None = None, on_start: Callable[[str], None] | None = None) -> int:
    """The `aiayn` command line; `on_start(command)` runs once the arguments are read (the
    console script passes `startup`; tests and library callers leave the process as it is)."""
    args = build_parser().parse_args(argv)
    if on_start is not None:
        on_start(args.command)
    keep_freed_memory()  # batches and steps reuse freed pages (AIAYN_MALLOC=default: not)
    try:
        code = COMMANDS[args.command][1](args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not in the exit's flush
        return code
    except BrokenPipeError:  # `aiayn translate ... | head`: the reader has what it wanted
        # Python's own advice (signal module docs): stdout to /dev/null, or the flush at exit
        # raises again. 141 = 128 + SIGPIPE, what `yes | head` reports for `yes`.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
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
