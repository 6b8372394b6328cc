"""Delimited text (CSV, TSV; plain or gzipped) read column-wise by pyarrow.csv.

:func:`read_csv_columns` reads with the line-by-line reader's rules (:mod:`gpscale.data.lines`):
the first 1 MiB decides the delimiter (sniffed as there), the header row (inferred as there) and
which columns hold text; pyarrow then parses the whole file, every column as float64 except
those, and each parsed block is copied into preallocated float64 arrays and dropped, so memory
holds the numbers about once (10^7 rows x 9 columns: the read adds about 1.3 x the float64
array to peak memory and runs at over 10^6 rows/s on two cores). Surrounding spaces are
ignored, blank lines skipped, quotes read as by Python's :mod:`csv`.

Whatever pyarrow cannot read, or reads but finds wrong (a ragged row, an empty or non-numeric
cell, NaN or inf, a header not on line 1), goes to the line-by-line reader, which names the line
and the column of the problem in its error; when that reader accepts a file pyarrow could not
read (say a number written ``1_000``) the file is loaded its way, slowly, with a warning on the
``gpscale.data`` logger, never silently. That reader holds the whole file as Python strings: on
a file of millions of rows an error message costs what loading it did before pyarrow.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import logging
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import torch

from gpscale.data.head import decide_header, decimal_comma, is_number
from gpscale.data.lines import (
    Table,
    check_delimiter,
    check_names,
    is_gzip,
    read_lines,
    sniff,
    split,
    target_index,
)
from gpscale.data.readers import (
    _bad_counts,
    _ColumnTable,
    _first_line,
    _string_codes,
)
from gpscale.limits import TooLargeError, check_fits
from gpscale.regular_files import open_regular

__all__ = ["ArrowCsvTable", "read_csv_columns"]

log = logging.getLogger("gpscale.data")

HEAD_BYTES = 1 << 20  # the sample that decides delimiter, header and text columns
HEAD_ROWS = 7  # rows the header inference looks at (1 + 5 below it) and one to spare
BLOCK_BYTES = 1 << 22  # pyarrow's parse block (fastest of 1, 4 and 16 MiB on 10^7 rows)


class ArrowCsvTable(_ColumnTable):
    """A delimited text file read by pyarrow into float64 arrays (text columns as strings).

    The columns given as ``layout`` when reading (the inputs, for ``load_csv``) are stored as
    one (rows, k) float64 array, and :meth:`numeric` for exactly those columns returns that
    array itself, not a copy; other numeric columns are stored one array each.

    Anything wrong in the columns asked for (a text cell in a numeric column, NaN or inf, a bad
    count) is handed to the line-by-line reader for its line-numbered error message.
    """

    def __init__(self, path: Path, head: _Head, store: _Store, *, delimiter: str | None,
                 header: str | int | None) -> None:
        super().__init__(path, head.names, head.delimiter, store.num_rows, head.width)
        self.header_note = head.note
        self._head = head
        self._store = store
        self._args = {"delimiter": delimiter, "header": header}

    def text(self) -> Table:
        if self._text is None:
            text = read_lines(self.path, **self._args)
            if len(text.rows) != self.num_rows:
                raise ValueError(f"{self.path}: pyarrow read {self.num_rows} data rows, the "
                                 f"line-by-line reader {len(text.rows)}; please report this "
                                 "file as a gpscale bug")
            self._text = text
        return self._text

    def first_row(self) -> list[str] | None:
        return self._head.data_rows[0] if self._head.data_rows else None

    def locator(self) -> Callable[[list[int]], str]:
        """Names rows by their lines, found by reading the file line by line when asked
        (an error path); holds the path, not the columns."""
        path, args = self.path, dict(self._args)
        return lambda rows: read_lines(path, **args).locator()(rows)

    def _line_by_line(self, why: str, method: str, *args: Any) -> Any:
        """``method`` of the line-by-line table: raises its error, else warns and returns."""
        result = getattr(self.text(), method)(*args)
        log.warning("%s: pyarrow read %s; the line-by-line reader accepts it, so it was read "
                    "that way (slower)", self.path, why)
        return result

    def numeric(self, path: str | Path, columns: list[int]) -> np.ndarray:
        store = self._store
        for j in columns:
            if j in store.text:
                return self._line_by_line(f"text in column {j}", "numeric", path, columns)
            if j in store.nonfinite:
                return self._line_by_line("NaN or inf", "numeric", path, columns)
        if columns == store.layout:
            return store.matrix[:store.num_rows]
        out = np.empty((self.num_rows, len(columns)), dtype=np.float64)
        for k, j in enumerate(columns):
            out[:, k] = store.column(j)
        return out

    def target_values(self, path: str | Path, col: int) -> np.ndarray:
        if col in self._store.text:  # "NA" and the like, or text: the line reader tells which
            return self.text().target_values(path, col)
        return np.array(self._store.column(col))

    def targets(self, path: str | Path, col: int,
                task: str) -> tuple[torch.Tensor, list[str] | None]:
        store = self._store
        if task == "classification":
            if col in store.text:
                column = pa.chunked_array(store.text[col], pa.string())
            else:  # read as numbers: the labels' text is needed
                column = _read_text_column(self.path, self._head, col)
            if column.null_count or len(column) != self.num_rows:
                return self._line_by_line("missing labels", "targets", path, col, task)
            codes = _string_codes(column, strip=True)
            if codes is None:  # NaN or inf among numeric labels: the error names the lines
                return self._line_by_line("NaN or inf labels", "targets", path, col, task)
            return codes
        if col in store.text or col in store.nonfinite:
            return self._line_by_line(f"text, NaN or inf in the target column {col}",
                                      "targets", path, col, task)
        y = np.ascontiguousarray(store.column(col))
        if task == "counts" and _bad_counts(y).any():
            return self._line_by_line("a bad count", "targets", path, col, task)
        return torch.from_numpy(y), None


# -- delimited text through pyarrow ---------------------------------------------------------------

@dataclass
class _Head:
    """What the first rows of a delimited file decide, as the line-by-line reader would."""

    delimiter: str
    names: list[str] | None
    width: int
    gzip: bool
    data_rows: list[list[str]]  # complete data rows of the sample (stripped text)
    whole: bool  # the sample is the whole file
    bytes_per_row: float  # in the sample
    text_columns: set[int] = field(default_factory=set)
    note: str = ""  # why the first row is or is not a header, when not plain


def _inspect(path: Path, delimiter: str | None,
             header: str | int | None) -> tuple[_Head | None, str]:
    """The head of the file, or ``None`` and why pyarrow should not read it."""
    with open_regular(path) as file:  # a named pipe or a device is refused, not read
        first = file.read(2)
        file.seek(0)
        gz = is_gzip(path, first)
        try:
            with gzip.GzipFile(fileobj=file, mode="rb") if gz else contextlib.nullcontext(
                    file) as f:
                raw = f.read(HEAD_BYTES)
                whole = not f.read(1)
        except (OSError, EOFError, zlib.error) as err:
            return None, f"unreadable ({_first_line(err)})"
    try:
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(raw, final=whole)
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    sep = sniff(text) if delimiter is None else delimiter
    try:
        check_delimiter(sep)
    except ValueError as err:
        return None, str(err)
    if not whole:  # drop the last line, perhaps cut short
        text = text[:max(text.rfind("\n"), text.rfind("\r")) + 1]
    try:
        rows, lines = split(path, text, sep)
    except ValueError as err:
        return None, str(err)
    if not whole:  # a quoted field may run past the sample
        rows, lines = rows[:-1], lines[:-1]
    if not rows:
        return None, "no rows"
    if not whole and len(rows) < HEAD_ROWS:
        return None, "fewer than 7 rows in the first MiB"
    width = len(rows[0])
    if any(len(row) != width for row in rows):
        return None, "rows of different widths"
    if width == 1 and delimiter is not None:
        return None, "a single column"
    if decimal_comma(rows) is not None:
        return None, "decimal commas"
    names = None
    is_header, note = decide_header(text, sep, rows, lines, header)
    if is_header:
        names, rows = rows[0], rows[1:]
        if lines[0] != 1:
            return None, "the header row is not the first line"
        try:
            check_names(path, names)
        except ValueError:
            return None, "duplicate column names"
        if not rows:
            return None, "no data rows"
    per_row = len(text.encode("utf-8")) / (len(rows) + (names is not None))
    head = _Head(sep, names, width, gz, rows, whole, per_row, note=note)
    head.text_columns = {j for j in range(width) if not all(is_number(r[j]) for r in rows)}
    return head, ""


class _Nulls(Exception):
    """pyarrow read a missing value (it does for a last line of empty fields)."""


class _Store:
    """Columns filled batch by batch as pyarrow streams the file: the ``layout`` columns into
    one (rows, k) float64 array, every other numeric column into an array of its own, text
    columns as pyarrow string chunks. Arrays are allocated for an estimated row count (pages
    never written cost no memory) and grow when the estimate is short."""

    def __init__(self, width: int, text: set[int], layout: list[int], capacity: int,
                 path: Path) -> None:
        self.width, self.path = width, path
        self.text: dict[int, list[pa.Array]] = {j: [] for j in sorted(text)}
        self.layout = layout
        self.slot = {j: k for k, j in enumerate(layout)}
        self.matrix = np.empty((capacity, len(layout)), dtype=np.float64)
        self.single = {j: np.empty(capacity, dtype=np.float64) for j in range(width)
                       if j not in text and j not in self.slot}
        self.nonfinite: set[int] = set()
        self.num_rows = 0

    @property
    def capacity(self) -> int:
        return self.matrix.shape[0]

    def _grow(self, rows: int) -> None:
        capacity = max(rows, self.capacity + self.capacity // 2 + 1024)
        numeric = len(self.layout) + len(self.single)
        check_fits(self.path, 8 * capacity * numeric + 8 * self.num_rows * numeric,
                   f"more than {self.num_rows:,} rows of {numeric} numeric columns")
        n = self.num_rows
        matrix = np.empty((capacity, len(self.layout)), dtype=np.float64)
        matrix[:n] = self.matrix[:n]
        self.matrix = matrix
        for j, old in self.single.items():
            new = np.empty(capacity, dtype=np.float64)
            new[:n] = old[:n]
            self.single[j] = new

    def add(self, batch: pa.RecordBatch) -> None:
        n, m = self.num_rows, batch.num_rows
        if n + m > self.capacity:
            self._grow(n + m)
        for j in range(self.width):
            column = batch.column(j)
            if column.null_count:
                raise _Nulls
            if j in self.text:
                self.text[j].append(column)
                continue
            values = column.to_numpy()
            if j not in self.nonfinite and not np.isfinite(values).all():
                self.nonfinite.add(j)
            if j in self.slot:
                self.matrix[n:n + m, self.slot[j]] = values
            else:
                self.single[j][n:n + m] = values
        self.num_rows = n + m

    def column(self, j: int) -> np.ndarray:
        """Numeric column j (a view)."""
        if j in self.slot:
            return self.matrix[:self.num_rows, self.slot[j]]
        return self.single[j][:self.num_rows]

    def first_rows(self, count: int) -> list[list[float | str]]:
        count = min(count, self.num_rows)
        cols = [pa.chunked_array(self.text[j], pa.string())[:count].to_pylist()
                if j in self.text else self.column(j)[:count].tolist()
                for j in range(self.width)]
        return [list(row) for row in zip(*cols, strict=True)]


def _options(head: _Head, text_columns: set[int], only: int | None = None):
    names = [f"c{j}" for j in range(head.width)]
    types = {name: pa.string() if j in text_columns else pa.float64()
             for j, name in enumerate(names)}
    read = pacsv.ReadOptions(column_names=names, skip_rows=1 if head.names else 0,
                             use_threads=True, block_size=BLOCK_BYTES)
    parse = pacsv.ParseOptions(delimiter=head.delimiter, quote_char='"', double_quote=True,
                               escape_char=False, newlines_in_values=True,
                               ignore_empty_lines=True)
    convert = pacsv.ConvertOptions(
        column_types=types, null_values=[], strings_can_be_null=False,
        quoted_strings_can_be_null=False, check_utf8=True,
        include_columns=None if only is None else [names[only]])
    return {"read_options": read, "parse_options": parse, "convert_options": convert}


def _input(path: Path, head: _Head):
    return pa.input_stream(str(path), compression="gzip" if head.gzip else None)


def _stream(path: Path, head: _Head, text_columns: set[int], layout: list[int]) -> _Store:
    """Stream the file through pyarrow into a :class:`_Store`."""
    store = _Store(head.width, text_columns, [j for j in layout if j not in text_columns],
                   _capacity(path, head), path)
    with _input(path, head) as source:
        for batch in pacsv.open_csv(source, **_options(head, text_columns)):
            store.add(batch)
    return store


def _read_text_column(path: Path, head: _Head, col: int) -> pa.ChunkedArray:
    with _input(path, head) as source:
        return pacsv.read_csv(source, **_options(head, {col}, only=col)).column(0)


def _capacity(path: Path, head: _Head) -> int:
    """Rows to allocate for: the sample's count, or the file size over the sample's bytes per
    row (a gzip file: four times that; arrays grow when short)."""
    if head.whole:
        return len(head.data_rows) + 1
    rows = path.stat().st_size / head.bytes_per_row * (4 if head.gzip else 1)
    return int(rows * 1.05) + 1024


_CONVERSION = re.compile(r"In CSV column #(\d+):(?: Row #\d+:)? CSV conversion error to double")


def read_csv_columns(path: str | Path, *, delimiter: str | None = None,
                     header: str | int | None = "infer", target: str | int | None = None,
                     labels: bool = False) -> tuple[ArrowCsvTable | None, str]:
    """A delimited text file read column-wise by pyarrow, or ``None`` and why not.

    Args:
        path: the file (gzip when named ``.gz`` or starting with gzip's magic bytes).
        delimiter, header: as for :func:`gpscale.data.lines.read_lines`.
        target: the target column (name or index), if known: every other column is stored in
            one (rows, d) array, the x that ``numeric`` then returns without a copy. ``None``:
            all columns are.
        labels: read the target column as text (class labels).

    Returns:
        The table and ``""``, or ``None`` and the reason the line-by-line reader must read it
        (which then either raises the error that names the line, or reads it).

    Raises:
        OSError: the file cannot be opened.
        ValueError: not a regular file (a folder, named pipe or device).
    """
    path = Path(path)
    head, why = _inspect(path, delimiter, header)
    if head is None:
        return None, why
    columns = set(head.text_columns)
    layout = list(range(head.width))
    if target is not None:
        try:
            col = target_index(target, head.names, head.width)
        except ValueError:
            pass  # reported once the file is read
        else:
            layout.remove(col)
            if labels:
                columns.add(col)
    for _ in range(head.width + 1):
        if len(columns) == head.width:  # a row of empty fields would be kept, not dropped
            return None, "no numeric column"
        try:
            store = _stream(path, head, columns, layout)
            break
        except _Nulls:
            return None, "pyarrow found missing values"
        except TooLargeError:
            raise
        except (pa.ArrowException, OSError, ValueError, EOFError) as err:
            match = _CONVERSION.search(str(err))
            if match is None or int(match[1]) in columns:
                return None, f"pyarrow: {_first_line(err)}"
            columns.add(int(match[1]))  # a text column past the sample: read it as text
    else:
        return None, "pyarrow: too many retries"
    if store.num_rows == 0:
        return None, "no data rows"
    if head.whole and store.num_rows != len(head.data_rows):
        return None, f"pyarrow read {store.num_rows} rows, Python {len(head.data_rows)}"
    if not _agrees(store.first_rows(5), head.data_rows[:5]):
        return None, "pyarrow and Python read the first rows differently"
    return ArrowCsvTable(path, head, store, delimiter=delimiter, header=header), ""


def _agrees(got: list[list[float | str]], rows: list[list[str]]) -> bool:
    """Whether pyarrow's first rows are the line-by-line reader's."""
    if len(got) < len(rows):
        return False
    for want, have in zip(rows, got, strict=False):
        for text, value in zip(want, have, strict=True):
            if isinstance(value, str):
                if value.strip() != text:
                    return False
            elif not is_number(text) or not (float(text) == value or
                                               (np.isnan(value) and np.isnan(float(text)))):
                return False
    return True
