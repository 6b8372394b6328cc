"""Load any delimited text file (optionally gzipped) as a :class:`Dataset`.

The target is chosen by column name (when the file has a header row) or by integer index; every
other column is an input and must be numeric. Rows are split at random (seeded) and standardised
with training statistics only, exactly like the UCI sets: x always, y only for regression. Class
labels (any strings or numbers) are mapped to 0..C-1 in sorted order (numeric order when all
labels are numbers); the original labels are kept in ``info["classes"]``.

Reading (:func:`read_table`, shared with ``gpscale predict``) fails with a ``ValueError`` naming
the file, the line and the column for anything it cannot read correctly: not UTF-8 text, a bad
gzip stream, rows of different widths, duplicate header names, a header without data rows, empty
or non-numeric inputs, and NaN or inf in inputs or targets. The delimiter is sniffed unless given:
tab, semicolon, comma or ``|``, the first that splits the first lines into equally many fields.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpscale.data.datasets import TASKS, Dataset, standardized_dataset
from gpscale.data.splits import random_split

__all__ = ["load_csv", "read_table", "Table", "numeric_columns"]

_SNIFFED = ("\t", ";", ",", "|")  # in order of preference when several split consistently
_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "'|'"}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Table:
    """A delimited text file as text fields.

    Attributes:
        names: the header row, or ``None`` when the file has none.
        rows: the data rows (surrounding spaces stripped, blank rows dropped), all one width.
        lines: the file line number (1-based) of each data row, for error messages.
        delimiter: the field separator used.
    """

    names: list[str] | None
    rows: list[list[str]]
    lines: list[int]
    delimiter: str

    @property
    def width(self) -> int:
        return len(self.names) if self.names is not None else len(self.rows[0])


def read_table(path: str | Path, *, delimiter: str | None = None,
               header: str | int | None = "infer") -> Table:
    """Read a delimited text file (``.gz`` is decompressed) into a :class:`Table`.

    Args:
        path: the file.
        delimiter: field separator; ``None`` sniffs it (see the module docstring).
        header: ``"infer"`` (a first row with text above numbers is a header), ``None`` or ``0``.

    Raises:
        OSError: the file cannot be opened.
        ValueError: not UTF-8 text or not gzip, no rows, no data rows, rows of different
            widths, duplicate header names, or a delimiter that does not split the file.
    """
    if header not in ("infer", None, 0):
        raise ValueError(f"header must be 'infer', None or 0; got {header!r}")
    path = Path(path)
    text = _read_text(path)
    sep = _sniff(text) if delimiter is None else delimiter
    rows, lines = _split(path, text, sep)
    if not rows:
        raise ValueError(f"{path} is empty (no rows)")
    width = len(rows[0])
    for row, line in zip(rows, lines, strict=True):
        if len(row) != width:
            raise ValueError(f"{path}: line {line} has {len(row)} fields, line {lines[0]} has "
                             f"{width} ({_NAMES.get(sep, repr(sep))}-separated)")
    if width == 1 and delimiter is not None:
        other = _sniff(text)
        if other != delimiter and len(rows[0][0].split(other)) > 1:
            raise ValueError(f"{path}: no {_NAMES.get(delimiter, repr(delimiter))} in the "
                             f"rows; the file looks {_NAMES[other]}-separated (pass that "
                             "delimiter)")
    names = None
    if header == 0 or (header == "infer" and _has_header(rows)):
        names, rows, lines = rows[0], rows[1:], lines[1:]
        _check_names(path, names)
        if not rows:
            raise ValueError(f"{path} has a header row but no data rows")
    return Table(names, rows, lines, sep)


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    if path.suffix == ".gz" or raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(f"{path} is not a readable gzip file ({err})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"{path} is not UTF-8 text (byte {err.object[err.start]:#04x} on line "
                         f"{line}); save it as UTF-8 CSV") from None


def _sniff(text: str) -> str:
    """The first of tab, ';', ',', '|' that splits the first 50 lines into equal widths > 1."""
    head = text[:1 << 16].splitlines()
    if len(text) > 1 << 16:
        head = head[:-1]  # the last line may be cut short
    sample = [line for line in head[:50] if line.strip()]
    for sep in _SNIFFED:
        try:
            widths = {len(row) for row in csv.reader(sample, delimiter=sep)}
        except csv.Error:
            continue
        if len(widths) == 1 and widths.pop() > 1:
            return sep
    return ","


def _split(path: Path, text: str, delimiter: str) -> tuple[list[list[str]], list[int]]:
    if len(delimiter) != 1 or delimiter in "\r\n\"":
        raise ValueError(f"delimiter must be one character other than a quote or newline; "
                         f"got {delimiter!r}")
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows, lines = [], []
    try:
        for row in reader:
            row = [field.strip() for field in row]
            if any(row):
                rows.append(row)
                lines.append(reader.line_num)
    except csv.Error as err:
        raise ValueError(f"{path}: line {reader.line_num + 1}: {err}") from None
    return rows, lines


def _check_names(path: Path, names: list[str]) -> None:
    seen: dict[str, list[int]] = {}
    for j, name in enumerate(names):
        seen.setdefault(name, []).append(j + 1)
    dups = {name: cols for name, cols in seen.items() if len(cols) > 1}
    if dups:
        shown = "; ".join(f"{name!r} (columns {', '.join(map(str, cols))})"
                          for name, cols in dups.items())
        raise ValueError(f"{path}: duplicate column names in the header: {shown}; rename them "
                         "so that every column has its own name")


def numeric_columns(path: str | Path, table: Table, columns: list[int]) -> np.ndarray:
    """The given columns of ``table`` as a float64 array (rows, len(columns)).

    Raises:
        ValueError: naming the line and column of the first empty or non-numeric field, or the
            lines (first five) and columns holding NaN or inf.
    """
    names = table.names or [f"column {j}" for j in range(table.width)]
    try:
        out = np.array([[float(row[j]) for j in columns] for row in table.rows],
                       dtype=np.float64).reshape(len(table.rows), len(columns))
    except ValueError:  # find the first field that is not a number
        for i, row in enumerate(table.rows):
            for j in columns:
                if not _is_number(row[j]):
                    raise ValueError(f"{path}: line {table.lines[i]}, {_col(names, j)}: "
                                     f"{_why(row[j])}; input columns must be numeric") from None
        raise
    bad = ~np.isfinite(out)
    if bad.any():
        rows, cols = np.flatnonzero(bad.any(1)), np.flatnonzero(bad.any(0))
        shown = ", ".join(_col(names, columns[k]) for k in cols)
        raise ValueError(f"{path}: {shown} hold{'s' if len(cols) == 1 else ''} NaN or inf on "
                         f"{_lines(table, rows)}; remove or impute those rows")
    return out


def _col(names: list[str], j: int) -> str:
    return names[j] if names[j].startswith("column ") else f"column {names[j]!r}"


def _why(value: str) -> str:
    if not value:
        return "empty value (a missing value? remove or impute it)"
    if re.fullmatch(r"[-+]?\d*,\d+", value):
        return (f"{value!r} is not a number (a decimal comma? gpscale reads '.' as the "
                "decimal point)")
    return f"{value!r} is not a number"


def _lines(table: Table, rows: np.ndarray | list[int]) -> str:
    shown = ", ".join(str(table.lines[int(i)]) for i in rows[:5])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return f"line{'s' if len(rows) > 1 else ''} {shown}{more}"


def _has_header(rows: list[list[str]]) -> bool:
    """A first row is a header when some column is numeric below it but not in it."""
    below = rows[1:6]
    if not below:
        return not all(_is_number(v) for v in rows[0])
    return any(not _is_number(rows[0][j]) and all(_is_number(r[j]) for r in below)
               for j in range(len(rows[0])))


def _target_index(target: str | int, names: list[str] | None, width: int) -> int:
    if isinstance(target, str) and (names is None or target not in names):
        if re.fullmatch(r"-?[0-9]+", target):
            target = int(target)
        elif names is None:
            raise ValueError(f"target {target!r} is a column name, but the file has no header "
                             "row; pass an integer column index (0-based, -1 = last)")
        else:
            raise ValueError(f"target column {target!r} not found; columns: {', '.join(names)}")
    if isinstance(target, str):
        return names.index(target)
    if not -width <= target < width:
        raise ValueError(f"target column index {target} is out of range for {width} columns "
                         f"(valid: {-width}..{width - 1})")
    return target % width


def _targets(path: Path, table: Table, col: int,
             task: str) -> tuple[torch.Tensor, list[str] | None]:
    values = [row[col] for row in table.rows]
    name = f"target column {table.names[col]!r}" if table.names else f"target column {col}"
    if task == "classification":
        classes = sorted(set(values), key=(lambda v: (float(v), v)) if all(
            _is_number(v) for v in values) else None)
        if len(classes) < 2:
            raise ValueError(f"classification needs at least 2 classes; found {classes}")
        code = {label: c for c, label in enumerate(classes)}
        return torch.tensor([code[v] for v in values], dtype=torch.long), classes
    bad = next((i for i, v in enumerate(values) if not _is_number(v)), None)
    if bad is not None:
        raise ValueError(f"{path}: line {table.lines[bad]}, {name}: {_why(values[bad])}; use "
                         "task='classification' (--task classification) for class labels")
    y = torch.tensor([float(v) for v in values], dtype=torch.float64)
    nonfinite = torch.nonzero(~torch.isfinite(y)).flatten().tolist()
    if nonfinite:
        raise ValueError(f"{path}: the {name} holds NaN or inf on {_lines(table, nonfinite)}; "
                         "remove or impute those rows")
    if task == "counts" and bool(((y < 0) | (y != y.round())).any()):
        first = int(torch.nonzero((y < 0) | (y != y.round()))[0])
        raise ValueError(f"{path}: counts must be non-negative integers; the {name} holds "
                         f"{values[first]!r} on line {table.lines[first]}")
    return y, None


def load_csv(path: str | Path, target: str | int, *, task: str = "regression",
             test_fraction: float = 0.1, seed: int = 0, header: str | int | None = "infer",
             delimiter: str | None = None, dtype: torch.dtype = torch.float64) -> Dataset:
    """Load a CSV file with a random train/test split.

    Args:
        path: the file (``.gz`` is decompressed).
        target: column name (needs a header row) or integer index (negative counts from the
            end); a string of digits is read as an index when no column has that name.
        task: ``"regression"``, ``"classification"`` or ``"counts"``.
        test_fraction: fraction of rows in the test set.
        seed: seed of the random split.
        header: ``"infer"`` (a first row with text above numbers is a header), ``None`` (no
            header) or ``0`` (the first row is a header).
        delimiter: field separator; ``None`` sniffs it (tab, ';', ',' or '|').
        dtype: floating dtype of x (and of y for regression and counts).

    Returns:
        The :class:`Dataset`; ``info`` holds the source, target and input column names
        (``header`` says whether they come from a header row; else they are indices), the
        target's column index, seed and, for classification, the original labels in
        ``info["classes"]``.

    Raises:
        ValueError: unknown task, unreadable file (see :func:`read_table`), missing or duplicate
            target column, fewer than 2 data rows, empty or non-numeric inputs, NaN or inf in
            inputs or targets, bad labels.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")
    if not isinstance(target, str | int) or isinstance(target, bool):
        raise ValueError(f"target must be a column name or an integer index; got {target!r}")
    path = Path(path)
    table = read_table(path, delimiter=delimiter, header=header)
    names, width = table.names, table.width
    if len(table.rows) < 2:
        raise ValueError(f"{path} has {len(table.rows)} data row; at least 2 are needed to "
                         "split")
    if width < 2:
        raise ValueError(f"{path} has a single column ({_NAMES.get(table.delimiter)}-"
                         "separated); it needs the target and at least one input column")
    col = _target_index(target, names, width)
    inputs = [j for j in range(width) if j != col]
    labels = names or [str(j) for j in range(width)]
    x = numeric_columns(path, table, inputs)
    y, classes = _targets(path, table, col, task)
    train_idx, test_idx = random_split(len(table.rows), test_fraction, seed)
    if train_idx.numel() < 2:
        raise ValueError(f"{path} has {len(table.rows)} data rows: too few for at least 2 "
                         f"training rows and 1 test row (test_fraction {test_fraction:g})")
    info: dict[str, Any] = {"source": str(path), "target": labels[col],
                            "columns": [labels[j] for j in inputs], "seed": seed,
                            "test_fraction": test_fraction, "header": names is not None,
                            "target_index": col, "num_columns": width}
    if classes is not None:
        info["classes"] = classes
    return standardized_dataset(path.name.split(".")[0], torch.from_numpy(x), y, train_idx,
                                test_idx, task=task,
                                num_classes=len(classes) if classes else None, dtype=dtype,
                                info=info)
