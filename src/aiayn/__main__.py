"""`python -m aiayn` = the `aiayn` command (whose entry point is `run`)."""

import sys

from aiayn.cli.main import main, startup


def run() -> int:
    """`main` for the command line, with `startup`: torch imported where the command needs it,
    then what the imports created (torch, ~170 thousand objects), which lives as long as the
    process, frozen out of the collections that follow and of those the interpreter runs as it
    exits (~0.6 s of a one-line `aiayn translate`; aiayn.runtime.gc_pauses)."""
    return main(on_start=startup)


if __name__ == "__main__":
    sys.exit(run())
