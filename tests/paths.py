"""The repository's folders, for tests in any folder of tests/ (this file is at its top level,
imported as a plain module like copy_task.py): one definition instead of `.parent` chains."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
DOCS = ROOT / "docs"
BENCH = ROOT / "bench"
EXAMPLES = ROOT / "examples"
NOTEBOOKS = ROOT / "notebooks"

# The shared data beside the checkout (../shared), where the machine has it.
SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared")
MULTI30K = os.path.normpath(os.path.join(SHARED, "data", "multi30k"))
