"""`python -m aiayn` = the `aiayn` command."""

import sys

from aiayn.cli import main

sys.exit(main())
