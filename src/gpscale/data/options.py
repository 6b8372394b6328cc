"""Declared options of the registered data sets (``--data-option KEY=VALUE``, or keywords of
:func:`gpscale.data.load_dataset`), checked before a loader runs.

Each :class:`~gpscale.data.datasets.DatasetEntry` lists its options as :class:`DataOption`
(name, kind, minimum, one line of help). :func:`check_data_options` types what a user passed
against that list: an unknown name, a value of the wrong kind or one below its minimum is a
``ValueError`` naming the option and listing the valid ones, so that ``n=-5`` or ``bogus=1``
never reaches a generator (where ``n=-5`` sliced the data into a different split, and ``bogus``
was a ``TypeError`` traceback).

Kinds: ``int`` (an integer; not a bool, not ``2.5``), ``float`` (a finite real number),
``box`` (a list of ``[low, high]`` pairs, one per input dimension, low < high) and ``interval``
(one ``[low, high]`` pair). ``n`` is accepted for ``num_train`` where a set declares it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DataOption", "check_data_options", "sizes"]

KINDS = ("int", "float", "box", "interval")


@dataclass(frozen=True)
class DataOption:
    """One data-set option.

    Attributes:
        name: the loader keyword (``num_train``).
        kind: one of :data:`KINDS`.
        help: one line for listings and errors.
        minimum: the smallest valid number (``int`` and ``float``).
        exclusive: the minimum itself is invalid (``lengthscale > 0``).
    """

    name: str
    kind: str
    help: str
    minimum: float | None = None
    exclusive: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"data option {self.name!r}: unknown kind {self.kind!r}; valid: "
                             f"{', '.join(KINDS)}")

    def type_text(self) -> str:
        if self.minimum is None:
            return {"box": "[[low, high], ...]", "interval": "[low, high]"}.get(self.kind,
                                                                                 self.kind)
        minimum = int(self.minimum) if float(self.minimum).is_integer() else self.minimum
        return f"{self.kind} {'>' if self.exclusive else '≥'} {minimum}"


def sizes(train: str = "training points", test: str = "test points") -> tuple[DataOption, ...]:
    """``num_train`` (≥ 2) and ``num_test`` (≥ 1), the options of every generated set."""
    return (DataOption("num_train", "int", train, minimum=2),
            DataOption("num_test", "int", test, minimum=1))


def check_data_options(dataset: str, declared: tuple[DataOption, ...],
                       given: Mapping[str, Any]) -> dict[str, Any]:
    """The options ``given`` for ``dataset``, typed and checked against ``declared``.

    Raises:
        ValueError: an unknown name (the message lists the valid options), ``n`` together
            with ``num_train``, or a value that does not fit its option.
    """
    table = {o.name: o for o in declared}
    if "n" in given and "num_train" in table:
        if "num_train" in given:
            raise ValueError(f"data set {dataset!r}: n and num_train are the same option; "
                             "give one of them")
        table["n"] = table["num_train"]
    unknown = [k for k in given if k not in table]
    if unknown:
        valid = "; ".join(f"{o.name} ({o.type_text()}: {o.help})" for o in declared)
        if "num_train" in table:
            valid += "; n (= num_train)"
        shown = ", ".join(repr(k) for k in unknown)
        seed = (" (the split and seed are arguments of their own: --split, --seed)"
                if {"seed", "split"} & set(unknown) else "")
        raise ValueError(f"unknown data option{'s' if len(unknown) > 1 else ''} {shown} for "
                         f"data set {dataset!r}{seed}; "
                         + (f"valid options: {valid}" if declared else "it takes no options"))
    return {table[key].name: _coerce(dataset, key, table[key], value)
            for key, value in given.items()}


def _coerce(dataset: str, key: str, option: DataOption, value: Any) -> Any:
    def bad(why: str) -> ValueError:
        return ValueError(f"data set {dataset!r}: option {key}={value!r} is invalid: {why} "
                          f"({option.name}: {option.type_text()}, {option.help})")

    if option.kind in ("int", "float"):
        number = _number(value, integer=option.kind == "int")
        if number is None:
            raise bad("expected an integer" if option.kind == "int" else
                      "expected a finite number")
        low = option.minimum
        if low is not None and (number < low or (option.exclusive and number == low)):
            raise bad(f"must be {option.type_text().split(' ', 1)[1]}")
        return number
    pairs = [value] if option.kind == "interval" else value
    if not isinstance(pairs, list | tuple) or not pairs:
        raise bad("expected " + option.type_text())
    out = []
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise bad("expected " + option.type_text())
        low, high = (_number(v, integer=False) for v in pair)
        if low is None or high is None or not low < high:
            raise bad("each pair needs finite numbers with low < high")
        out.append((low, high))
    return out[0] if option.kind == "interval" else tuple(out)


def _number(value: Any, *, integer: bool) -> int | float | None:
    """``value`` as an int (``integer``) or a finite float; ``None`` when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value) if integer else float(value)
        except ValueError:
            return None
    if integer:
        return int(value) if isinstance(value, numbers.Integral) else None
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    return None
