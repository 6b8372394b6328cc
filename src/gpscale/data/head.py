"""What the first rows of a delimited text file say about it: a header row or not, and decimal
commas.

Both text readers (line by line, :mod:`gpscale.data.lines`, and pyarrow,
:mod:`gpscale.data.csv_arrow`) decide on the same sample, the first row and up to
:data:`ROWS_BELOW` rows below it, with :func:`infer_header`. The evidence that the first row
is a header, strongest first:

1. **Text above numbers.** Some column holds text in the first row and a number in every row
   below it (``a,b,y`` above ``0.5,1,2``). This is the usual case and is not reported.
2. **Quoted above unquoted.** Writers that quote some cells quote text, not numbers (R's
   ``write.csv``, pandas and Python's ``csv`` with ``QUOTE_NONNUMERIC``): a first-row cell in
   quotes above unquoted numbers is a name even when it reads as a number (``"10","20"`` above
   ``0.5,1.5``). A writer that quotes every cell gives no evidence.
3. **Integers above decimals.** Numeric column names are integers (years, wavelengths, feature
   numbers: ``10,20,30``), while a continuous column is written with a decimal point or an
   exponent. A first row of distinct integers is a header when at least two columns hold only
   decimals below it and every other column only integers (counts or labels: no evidence
   either way). One such column is not enough, since a first data row at a grid's origin
   looks the same (``0,3`` above ``0.01,5``); and a column that mixes integers and decimals
   below (numbers printed with ``%g``), or any other cell in the first row, means data.

Otherwise the first row is data. Rules 2 and 3 read how the numbers are written, not their
values, so they can be wrong: the reader logs a warning naming the row and the evidence when
either makes a header, and an INFO line when a first row of numbers is read as data (with the
reason in the error when a target is then named but there is no header). A header with a name
that is not a number, or ``header=0`` / ``header=None``, leaves no doubt.

Decimal commas (``1,5`` for 1.5, as spreadsheets in many locales write) are not read:
:func:`decimal_comma` finds a column of such numbers in the sample, and the readers refuse the
file with a message that says so, rather than reading the column as text.
"""

from __future__ import annotations

import csv
import io
import itertools
import re

__all__ = ["ROWS_BELOW", "decide_header", "decimal_comma", "decimal_comma_message",
           "infer_header", "is_number", "quoted_cells"]

ROWS_BELOW = 5
"""Rows below the first that the header rules look at (the pyarrow reader's sample holds at
least this many plus one to spare)."""

_HEAD_CHARS = 1 << 20  # the text searched for the physical lines of the sample
_INTEGER = re.compile(r"[-+]?\d+")
_DECIMAL = re.compile(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?")
_COMMA_NUMBER = re.compile(r"[-+]?(\d{1,3}(\.\d{3})+|\d*),\d+([eE][-+]?\d+)?")


def is_number(text: str) -> bool:
    """Whether ``float`` reads ``text`` (``nan``, ``inf`` and ``1e5`` included)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _kind(cell: str) -> str:
    """``"int"`` (``12``), ``"decimal"`` (``1.5``, ``2e3``, ``3.``), else ``"other"``."""
    if _INTEGER.fullmatch(cell):
        return "int"
    return "decimal" if _DECIMAL.fullmatch(cell) else "other"


def _shown(row: list[str], limit: int = 6) -> str:
    return ", ".join(row[:limit]) + (", ..." if len(row) > limit else "")


def infer_header(rows: list[list[str]], quoted: list[list[bool]] | None = None
                 ) -> tuple[bool, str]:
    """Whether ``rows[0]`` is a header (rules in the module docstring), and a note saying why
    when that is not plain.

    Args:
        rows: the first rows of the file (stripped fields, one width); rows past
            ``1 + ROWS_BELOW`` are not looked at.
        quoted: for the same rows, whether each cell was written in quotes
            (:func:`quoted_cells`); ``None`` when unknown.

    Returns:
        ``(is_header, note)``: the note is ``""`` for rule 1, else one sentence for a log line
        or an error message.
    """
    first, below = rows[0], rows[1:1 + ROWS_BELOW]
    numeric = [is_number(v) for v in first]
    if not below:
        return not all(numeric), ("" if not all(numeric) else
                                  f"the only row ({_shown(first)}) holds only numbers")
    width = range(len(first))
    if any(not numeric[j] and all(is_number(r[j]) for r in below) for j in width):
        return True, ""
    if not all(numeric):
        return False, ("no column has a name in the first row above numbers in the "
                       f"{len(below)} rows below it")
    if quoted is not None and len(quoted) > len(below):
        if any(quoted[0][j] and not any(q[j] for q in quoted[1:1 + len(below)]) for j in width):
            return True, (f"the first row ({_shown(first)}) is read as a header: its cells are "
                          "quoted above unquoted numbers")
    kinds = [{_kind(r[j]) for r in below} for j in width]
    decimal = sum(k == {"decimal"} for k in kinds)
    if (all(_kind(v) == "int" for v in first) and len(set(first)) == len(first)
            and all(k in ({"decimal"}, {"int"}) for k in kinds) and decimal >= 2):
        return True, (f"the first row ({_shown(first)}) is read as a header: its cells are "
                      f"distinct integers above {decimal} columns of decimal numbers")
    return False, f"the first row ({_shown(first)}) holds only numbers, so it is read as data"


def decide_header(text: str, delimiter: str, rows: list[list[str]],
                  lines: list[int], header: int | str | None = "infer") -> tuple[bool, str]:
    """Whether the first of ``rows`` is a header, and why: ``header`` 0 (yes) or ``None``
    (no) as given, else :func:`infer_header` on the sample of ``rows``, with the quotes of
    ``text`` looked up when they can matter (a first row of numbers only)."""
    if header != "infer":
        return header == 0, ""
    sample = rows[:1 + ROWS_BELOW]
    quoted = None
    if all(is_number(v) for v in sample[0]) and len(sample) > 1:
        quoted = quoted_cells(text, delimiter, sample, lines[:len(sample)])
    return infer_header(sample, quoted)


def quoted_cells(text: str, delimiter: str, rows: list[list[str]],
                 lines: list[int]) -> list[list[bool]] | None:
    """Whether each cell of ``rows`` is written in quotes in ``text``; ``None`` when unsure.

    Args:
        text: the file's text (only its first MiB is looked at).
        delimiter: the field separator.
        rows: the parsed rows (stripped fields) to look up.
        lines: the line (1-based, as :func:`gpscale.data.lines.split` counts) on which each row
            ends.

    A row that spans several lines (a quoted newline), or whose raw cells do not match the
    parsed ones, gives ``None``: the quotes are then no evidence.
    """
    if not rows:
        return None
    physical = list(itertools.islice(io.StringIO(text[:_HEAD_CHARS], newline=""), lines[-1]))
    if len(physical) < lines[-1]:
        return None
    out = []
    for row, line in zip(rows, lines, strict=True):
        try:
            raw = next(csv.reader([physical[line - 1]], delimiter=delimiter,
                                  quoting=csv.QUOTE_NONE), [])
        except csv.Error:
            return None
        raw = [field.strip() for field in raw]
        if len(raw) != len(row):
            return None
        flags = [len(f) >= 2 and f[0] == f[-1] == '"' for f in raw]
        plain = [f[1:-1].replace('""', '"').strip() if q else f for f, q in zip(raw, flags,
                                                                                  strict=True)]
        if plain != row:
            return None
        out.append(flags)
    return out


def decimal_comma(rows: list[list[str]]) -> tuple[int, int] | None:
    """The (row, column) of the first number with a decimal comma (``1,5``) in a column of the
    sample whose every other cell is a number (a first-row name aside); ``None`` if none."""
    sample = rows[:1 + ROWS_BELOW]
    for j in range(len(sample[0]) if sample else 0):
        cells = [(i, r[j]) for i, r in enumerate(sample)]
        if cells and not (is_number(cells[0][1]) or _COMMA_NUMBER.fullmatch(cells[0][1])):
            cells = cells[1:]  # a column name
        commas = [i for i, v in cells if _COMMA_NUMBER.fullmatch(v)]
        if commas and all(is_number(v) or _COMMA_NUMBER.fullmatch(v) for _, v in cells):
            return commas[0], j
    return None


def decimal_comma_message(path: object, rows: list[list[str]], lines: list[int],
                          where: tuple[int, int]) -> str:
    """The error for a decimal comma at ``where`` (from :func:`decimal_comma`)."""
    i, j = where
    value = rows[i][j]
    name = rows[0][j]
    column = (f"column {name!r}" if not (is_number(name) or _COMMA_NUMBER.fullmatch(name))
              else f"column {j}")
    point = value.replace(".", "").replace(",", ".")
    return (f"{path}: the file uses decimal commas ({value!r} on line {lines[i]}, {column}); "
            f"gpscale reads '.' as the decimal point: write the numbers with decimal points "
            f"({value} → {point}), e.g. by saving the file with '.' as the decimal separator")
