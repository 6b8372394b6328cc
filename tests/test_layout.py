"""The package's shape (issue #17): no file over 500 lines, no import cycle, layers import down;
``methods/`` holds its shared modules and one package per inference family (issue #45), and no
family imports another.

Read from the source with :mod:`ast` (nothing is imported). A module's imports are its
``import gpscale...`` / ``from gpscale... import ...`` statements at any depth except under
``if TYPE_CHECKING:``; ``from gpscale.a import b`` counts as importing ``gpscale.a.b`` when that
is a module, and importing ``gpscale.a.b`` also runs ``gpscale/a/__init__.py``. Only the
start-up tests at the end import the package, each in a fresh interpreter.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
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
# imports those and never another family.
FAMILIES = ("baselines", "cagp", "iterncgp", "ski", "softki", "solvegp")
SHARED = ("base", "options", "registry", "auto", "_common")


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
    expected = {"__init__.py", *FAMILIES, *(f"{m}.py" for m in SHARED)}
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


# Start-up loads only what it uses: ``import gpscale`` no torch; the method families, and what
# ``gpscale fit`` and ``gpscale predict`` import, neither torch.compile's machinery, scikit-learn
# nor pyarrow, which load on first use (compiling a kernel, k-means, reading a data file);
# ``gpscale --version`` and ``--help`` no torch. Each runs in a fresh interpreter and is checked
# in its sys.modules (not timed: timings on a shared machine are noise).
HEAVY = ("torch._dynamo", "torch._inductor", "sklearn", "pyarrow")


def _loaded(code: str, modules: tuple[str, ...]) -> tuple[list[str], str]:
    """Which of ``modules`` a fresh interpreter holds after running ``code``, and what ``code``
    printed."""
    check = f"import sys; print('loaded:', *[m for m in {modules!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", f"{code}\n{check}"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    *printed, last = done.stdout.splitlines()
    return last.split()[1:], "\n".join(printed)


def test_import_gpscale_imports_no_torch():
    assert _loaded("import gpscale", ("torch",))[0] == []


@pytest.mark.parametrize("module", ["gpscale.methods", "gpscale.run", "gpscale.cli.predict"])
def test_the_methods_and_the_commands_import_no_compiler_sklearn_or_pyarrow(module):
    """``gpscale.methods`` with every family registered; ``gpscale.run`` is what ``fit`` runs,
    ``gpscale.cli.predict`` what ``predict`` does."""
    code = (f"import {module}\nfrom gpscale.methods import METHODS\n"
            "assert {'exact', 'cagp-opt', 'iterncgp', 'ski', 'softki', 'solvegp'} <= set(METHODS)")
    assert _loaded(code, HEAVY)[0] == []


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_gpscale_version_and_help_import_no_torch(flag):
    code = ("import contextlib\nfrom gpscale.cli.__main__ import main\n"
            f"with contextlib.suppress(SystemExit):\n    main([{flag!r}])")
    loaded, printed = _loaded(code, ("torch", "gpscale.training", "gpscale.methods"))
    assert loaded == [] and printed.startswith(("gpscale ", "usage: gpscale"))


# The code says what it does and why; its history — issue numbers, dates, commits, the figures
# measured on it — goes to docs/notes/ (the benchmarks package, which produces figures, may cite
# them). Python has no '#' outside comments and strings, so the raw text is what is scanned.
HISTORY = {
    # '#12' after a space or bracket; not a linter's directive, a hex colour '#1f77b4', a format
    # '{:#04x}', '[#]' or another project's 'owner/repo#12'
    "issue number": re.compile(r"(?<![\w/&#])#\d{1,5}\b|\bissues? +#?\d+\b", re.IGNORECASE),
    "date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
}
# A commit hash: 7–12 lowercase hex characters, at least one digit and one letter, on a line
# that speaks of commits (so not a digest's prefix, nor a float such as 9.9999997e-05).
HEX_WORD = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b")
COMMITISH = re.compile(r"\bcommit(?:s|ted)?\b|\bmain at\b|\brevision\b|@(?=[0-9a-f]{7})",
                       re.IGNORECASE)


def _history(text: str) -> list[tuple[int, str, str]]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, kind, m.group(0)) for kind, pattern in HISTORY.items()
                  for m in pattern.finditer(line)]
        if COMMITISH.search(line):
            found += [(number, "commit", m.group(0)) for m in HEX_WORD.finditer(line)]
    return found


def test_the_code_carries_no_issue_numbers_dates_or_commits():
    """Outside the benchmarks package: the reason goes in the code, the history and the evidence
    in docs/notes/ (a figure that supports a default: "Evidence moved out of the code" in
    docs/notes/benchmarks-2026-12.md)."""
    found = [f"{MODULES[name].relative_to(SRC)}:{line}: {kind} {text!r}"
             for name in sorted(MODULES) if not name.startswith("gpscale.benchmarks")
             for line, kind, text in _history(MODULES[name].read_text())]
    assert not found, "say what and why instead:\n" + "\n".join(found[:30])


def test_the_history_patterns_catch_the_forms_used_before():
    for text in ("(issue #12)", "issue 20", "issues #8 and #43", "so (#45: no _cagp_*.py)",
                 "measured 2026-11-28", "commit 504c692 of", "commits 1d5d85d, 4ebbc67 of",
                 "main at 85dff82", "gpscale@3451b13"):
        assert _history(text), text
    for text in ("x = 1  # noqa: E501", "color='#1f77b4'", "'#000000'", "f'{byte:#04x}'",
                 "[#]", "cornellius-gp/gpytorch#2749", "CVE-2025-32434", "benchmarks-2026-12.md",
                 "float32 9.9999997e-05", "MD5s 2646ac64… (images)", "a commit record names the "
                 "run id and the SHA-256 of each file", "commit 1234567 (digits only)"):
        assert not _history(text), text


# benchmarks/ is a leaf on top: the suites use the product, the product never uses them. The one
# way in is the command line's ``gpscale bench``, which imports the suites' registry; a helper
# the product needs (the run of one rank, the demo, the results writer) lives beside its user.
BENCHMARKS = "gpscale.benchmarks"
WAY_IN = {"gpscale.cli.__main__": {BENCHMARKS, f"{BENCHMARKS}.registry"}}


def _in_benchmarks(name: str) -> bool:
    return name == BENCHMARKS or name.startswith(BENCHMARKS + ".")


def _imports_by_name(name: str) -> set[str]:
    """Modules ``name`` imports by a string (``importlib.import_module("gpscale...")``,
    ``__import__``), which the import statements do not show."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if (isinstance(node, ast.Call) and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and ast.unparse(node.func).rpartition(".")[2] in ("import_module", "__import__")):
            found.add(node.args[0].value)
    return found


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not _in_benchmarks(n)))
def test_nothing_outside_the_benchmarks_imports_them(name):
    """At any depth (inside functions, under ``if TYPE_CHECKING:``) and by a string; only
    ``gpscale bench`` reaches the suites, through their registry."""
    found = _imports(name, top_level_only=False, type_checking=True) | _imports_by_name(name)
    reached = sorted(t for t in found if _in_benchmarks(t) and t not in WAY_IN.get(name, set()))
    assert not reached, f"{name} imports the benchmarks: {reached}"


# The method contract: what the pipeline needs about a method is declared in the method's family
# (``MethodSpec`` fields, ``Method`` hooks with defaults), so run, training and devices name no
# method key and probe no model for a hook. The registry's keys, option choices and the Method
# hooks are read in a fresh interpreter (this module imports nothing of the package).
PIPELINE_FILES = sorted({*(PACKAGE / "training").rglob("*.py"), PACKAGE / "devices.py",
                         PACKAGE / "run.py"})
# 'exact' is also an English word, in prose such as "an exact GP"; as a string of its own (the
# key) the first rule below still catches it.
PROSE_WORDS = {"exact"}
# ``training.fit`` trains any nn.Module: what ``build`` sets on a registry-built module is read
# where it is there (checkpoints record it).
BUILT_ATTRIBUTES = {"method_key", "options"}


def _registry_facts() -> dict:
    import functools
    import json

    @functools.cache
    def facts() -> str:
        code = ("import json\nfrom torch import nn\nfrom gpscale.methods import METHODS\n"
                "from gpscale.methods.base import Method\n"
                "choices = {o.name: sorted(o.choices) for s in METHODS.values() "
                "for o in s.options if o.choices}\n"
                "hooks = sorted(n for n in set(dir(Method)) - set(dir(nn.Module)) "
                "if not n.startswith('_'))\n"
                "print(json.dumps({'keys': sorted(METHODS), 'choices': choices, "
                "'hooks': hooks}))")
        return _loaded(code, ())[1]

    return json.loads(facts().splitlines()[-1])


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (of modules, classes, functions and
    attributes: any string statement)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


def _option_values(tree: ast.AST, choices: dict[str, list[str]]) -> set[int]:
    """ids of string constants compared with an option whose declared choices hold them:
    ``opts.get("prefit") in ("auto", "exact")`` compares an option's value, not a key."""
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        constants = [c for part in (node.left, *node.comparators) for c in ast.walk(part)
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        allowed = {v for c in constants for v in choices.get(c.value, ())}
        exempt.update(id(c) for c in constants if c.value in allowed)
    return exempt


def test_the_pipeline_names_no_method_key():
    """No string in training/, devices.py or run.py is a registered key, or names one as a
    word (docstrings aside; a key is declared in its family's package: the pipeline reads the
    declarations from the registry)."""
    facts = _registry_facts()
    keys = set(facts["keys"])
    word = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(keys - PROSE_WORDS)))
                      + r")(?![\w-])")
    found = []
    for path in PIPELINE_FILES:
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree) | _option_values(tree, facts["choices"])
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in skip
                    and (node.value in keys or word.search(node.value))):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value[:60]!r}")
    assert not found, "method keys in the pipeline:\n" + "\n".join(found)


def test_the_pipeline_probes_no_method_hook():
    """No ``getattr``/``hasattr`` in training/, devices.py or run.py looks for a hook the
    Method base class declares (it has a default: use it), nor for anything else on a model
    but what ``build`` sets (:data:`BUILT_ATTRIBUTES`)."""
    hooks = set(_registry_facts()["hooks"])
    found = []
    for path in PIPELINE_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
                continue
            target, name = ast.unparse(node.args[0]), node.args[1]
            on_model = target == "model" or target.endswith(".model")
            named = name.value if isinstance(name, ast.Constant) else None
            if named in hooks or (on_model and named not in BUILT_ATTRIBUTES):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "probes for method hooks:\n" + "\n".join(found)


def _unit(name: str) -> str:
    """The top-level module or package of ``name`` under gpscale (``gpscale.methods``)."""
    return ".".join(name.split(".")[:2])


def test_no_import_cycle_between_the_top_level_modules_even_inside_functions():
    """Counting imports inside functions (a lazy import is a dependency too): no two top-level
    modules or packages of gpscale import each other, directly or round a circle
    (``devices`` reads the method registry; the methods never import ``devices``), and no
    module-level circle either."""
    lazy = {name: _imports(name, top_level_only=False) for name in MODULES}
    modules = {name: {t for t in targets
                      if not (name != "gpscale" and t.startswith(name + "."))
                      and not (t != "gpscale" and name.startswith(t + "."))}
               for name, targets in lazy.items()}
    assert not (cycles := _cycles(modules)), f"import cycles (lazy imports counted): {cycles}"
    units: dict[str, set[str]] = {}
    for name, targets in lazy.items():
        units.setdefault(_unit(name), set()).update(
            _unit(t) for t in targets if _unit(t) != _unit(name))
    for targets in list(units.values()):
        for t in targets:
            units.setdefault(t, set())
    cycles = _cycles(units)
    edges = sorted(f"{name} -> {t}" for cycle in cycles for name, targets in lazy.items()
                   for t in targets if _unit(name) in cycle and _unit(t) in cycle
                   and _unit(t) != _unit(name))
    assert not cycles, f"top-level import cycles (lazy imports counted): {cycles}: {edges}"
