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

A file of the user's own (``gpscale fit --data``) takes the reading options of
:func:`gpscale.data.load_csv` instead, checked by :func:`check_file_options`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpscale.data.splits import SPLITS

__all__ = ["DataOption", "FILE_OPTIONS", "check_data_options", "check_file_options", "sizes"]

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


FILE_OPTIONS = {
    "header": "infer (default), none (the first row is data) or 0 (it is a header); text files",
    "delimiter": "the field separator, one character or 'tab' (default: sniffed); text files",
    "test_fraction": "the fraction of rows held out for testing, in (0, 1) (default 0.1)",
    "split": "random (default, seeded by --split) or last: the last test_fraction of the rows, "
             "in file order, are the test set (forecasting)",
    "dates": "an input column (name or index) of dates written YYYYMMDD, read as decimal years",
    "missing_target": "error (default) or drop: rows without a target (an empty field, NA, "
                      "NaN, null) are dropped, with a warning counting them",
    "labels": "a .npy file of one target per item of a .npy array of images (N, H, W[, C]); "
              "the target is then these labels",
}
"""The options of a data file of the user's own (``--data-option KEY=VALUE`` with ``--data``)."""


def check_file_options(path: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The reading options ``given`` for the data file ``path``, as keywords of
    :func:`gpscale.data.load_csv`.

    Raises:
        ValueError: an unknown name (the message lists :data:`FILE_OPTIONS`) or a value that
            does not fit its option.
    """
    unknown = [k for k in given if k not in FILE_OPTIONS]
    if unknown:
        valid = "; ".join(f"{k} ({why})" for k, why in FILE_OPTIONS.items())
        raise ValueError(f"unknown data option{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))} for the file {path}; valid options: "
                         f"{valid}")
    return {key: _file_option(path, key, value) for key, value in given.items()}


def _file_option(path: str, key: str, value: Any) -> Any:
    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: data option {key}={value!r} is invalid: {why} "
                          f"({key}: {FILE_OPTIONS[key]})")

    if key == "header":  # JSON has read "0" as 0 and "null" as None
        text = None if value is None else str(value).lower()
        headers = {None: None, "none": None, "null": None, "0": 0, "infer": "infer"}
        if text not in headers:
            raise bad("expected infer, none or 0")
        return headers[text]
    if key == "delimiter":
        text = "\t" if value == "tab" else value
        if not isinstance(text, str) or len(text) != 1 or text in "\r\n\"":
            raise bad("expected one character")
        return text
    if key == "split":
        if value not in SPLITS:
            raise bad(f"expected {' or '.join(SPLITS)}")
        return value
    if key == "missing_target":
        if value not in ("error", "drop"):
            raise bad("expected error or drop")
        return value
    if key == "dates":
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise bad("expected a column name or index")
        return value
    if key == "labels":
        if not isinstance(value, str) or not value.lower().endswith(".npy"):
            raise bad("expected the path of a .npy file")
        return value
    number = _number(value, integer=False)
    if number is None or not 0 < number < 1:
        raise bad("expected a number between 0 and 1")
    return number
