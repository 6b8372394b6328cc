"""The line-by-line reader of delimited text: Python's :mod:`csv` module, one row at a time.

This is the reference reader. :func:`gpscale.data.csv.read_table` reads text files column-wise
with pyarrow (:mod:`gpscale.data.readers`) and comes here whenever pyarrow cannot read a file,
and for the message of every error it finds: this reader names the line and the column of the
problem, and its verdict on a file is the one that counts.

It fails with a ``ValueError`` naming the file, the line and the column for anything it cannot
read correctly: not UTF-8 text, a bad gzip stream, rows of different widths, duplicate header
names, a header without data rows, empty or non-numeric inputs, and NaN or inf in inputs or
targets. The delimiter is sniffed unless given: tab, semicolon, comma or ``|``, the first that
splits the first lines into equally many fields. Whether the first row is a header follows
the rules of :mod:`gpscale.data.head` (the table's ``header_note`` says why when that is not
plain), and a file of decimal commas (``1,5``) is refused with a message that says so.

Class labels are compared as values when every label is a number: ``1``, ``1.0`` and ``1e0``
are one class, named ``"1"`` (:func:`canonical_labels`); otherwise as text.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
import zlib
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
import torch

from gpscale.data.head import decide_header, decimal_comma, decimal_comma_message, is_number
from gpscale.limits import check_fits
from gpscale.regular_files import read_regular

__all__ = ["Table", "canonical_labels", "read_lines", "sort_labels", "target_index"]

_SNIFFED = ("\t", ";", ",", "|")  # in order of preference when several split consistently
_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "'|'"}


MISSING = ("", "na", "n/a", "nan", "null")
"""Field text (lower case, stripped) read as a missing target when rows without one are dropped."""

DROP_HINT = "missing_target='drop' (gpscale fit: --data-option missing_target=drop)"


class Table:
    """A data file in memory: a delimited text file as text fields (this class), or a file read
    column-wise (the subclasses in :mod:`gpscale.data.readers`).

    Attributes:
        names: the header row (the column names), or ``None`` when the file has none.
        rows: the data rows (surrounding spaces stripped, blank rows dropped), all one width.
        lines: the file line number (1-based) of each data row, for error messages.
        delimiter: the field separator used (``None`` for Parquet and ``.npy`` files).
        header_note: why the first row is or is not a header, when the evidence is not plain
            (:func:`gpscale.data.head.infer_header`); ``""`` otherwise.
    """

    header_note = ""

    def __init__(self, names: list[str] | None, rows: list[list[str]], lines: list[int],
                 delimiter: str | None, header_note: str = "") -> None:
        self.names = names
        self.rows = rows
        self.lines = lines
        self.delimiter = delimiter
        self.header_note = header_note

    def first_row(self) -> list[str] | None:
        """The first data row as text (cheap: for predict's check that it is not the model's
        header), or ``None`` where a file has no text rows."""
        return self.rows[0] if self.rows else None

    def locator(self) -> Callable[[list[int]], str]:
        """A function naming data rows (0-based) by their file lines, the first five (``"lines
        4, 9"``), for messages; it holds the line numbers only, not the data."""
        lines = self.lines
        return lambda rows: _line_text(lines, rows)

    @property
    def width(self) -> int:
        return len(self.names) if self.names is not None else len(self.rows[0])

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def numeric(self, path: str | Path, columns: list[int]) -> np.ndarray:
        """The given columns as a float64 array (rows, len(columns)).

        Raises:
            ValueError: naming the line and column of the first empty or non-numeric field, or
                the lines (first five) and columns holding NaN or inf.
        """
        names = self.names or [f"column {j}" for j in range(self.width)]
        try:
            out = np.array([[float(row[j]) for j in columns] for row in self.rows],
                           dtype=np.float64).reshape(len(self.rows), len(columns))
        except ValueError:  # find the first field that is not a number
            for i, row in enumerate(self.rows):
                for j in columns:
                    if not is_number(row[j]):
                        raise ValueError(f"{path}: line {self.lines[i]}, {_col(names, j)}: "
                                         f"{_why(row[j])}; input columns must be "
                                         "numeric") from None
            raise
        bad = ~np.isfinite(out)
        if bad.any():
            rows, cols = np.flatnonzero(bad.any(1)), np.flatnonzero(bad.any(0))
            shown = ", ".join(_col(names, columns[k]) for k in cols)
            raise ValueError(f"{path}: {shown} hold{'s' if len(cols) == 1 else ''} NaN or inf "
                             f"on {_lines(self, rows)}; remove or impute those rows")
        return out

    def target_values(self, path: str | Path, col: int) -> np.ndarray:
        """Column ``col`` as float64 numbers with NaN where the field is missing (empty, ``NA``,
        ``NaN`` or ``null``): the targets of a file whose rows without one are dropped.

        Raises:
            ValueError: a field that is neither a number nor missing, naming its line.
        """
        name = f"target column {self.names[col]!r}" if self.names else f"target column {col}"
        out = np.empty(len(self.rows), dtype=np.float64)
        for i, row in enumerate(self.rows):
            value = row[col]
            if value.strip().lower() in MISSING:
                out[i] = np.nan
            elif is_number(value):
                out[i] = float(value)
            else:
                raise ValueError(f"{path}: line {self.lines[i]}, {name}: {_why(value)}")
        return out

    def targets(self, path: str | Path, col: int,
                task: str) -> tuple[torch.Tensor, list[str] | None]:
        """Column ``col`` as targets: class codes 0..C-1 and the sorted labels (classification),
        else float64 values and ``None``.

        Raises:
            ValueError: fewer than 2 classes, a non-numeric, NaN or inf target, a count that is
                not a non-negative integer; naming the line.
        """
        values = [row[col] for row in self.rows]
        name = f"target column {self.names[col]!r}" if self.names else f"target column {col}"
        if task == "classification":
            canon = canonical_labels(values)
            bad = [i for i, v in enumerate(values) if canon[v] is None]
            if bad:
                raise ValueError(f"{path}: the {name} holds NaN or inf on {_lines(self, bad)}; "
                                 "remove or impute those rows")
            classes = sort_labels(set(canon.values()))
            code = {label: c for c, label in enumerate(classes)}
            return torch.tensor([code[canon[v]] for v in values], dtype=torch.long), classes
        bad = next((i for i, v in enumerate(values) if not is_number(v)), None)
        if bad is not None:
            hint = (f"; to drop the rows without a target: {DROP_HINT}"
                    if values[bad].strip().lower() in MISSING
                    else "; use task='classification' (--task classification) for class labels")
            raise ValueError(f"{path}: line {self.lines[bad]}, {name}: {_why(values[bad])}{hint}")
        y = torch.tensor([float(v) for v in values], dtype=torch.float64)
        nonfinite = torch.nonzero(~torch.isfinite(y)).flatten().tolist()
        if nonfinite:
            raise ValueError(f"{path}: the {name} holds NaN or inf on "
                             f"{_lines(self, nonfinite)}; remove or impute those rows")
        if task == "counts" and bool(((y < 0) | (y != y.round())).any()):
            first = int(torch.nonzero((y < 0) | (y != y.round()))[0])
            raise ValueError(f"{path}: counts must be non-negative integers; the {name} holds "
                             f"{values[first]!r} on line {self.lines[first]}")
        return y, None


def canonical_labels(labels: Iterable[str]) -> dict[str, str | None]:
    """Each distinct label's class name. When every label is a number, labels are compared by
    value and named canonically (:func:`number_label`: ``"1"`` for ``1``, ``1.0``, ``+1``,
    ``1e0``), and NaN or inf map to ``None`` (not a class); else the labels are their own
    names (compared as text)."""
    distinct = set(labels)
    if not all(is_number(v) for v in distinct):
        return {v: v for v in distinct}
    return {v: number_label(v) for v in distinct}


def number_label(text: str) -> str | None:
    """The class name of a numeric label: the integer's digits when the value is an integer
    (exactly, from the text: ``"1.0"`` → ``"1"``, no rounding of large integers), else the
    shortest repr of the float64 value (``"0.50"`` → ``"0.5"``); ``None`` for NaN or inf."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:  # float() reads it, Decimal does not: compare as float64
        value = None
    if value is None or value.adjusted() > 300:
        number = float(text)
        if not math.isfinite(number):
            return None
        return str(int(number)) if number.is_integer() else repr(number)
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    number = float(value)
    return repr(number) if math.isfinite(number) else None


def sort_labels(labels: set[str]) -> list[str]:
    """Class labels in sorted order: numeric order when all are numbers, else string order.

    Raises:
        ValueError: fewer than 2 labels.
    """
    classes = sorted(labels, key=(lambda v: (float(v), v)) if all(
        is_number(v) for v in labels) else None)
    if len(classes) < 2:
        raise ValueError(f"classification needs at least 2 classes; found {classes}")
    return classes


def read_lines(path: str | Path, *, delimiter: str | None = None,
               header: str | int | None = "infer") -> Table:
    """Read a delimited text file (``.gz`` is decompressed) line by line into a :class:`Table`.

    Args:
        path: the file.
        delimiter: field separator; ``None`` sniffs it (see the module docstring).
        header: ``"infer"`` (the rules of :mod:`gpscale.data.head`), ``None`` or ``0``.

    Raises:
        OSError: the file cannot be opened.
        ValueError: not a regular file (a folder, named pipe or device), not UTF-8 text or
            not gzip, no rows, no data rows, rows of different
            widths, duplicate header names, a delimiter that does not split the file, or
            decimal commas.
    """
    check_header(header)
    path = Path(path)
    text = _read_text(path)
    sep = sniff(text) if delimiter is None else delimiter
    rows, lines = split(path, text, sep)
    if not rows:
        raise ValueError(f"{path} is empty (no rows)")
    width = len(rows[0])
    for row, line in zip(rows, lines, strict=True):
        if len(row) != width:
            raise ValueError(f"{path}: line {line} has {len(row)} fields, line {lines[0]} has "
                             f"{width} ({_NAMES.get(sep, repr(sep))}-separated)")
    if width == 1 and delimiter is not None:
        other = sniff(text)
        if other != delimiter and len(rows[0][0].split(other)) > 1:
            raise ValueError(f"{path}: no {_NAMES.get(delimiter, repr(delimiter))} in the "
                             f"rows; the file looks {_NAMES[other]}-separated (pass that "
                             "delimiter)")
    comma = decimal_comma(rows)
    if comma is not None:
        raise ValueError(decimal_comma_message(path, rows, lines, comma))
    names = None
    is_header, note = decide_header(text, sep, rows, lines, header)
    if is_header:
        names, rows, lines = rows[0], rows[1:], lines[1:]
        check_names(path, names)
        if not rows:
            raise ValueError(f"{path} has a header row but no data rows")
    return Table(names, rows, lines, sep, note)


def check_header(header: str | int | None) -> None:
    if header not in ("infer", None, 0):
        raise ValueError(f"header must be 'infer', None or 0; got {header!r}")


def is_gzip(path: Path, first: bytes) -> bool:
    """Whether the file is read as gzip: a ``.gz`` name or gzip's magic bytes."""
    return path.suffix == ".gz" or first[:2] == b"\x1f\x8b"


def _read_text(path: Path) -> str:
    raw = read_regular(path)  # a named pipe or a device is refused, not read
    if is_gzip(path, raw):
        try:
            raw = _gunzip(path, raw)
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(f"{path} is not a readable gzip file ({err})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"{path} is not UTF-8 text (byte {err.object[err.start]:#04x} on line "
                         f"{line}); save it as UTF-8 CSV") from None


TEXT_ROW_COST = 12
"""Bytes of memory one byte of text takes once split into rows of Python strings (a generous
figure), for the check while a gzip file is decompressed."""
GUNZIP_CHUNK = 1 << 24


def _gunzip(path: Path, raw: bytes) -> bytes:
    """``raw`` decompressed, a chunk at a time, refused (:class:`~gpscale.limits.TooLargeError`)
    as soon as its rows would not fit in the memory free: a few kilobytes of gzip can expand a
    thousandfold."""
    parts, total = [], 0
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
        while chunk := stream.read(GUNZIP_CHUNK):
            total += len(chunk)
            check_fits(path, TEXT_ROW_COST * total,
                       f"more than {total:,} bytes of decompressed text, as rows,")
            parts.append(chunk)
    return b"".join(parts)


def sniff(text: str) -> str:
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


def check_delimiter(delimiter: str) -> None:
    if len(delimiter) != 1 or delimiter in "\r\n\"":
        raise ValueError(f"delimiter must be one character other than a quote or newline; "
                         f"got {delimiter!r}")


def split(path: Path, text: str, delimiter: str) -> tuple[list[list[str]], list[int]]:
    """The non-blank rows of ``text`` (fields stripped) and the line on which each ends."""
    check_delimiter(delimiter)
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


def check_names(path: Path, names: list[str]) -> None:
    seen: dict[str, list[int]] = {}
    for j, name in enumerate(names):
        seen.setdefault(name, []).append(j + 1)
    dups = {name: cols for name, cols in seen.items() if len(cols) > 1}
    if dups:
        shown = "; ".join(f"{name!r} (columns {', '.join(map(str, cols))})"
                          for name, cols in dups.items())
        raise ValueError(f"{path}: duplicate column names in the header: {shown}; rename them "
                         "so that every column has its own name")


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
    return _line_text(table.lines, rows)


def _line_text(lines: list[int], rows: np.ndarray | list[int]) -> str:
    shown = ", ".join(str(lines[int(i)]) for i in rows[:5])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return f"line{'s' if len(rows) > 1 else ''} {shown}{more}"


def target_index(target: str | int, names: list[str] | None, width: int,
                 header_note: str = "") -> int:
    """The column of ``target``: a header name, an index (negative counts from the end), or a
    string of digits read as an index when no column has that name.

    Args:
        header_note: why the file has no header row, for the error when a name is given.

    Raises:
        ValueError: an unknown name, a name without a header row, an index out of range.
    """
    if isinstance(target, str) and (names is None or target not in names):
        if re.fullmatch(r"-?[0-9]+", target):
            target = int(target)
        elif names is None:
            why = f": {header_note}" if header_note else ""
            raise ValueError(f"target {target!r} is a column name, but the file has no header "
                             f"row{why}; pass an integer column index (0-based, -1 = last)")
        else:
            raise ValueError(f"target column {target!r} not found; columns: {', '.join(names)}")
    if isinstance(target, str):
        return names.index(target)
    if not -width <= target < width:
        raise ValueError(f"target column index {target} is out of range for {width} columns "
                         f"(valid: {-width}..{width - 1})")
    return target % width
