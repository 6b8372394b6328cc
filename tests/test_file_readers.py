"""Every reader of a file in gpscale, found from the source: none may unpickle (issue #46).

Loading a pickle runs whatever code the file names, so the only unpickling reader is
``gpscale.io._unpickle_trusted``, called by ``gpscale convert --trust`` alone. A new
``torch.load``, ``pickle.load(s)``, ``np.load(..., allow_pickle=True)``, ``weights_only=False``
or a reader of the other pickle-based libraries anywhere else fails this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "src" / "gpscale"
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "marshal",
                  "shelve", "jsonpickle"}
ALLOWED = {("io.py", "_unpickle_trusted")}  # (file, function) that may unpickle


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _unsafe(call: ast.Call) -> str | None:
    """Why ``call`` may unpickle a file, or None."""
    name = _dotted(call.func)
    keywords = {k.arg: k.value for k in call.keywords}
    if name.split(".")[0] in PICKLE_MODULES and name.split(".")[-1] in (
            "load", "loads", "Unpickler", "open"):
        return name
    if name.endswith("torch.load") or name == "load" and "weights_only" in keywords:
        return name
    allow = keywords.get("allow_pickle")
    if isinstance(allow, ast.Constant) and allow.value is True:
        return f"{name}(allow_pickle=True)"
    weights = keywords.get("weights_only")
    if isinstance(weights, ast.Constant) and weights.value is False:
        return f"{name}(weights_only=False)"
    return None


class _Finder(ast.NodeVisitor):
    """Unpickling calls with their innermost enclosing function (``<module>`` at top level)."""

    def __init__(self, file: str):
        self.file, self.stack, self.found = file, ["<module>"], []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        if why := _unsafe(node):
            self.found.append((self.file, self.stack[-1], node.lineno, why))
        self.generic_visit(node)


def _readers() -> list[tuple[str, str, int, str]]:
    """(file, enclosing function, line, call) of every unpickling call in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        finder = _Finder(str(path.relative_to(PACKAGE)))
        finder.visit(ast.parse(path.read_text()))
        found += finder.found
    return found


def test_only_the_trusted_converter_unpickles():
    readers = _readers()
    unsafe = [r for r in readers if (r[0], r[1]) not in ALLOWED]
    assert not unsafe, f"unpickling readers outside {ALLOWED}: {unsafe}"
    assert {(r[0], r[1]) for r in readers} == ALLOWED  # and the allowed one is still found


def test_the_trusted_converter_is_called_only_by_convert():
    callers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                calls = [c for c in ast.walk(node) if isinstance(c, ast.Call)
                         and _dotted(c.func).endswith("_unpickle_trusted")]
                if calls:
                    callers.append((str(path.relative_to(PACKAGE)), node.name))
    assert callers == [("io.py", "convert")]


def test_the_scan_sees_what_it_looks_for():
    """The detector itself: each unsafe form is caught, a safe one is not."""
    cases = {"pickle.loads(b)": True, "torch.load(f)": True, "np.load(f, allow_pickle=True)": True,
             "numpy.load(p, mmap_mode='r', allow_pickle=False)": False, "joblib.load(p)": True,
             "x.read(weights_only=False)": True, "json.loads(t)": False,
             "shelve.open(p)": True, "marshal.loads(b)": True}
    for source, unsafe in cases.items():
        call = ast.parse(source).body[0].value
        assert (_unsafe(call) is not None) == unsafe, source
