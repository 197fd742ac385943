"""The import graph of src/aiayn: packages in one stack, no cycles, and the README says so.

A module imports the foundations (the top-level modules: errors, atomic, config_checks, config,
config_files, reference) and modules of its own package or of a package before it in PACKAGES,
never one after it.
PACKAGES is also the README's dependency sentence, so the two cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from paths import ROOT

PACKAGE = ROOT / "src" / "aiayn"

# The top-level modules, bottom to top: every package may import them.
FOUNDATIONS = ["errors", "atomic", "config_checks", "config", "config_files", "reference"]
# The packages, bottom to top: the stages of the paper, then of a translator's life.
PACKAGES = [
    "runtime", "nn", "text", "search", "store", "translate", "generate", "classify", "training",
    "interop", "glassbox", "serve", "cli",
]  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str) -> str:
    """The aiayn module an import names: a module, or a package (its __init__)."""
    while name not in MODULES:  # `from aiayn.search.decode import x` names a module already;
        name = name.rsplit(".", 1)[0]  # an attribute of a module resolves to the module
    return name


def imports(path: Path, *, eager_only: bool = False) -> set[str]:
    """The aiayn modules `path` imports: at top level, or anywhere unless `eager_only`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if eager_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aiayn":
            for alias in node.names:  # `from aiayn.store import checkpoints` names a module
                found.add(resolve(f"{node.module}.{alias.name}"))
        elif isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.startswith("aiayn.")}
    return found - {module_name(path)}


def rank(module: str) -> int:
    """A package's position in PACKAGES; the foundations rank below every package, in order."""
    parts = module.split(".")
    if len(parts) == 2 and parts[1] in FOUNDATIONS:
        return FOUNDATIONS.index(parts[1]) - len(FOUNDATIONS)
    return PACKAGES.index(parts[1])


def test_every_module_belongs_to_a_placed_package_or_is_a_foundation():
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert sorted(top - set(FOUNDATIONS)) == [], "a new top-level module: place it in a package"
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(PACKAGES), f"packages on disk {sorted(folders)} != PACKAGES"


def test_every_import_points_down_the_stack():
    against = [
        f"{m} imports {dep}"
        for m, path in MODULES.items()
        if m not in ("aiayn", "aiayn.__main__")
        for dep in sorted(imports(path))
        if dep != "aiayn" and rank(dep) > rank(m)
    ]
    assert against == []


def test_no_import_cycles_between_modules():
    graph = {m: imports(p) - {"aiayn"} for m, p in MODULES.items() if m != "aiayn"}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        raise AssertionError(f"import cycle: {e.args[1]}") from None
    assert len(order) == len(MODULES) - 1


def test_package_inits_only_describe_and_the_root_imports_lazily():
    # A subpackage's __init__ is its docstring: importing aiayn.serve.app must not pull in
    # every module of aiayn.serve, and an import path names the module that defines the name.
    for m, path in MODULES.items():
        if path.name == "__init__.py" and m != "aiayn":
            assert imports(path) == set(), f"{m}/__init__.py imports modules"
    # `import aiayn` loads only the model's own packages; the rest load on first use.
    eager = {rank(d) for d in imports(MODULES["aiayn"], eager_only=True)}
    assert max(eager) <= PACKAGES.index("nn"), "aiayn/__init__.py imports a heavy module eagerly"


def test_the_readme_states_the_same_stack():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sentence = re.search(r"Packages, bottom to top: (.+?)\.\s", readme, re.S)
    assert sentence, "the README's layout section lost its dependency sentence"
    named = re.findall(r"`(\w+)/`", sentence.group(1))
    assert named == PACKAGES


def test_every_public_name_is_importable_from_aiayn():
    import aiayn

    missing = [name for name in aiayn.__all__ if not hasattr(aiayn, name)]
    assert missing == []
    assert set(aiayn._LAZY) <= set(aiayn.__all__)  # a lazy name left out of __all__ is hidden
    from aiayn import Tokenizer, Transformer, Translator, train  # the README's spelling

    assert Translator.__module__ == "aiayn.translate.translator" and callable(train)
    assert (
        Tokenizer.__module__ == "aiayn.text.tokenizer"
        and Transformer.__module__ == "aiayn.nn.model"
    )
