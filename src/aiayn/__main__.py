"""`python -m aiayn` = the `aiayn` command (whose entry point is `run`)."""

import sys

from aiayn.cli.main import main
from aiayn.runtime.gc_pauses import freeze_startup


def run() -> int:
    """`main` for the command line. What the imports created (torch, ~170 thousand objects)
    lives as long as the process: frozen first, it is not walked by the collections that
    follow, nor by those the interpreter runs as it exits (~0.6 s of a one-line `aiayn
    translate`; aiayn.runtime.gc_pauses)."""
    freeze_startup(collect=False)
    return main()


if __name__ == "__main__":
    sys.exit(run())
