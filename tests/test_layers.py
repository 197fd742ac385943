"""The import graph of src/aiayn: no cycles, and every module imports only modules below it.

LAYERS is the reading order of the package, bottom to top (README, "Layout"): a newcomer can
read the files in this order and never meet a name defined further up.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "aiayn"

LAYERS = [
    # leaves: no aiayn imports but errors
    "errors", "atomic", "tracing", "config", "device", "distributed", "metrics",
    # the model
    "kv_cache", "attention", "model", "variants", "reference",
    "__init__",  # the package's public names: config, model, variants, tracing
    # text, data, files
    "tokenizer", "data", "data_check", "checkpoint", "marian", "synthetic",
    # using a model
    "decode", "translate", "train",
    # exporting it to other engines, and running the exports
    "export_dir", "export_ct2", "export_onnx", "engines",
    # the glass box
    "explain", "explain_seed", "explain_render", "viz", "viz_html", "notebook",
    # entry points
    "quickstart", "serve_batcher", "serve_requests", "serve_guard", "serve", "serve_run", "cli",
    "__main__",
]  # fmt: skip


def aiayn_imports(path: Path) -> set[str]:
    """The aiayn modules `path` imports, at top level or inside functions (TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aiayn":
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:  # from aiayn import metrics / __version__
                found |= {a.name for a in node.names if (PACKAGE / f"{a.name}.py").exists()}
                found |= {"__init__"} if any(a.name == "__version__" for a in node.names) else set()
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("aiayn.")}
    return found - {path.stem}


def test_every_module_is_placed_and_imports_only_modules_below_it():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py"))
    unplaced = [m for m in modules if m not in LAYERS]
    assert not unplaced, f"add {unplaced} to LAYERS (and the README's layout)"
    rank = {m: i for i, m in enumerate(LAYERS)}
    upward = [
        f"{m} imports {dep}"
        for m in modules
        for dep in sorted(aiayn_imports(PACKAGE / f"{m}.py"))
        if rank[dep] >= rank[m]
    ]
    assert upward == []  # which also rules out every import cycle
