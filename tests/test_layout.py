"""The package's shape (issue #17): no file over 500 lines, no import cycle, layers import down;
``methods/`` holds its shared modules and one package per inference family (issue #45), and no
family imports another.

Read from the source with :mod:`ast` (nothing is imported). A module's imports are its
``import gpscale...`` / ``from gpscale... import ...`` statements at any depth except under
``if TYPE_CHECKING:``; ``from gpscale.a import b`` counts as importing ``gpscale.a.b`` when that
is a module, and importing ``gpscale.a.b`` also runs ``gpscale/a/__init__.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "gpscale"
MAX_LINES = 500
# cli → benchmarks → run (the user's run, which the suites sit on) → training → methods →
# likelihoods → kernels → linalg: a module may import from its own layer or any layer to its
# right, never to its left. (``gpscale.kernels`` puts kernel products onto linalg's fused /
# chunked / block-sparse primitives, so it sits above linalg; linalg knows no kernel objects.)
LAYERS = ("gpscale.cli", "gpscale.benchmarks", "gpscale.run", "gpscale.training",
          "gpscale.methods", "gpscale.likelihoods", "gpscale.kernels", "gpscale.linalg")
# methods/: one package per inference family, beside the modules every family shares; a family
# imports those and never another family. The two former module paths of the data-parallel
# pieces re-export them (gpscale.methods.cagp.sharded, gpscale.methods.ski.sharded).
FAMILIES = ("baselines", "cagp", "iterncgp", "ski", "softki", "solvegp")
SHARED = ("base", "options", "registry", "auto", "_common")
FORMER_PATHS = ("cagp_sharded", "ggp_sharded")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(name: str, *, top_level_only: bool, type_checking: bool = False) -> set[str]:
    """The gpscale modules ``name`` imports (with the packages each import runs); imports under
    ``if TYPE_CHECKING:`` count only with ``type_checking``."""
    tree = ast.parse(MODULES[name].read_text())
    skip = set() if type_checking else _type_checking_lines(tree)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if getattr(node, "lineno", None) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                       else node.module for a in node.names]
        for target in targets:
            if not target.startswith("gpscale"):
                continue
            parts = target.split(".")
            found.update(".".join(parts[:i]) for i in range(2, len(parts) + 1)
                         if ".".join(parts[:i]) in MODULES)
    found.discard(name)
    return found


def _layer(name: str) -> int | None:
    for rank, prefix in enumerate(LAYERS):
        if name == prefix or name.startswith(prefix + "."):
            return rank
    return None


def test_no_source_file_over_500_lines():
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules (lines): {long}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_between_modules():
    """The top-level import graph has no cycle (a package importing its own submodules in
    ``__init__`` is not a cycle)."""
    graph = {name: {t for t in _imports(name, top_level_only=True)
                    if not (name != "gpscale" and t.startswith(name + "."))
                    and not (t != "gpscale" and name.startswith(t + "."))}
             for name in MODULES}
    assert not (cycles := _cycles(graph)), f"import cycles: {cycles}"


def _folder(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def test_no_file_level_import_cycle_inside_a_folder():
    """Within one folder not even lazy imports (inside functions) or annotation-only ones
    (``if TYPE_CHECKING:``) go round in a circle: each folder's files form a hierarchy."""
    graph = {name: {t for t in _imports(name, top_level_only=False, type_checking=True)
                    if t in MODULES and MODULES[t].name != "__init__.py"
                    and _folder(t) == _folder(name)}
             for name in MODULES if MODULES[name].name != "__init__.py"}
    assert not (cycles := _cycles(graph)), f"file-level import cycles: {cycles}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _layer(n) is not None))
def test_layers_import_downwards_only(name):
    """Also imports inside functions: a lazy import is still a dependency."""
    rank = _layer(name)
    upward = sorted(t for t in _imports(name, top_level_only=False)
                    if (r := _layer(t)) is not None and r < rank)
    assert not upward, f"{name} imports from a layer above it: {upward}"


def _family(name: str) -> str | None:
    for family in FAMILIES:
        package = f"gpscale.methods.{family}"
        if name == package or name.startswith(package + "."):
            return family
    return None


def test_methods_holds_the_shared_modules_and_one_package_per_family():
    """No family's files lie loose beside the shared ones (issue #45: no ``_cagp_*.py``)."""
    found = {p.name for p in (PACKAGE / "methods").iterdir() if p.name != "__pycache__"}
    expected = {"__init__.py", *FAMILIES, *(f"{m}.py" for m in SHARED + FORMER_PATHS)}
    assert found == expected, (f"unexpected: {sorted(found - expected)}; "
                               f"missing: {sorted(expected - found)}")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_package_says_what_each_of_its_files_holds(family):
    """The family's ``__init__`` docstring names each of its public modules."""
    init = MODULES[f"gpscale.methods.{family}"]
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    unnamed = sorted(path.stem for path in init.parent.glob("*.py")
                     if not path.stem.startswith("_") and not re.search(rf"\b{path.stem}\b", doc))
    assert not unnamed, f"gpscale.methods.{family}'s docstring does not mention {unnamed}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _family(n) is not None))
def test_a_family_imports_no_other_family(name):
    """Also lazy and annotation-only imports: what two families share goes to a shared module."""
    others = sorted(t for t in _imports(name, top_level_only=False, type_checking=True)
                    if _family(t) not in (None, _family(name)))
    assert not others, f"{name} imports another method family: {others}"


@pytest.mark.parametrize("name", [f"gpscale.methods.{m}" for m in SHARED])
def test_the_shared_methods_modules_import_no_family(name):
    families = sorted(t for t in _imports(name, top_level_only=False, type_checking=True)
                      if _family(t) is not None)
    assert not families, f"{name} is shared by the families but imports {families}"
