r"""Kernels users compose: a small grammar, parsed (never evaluated), and its GPyTorch kernels.

Grammar (whitespace is free)::

    kernel  := term ('+' term)*
    term    := factor ('*' factor)*
    factor  := NAME [ '(' arg (',' arg)* ')' ] | '(' kernel ')'
    arg     := column | column ':' [column] | ':' column | KEY '=' NUMBER
    column  := INTEGER | a header name (letters, digits, '_', '.', '-') | 'quoted name'

``NAME`` is one of :data:`LEAVES`. A leaf without columns acts on every input; ``2:`` is the
inputs from index 2 on, ``:3`` the first three, ``1:3`` inputs 1 and 2 (Python's slices).
``KEY=NUMBER`` sets a start value, in the units of the data as read: ``lengthscale`` (one
value for every input of the leaf), ``period`` (periodic), ``alpha`` (rational quadratic),
``degree`` and ``offset`` (polynomial), ``outputscale`` (the term's variance).

Every term of the sum is ``outputscale · Π factors`` with one outputscale; a parenthesised sum
inside a product is distributed (``a * (b + c)`` is ``a*b + a*c``), so the built kernel is
always a sum of scaled products of leaves. Stationary leaves (:data:`STATIONARY`) have ARD
lengthscales, one per input of their columns.

Example:
    >>> spec = parse_kernel("rbf(0, 1) * periodic(2, period=1) + matern32(3:)")
    >>> spec.text
    'rbf(0, 1) * periodic(2, period=1) + matern32(3:)'
    >>> [len(term) for term in spec.terms]
    [2, 1]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KernelSyntaxError", "KernelSpec", "Leaf", "LEAVES", "STATIONARY", "VALUE_KEYS",
           "parse_kernel"]

STATIONARY = ("rbf", "matern12", "matern32", "matern52", "rq")
"""Leaves whose value depends on x − x' only through a scaled distance (a profile)."""
LEAVES = (*STATIONARY, "periodic", "linear", "poly", "constant")
"""The names a kernel expression may use."""
VALUE_KEYS = {
    "rbf": ("lengthscale", "outputscale"), "matern12": ("lengthscale", "outputscale"),
    "matern32": ("lengthscale", "outputscale"), "matern52": ("lengthscale", "outputscale"),
    "rq": ("lengthscale", "alpha", "outputscale"),
    "periodic": ("lengthscale", "period", "outputscale"),
    "linear": ("outputscale",), "poly": ("degree", "offset", "outputscale"),
    "constant": ("outputscale",),
}
"""The start values each leaf takes."""

_TOKEN = re.compile(r"\s*(?:(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)|(?P<quoted>'[^']*'|\"[^\"]*\")"
                    r"|(?P<op>[-+*(),:=]))")


class KernelSyntaxError(ValueError):
    """A kernel expression that does not parse: one line naming the position."""


@dataclass(frozen=True)
class Leaf:
    """One kernel on some inputs.

    Attributes:
        name: one of :data:`LEAVES`.
        columns: the inputs, as written: integers, header names, or ``(start, stop)`` slices
            (either end ``None``); ``None`` for every input.
        values: start values (``lengthscale``, ``period``, ...), in the data's units.
    """

    name: str
    columns: tuple[Any, ...] | None = None
    values: dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        args = [_column_text(c) for c in self.columns or ()]
        args += [f"{k}={_number_text(v)}" for k, v in self.values.items()]
        return self.name + (f"({', '.join(args)})" if args else "")


@dataclass(frozen=True)
class KernelSpec:
    """A parsed kernel: a sum of terms, each a product of leaves."""

    terms: tuple[tuple[Leaf, ...], ...]

    @property
    def text(self) -> str:
        """The canonical text (parses to the same spec)."""
        return " + ".join(" * ".join(leaf.text for leaf in term) for term in self.terms)

    @property
    def leaves(self) -> tuple[Leaf, ...]:
        return tuple(leaf for term in self.terms for leaf in term)

    @property
    def stationary(self) -> bool:
        """Every leaf is a stationary profile (:data:`STATIONARY`)."""
        return all(leaf.name in STATIONARY for leaf in self.leaves)

    def resolve(self, num_dims: int, names: list[str] | None = None) -> list[list[list[int]]]:
        """The input indices of every leaf, per term: columns by position, names (``names``:
        the inputs' header names), slices.

        Raises:
            ValueError: an index outside 0..d−1, an unknown name, a leaf with no inputs.
        """
        return [[_indices(leaf, num_dims, names) for leaf in term] for term in self.terms]


def parse_kernel(text: str) -> KernelSpec:
    """Parse ``text`` (module grammar).

    Raises:
        KernelSyntaxError: one line: the expression, the position (1-based) and what is wrong.
    """
    if not isinstance(text, str):
        raise KernelSyntaxError(f"a kernel expression is text; got {type(text).__name__}")
    parser = _Parser(text)
    terms = parser.sum()
    if parser.peek() is not None:
        parser.fail("expected '+', '*' or the end")
    return KernelSpec(tuple(tuple(t) for t in terms))


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                start = pos + len(text[pos:]) - len(text[pos:].lstrip())
                raise KernelSyntaxError(self._where(start, f"unexpected character "
                                                           f"{text[start]!r}"))
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.i = 0

    def _where(self, pos: int, what: str) -> str:
        return f"kernel {self.text!r}, position {pos + 1}: {what}"

    def fail(self, what: str):
        pos = self.tokens[self.i][2] if self.i < len(self.tokens) else len(self.text)
        raise KernelSyntaxError(self._where(pos, what))

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, op: str | None = None) -> tuple[str, str, int]:
        token = self.peek()
        if token is None or (op is not None and token[1] != op):
            self.fail(f"expected {op!r}" if op else "unexpected end")
        self.i += 1
        return token

    def at(self, op: str) -> bool:
        token = self.peek()
        return token is not None and token[0] == "op" and token[1] == op

    def sum(self) -> list[list[Leaf]]:
        terms = self.product()
        while self.at("+"):
            self.take("+")
            terms += self.product()
        return terms

    def product(self) -> list[list[Leaf]]:
        terms = self.factor()
        while self.at("*"):
            self.take("*")
            right = self.factor()
            terms = [a + b for a in terms for b in right]  # distributes over sums
        return terms

    def factor(self) -> list[list[Leaf]]:
        token = self.peek()
        if token is None:
            self.fail(f"expected a kernel ({', '.join(LEAVES)}) or '('")
        if token[0] == "op" and token[1] == "(":
            self.take("(")
            inner = self.sum()
            self.take(")")
            return inner
        if token[0] != "name" or token[1].lower() not in LEAVES:
            self.fail(f"unknown kernel {token[1]!r}; valid: {', '.join(LEAVES)}")
        self.i += 1
        name = token[1].lower()
        columns: list[Any] = []
        values: dict[str, float] = {}
        if self.at("("):
            self.take("(")
            while True:
                self.argument(name, columns, values)
                if self.at(","):
                    self.take(",")
                    continue
                self.take(")")
                break
        return [[Leaf(name, tuple(columns) if columns else None, values)]]

    def argument(self, name: str, columns: list[Any], values: dict[str, float]) -> None:
        token = self.peek()
        following = self.tokens[self.i + 1] if self.i + 1 < len(self.tokens) else None
        if token is not None and token[0] == "name" and following is not None \
                and following[1] == "=":
            key = token[1].lower()
            if key not in VALUE_KEYS[name]:
                self.fail(f"{name} takes no {key!r}; it takes "
                          f"{', '.join(VALUE_KEYS[name]) or 'no values'}")
            self.i += 2
            number = self.take()
            if number[0] != "number":
                self.fail(f"expected a number for {key}")
            value = float(number[1])
            if not math.isfinite(value) or (key != "offset" and value <= 0):
                self.i -= 1
                self.fail(f"{key} must be a positive number; got {number[1]}")
            if key == "degree" and value != int(value):
                self.i -= 1
                self.fail(f"degree must be a whole number; got {number[1]}")
            values[key] = value
            return
        if self.at(":"):
            self.take(":")
            columns.append((None, self.column()))
            return
        start = self.column()
        if self.at(":"):
            self.take(":")
            stop = None if (self.at(",") or self.at(")")) else self.column()
            columns.append((start, stop))
        else:
            columns.append(start)

    def column(self) -> int | str:
        token = self.take()
        if token[0] == "number":
            if not re.fullmatch(r"[-+]?\d+", token[1]):
                self.i -= 1
                self.fail(f"a column index is a whole number; got {token[1]}")
            return int(token[1])
        if token[0] == "quoted":
            return token[1][1:-1]
        if token[0] == "name":
            return token[1]
        self.i -= 1
        self.fail("expected a column (an index, a name or a slice like 2:)")
        raise AssertionError  # fail raises


def _indices(leaf: Leaf, num_dims: int, names: list[str] | None) -> list[int]:
    if leaf.columns is None:
        return list(range(num_dims))

    def one(ref: Any) -> int:
        if isinstance(ref, int):
            index = ref + num_dims if ref < 0 else ref
            if not 0 <= index < num_dims:
                raise ValueError(f"kernel {leaf.text}: input {ref} is outside 0..{num_dims - 1}")
            return index
        if names is None or ref not in names:
            known = f" (inputs: {', '.join(names)})" if names else " (the data has no header)"
            raise ValueError(f"kernel {leaf.text}: no input named {ref!r}{known}")
        return names.index(ref)

    out: list[int] = []
    for ref in leaf.columns:
        if isinstance(ref, tuple):
            start = 0 if ref[0] is None else one(ref[0])
            stop = num_dims if ref[1] is None else (one(ref[1]) if not isinstance(ref[1], int)
                                                    or ref[1] < num_dims else num_dims)
            out.extend(range(start, stop))
        else:
            out.append(one(ref))
    if not out:
        raise ValueError(f"kernel {leaf.text}: no inputs selected")
    if len(set(out)) != len(out):
        raise ValueError(f"kernel {leaf.text}: an input is named twice")
    return out


def _column_text(ref: Any) -> str:
    if isinstance(ref, tuple):
        start = "" if ref[0] is None else _column_text(ref[0])
        stop = "" if ref[1] is None else _column_text(ref[1])
        return f"{start}:{stop}"
    if isinstance(ref, int) or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", ref):
        return str(ref)
    return f"'{ref}'"


def _number_text(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)
