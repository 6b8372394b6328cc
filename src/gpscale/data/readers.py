"""Column-wise readers of user files: delimited text through pyarrow.csv, Parquet, NumPy ``.npy``.

The format follows from the file name (:func:`file_format`): ``.csv``, ``.tsv`` and ``.txt``
(each optionally ``.gz``) are delimited text, ``.parquet`` and ``.pq`` Parquet, ``.npy`` a NumPy
array; any other name is a ``ValueError``. Each reader returns a :class:`~gpscale.data.lines.Table`
whose ``numeric(path, columns)`` gives float64 columns and ``targets(path, col, task)`` targets,
so that :func:`gpscale.data.csv.load_csv` and ``gpscale predict`` treat every format alike.

Delimited text is read by :func:`gpscale.data.csv_arrow.read_csv_columns` (pyarrow.csv,
with the line-by-line reader's rules and its error messages).

Parquet and ``.npy`` files name problems by row, 0-based (there are no lines). A ``.npy`` file
holds a 2-D array of numbers (rows, columns), has no header (columns are named by index, feature
names are ``x0..x{d-1}``) and is memory-mapped: only the columns asked for are copied out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from numpy.lib import format as npy_format

from gpscale.data.lines import (
    DROP_HINT,
    Table,
    _col,
    canonical_labels,
    check_names,
    sort_labels,
)
from gpscale.limits import check_fits
from gpscale.regular_files import check_regular, open_regular

__all__ = ["CSV_SUFFIXES", "PARQUET_SUFFIXES", "NPY_SUFFIXES", "LabelledNpyTable", "NpyTable",
           "ParquetTable", "file_format", "read_npy", "read_parquet"]

log = logging.getLogger("gpscale.data")

CSV_SUFFIXES = (".csv", ".tsv", ".txt")  # each also with .gz
PARQUET_SUFFIXES = (".parquet", ".pq")
NPY_SUFFIXES = (".npy",)

_ROW_BLOCK = 1 << 16  # rows copied at a time out of a memory-mapped array


def file_format(path: str | Path) -> str:
    """``"csv"``, ``"parquet"`` or ``"npy"`` from the file name (case-insensitive).

    Raises:
        ValueError: any other name.
    """
    name = Path(path).name.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(NPY_SUFFIXES):
        return "npy"
    if name.removesuffix(".gz").endswith(CSV_SUFFIXES):
        return "csv"
    suffix = "".join(Path(path).suffixes[-2:])
    shown = f"extension {suffix!r}" if suffix else "no extension"
    raise ValueError(f"{path}: unknown file type ({shown}); gpscale reads "
                     f"{', '.join(CSV_SUFFIXES)} (each optionally .gz), "
                     f"{', '.join(PARQUET_SUFFIXES)} and {', '.join(NPY_SUFFIXES)} files")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# -- tables read column-wise -----------------------------------------------------------------------

class _ColumnTable(Table):
    """A table read column-wise; ``rows`` and ``lines`` come from :meth:`text` when asked for."""

    def __init__(self, path: Path, names: list[str] | None, delimiter: str | None,
                 num_rows: int, width: int) -> None:
        self.path = path
        self.names = names
        self.delimiter = delimiter
        self._num_rows = num_rows
        self._width = width
        self._text: Table | None = None

    @property
    def width(self) -> int:
        return self._width

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def rows(self) -> list[list[str]]:  # type: ignore[override]
        return self.text().rows

    @property
    def lines(self) -> list[int]:  # type: ignore[override]
        return self.text().lines

    def text(self) -> Table:
        """The table as text rows (slow: for compatibility and error messages)."""
        raise NotImplementedError


class _ArrayTable(_ColumnTable):
    """Parquet and ``.npy`` tables: problems are named by row (0-based)."""

    def _column(self, path: str | Path, j: int, what: str, missing: bool = False) -> np.ndarray:
        """Column j as float64 (a copy or a view); ``what`` names it in errors; ``missing``:
        missing values (Parquet's nulls) are NaN, not an error."""
        raise NotImplementedError

    def _is_text(self, j: int) -> bool:
        return False

    def _labels(self, j: int) -> tuple[torch.Tensor, list[str]]:
        """Codes and labels of a text column j."""
        raise NotImplementedError

    def numeric(self, path: str | Path, columns: list[int]) -> np.ndarray:
        check_fits(path, 8 * self.num_rows * (len(columns) + 2),
                   f"{self.num_rows:,} rows of {len(columns)} numeric columns")
        out = np.empty((self.num_rows, len(columns)), dtype=np.float64)
        for k, j in enumerate(columns):
            out[:, k] = self._column(path, j, "input column")
        self._check_finite(path, out, columns)
        return out

    def _check_finite(self, path: str | Path, out: np.ndarray, columns: list[int]) -> None:
        bad = ~np.isfinite(out)
        if bad.any():
            rows, cols = np.flatnonzero(bad.any(1)), np.flatnonzero(bad.any(0))
            names = self._labels_of_columns()
            shown = ", ".join(_col(names, columns[k]) for k in cols)
            raise ValueError(f"{path}: {shown} hold{'s' if len(cols) == 1 else ''} NaN or inf "
                             f"on {_rows(rows)}; remove or impute those rows")

    def locator(self) -> Callable[[list[int]], str]:
        return lambda rows: _rows(np.asarray(rows))

    def first_row(self) -> list[str] | None:
        return None  # no header to mistake for data: Parquet names its columns, .npy has none

    def _labels_of_columns(self) -> list[str]:
        return self.names or [f"column {j}" for j in range(self.width)]

    def _name(self, j: int) -> str:
        return f"column {self.names[j]!r}" if self.names else f"column {j}"

    def target_values(self, path: str | Path, col: int) -> np.ndarray:
        if self._is_text(col):
            raise ValueError(f"{path}: the target {self._name(col)} holds text; a numeric "
                             "target is needed to drop the rows without one")
        return self._column(path, col, "target column", missing=True)

    def targets(self, path: str | Path, col: int,
                task: str) -> tuple[torch.Tensor, list[str] | None]:
        name = f"target {self._name(col)}"
        if task == "classification":
            if self._is_text(col):
                return self._labels(col)
            values = self._column(path, col, "target column")
            bad = np.flatnonzero(~np.isfinite(values))
            if len(bad):
                raise ValueError(f"{path}: the {name} holds NaN or inf on {_rows(bad)}; remove "
                                 "or impute those rows")
            uniques, inverse = np.unique(values, return_inverse=True)
            labels = [_number_label(v) for v in uniques]
            classes = sort_labels(set(labels))
            code = {label: c for c, label in enumerate(classes)}
            lookup = np.array([code[label] for label in labels], dtype=np.int64)
            return torch.from_numpy(lookup[inverse.reshape(-1)]), classes
        if self._is_text(col):
            raise ValueError(f"{path}: the {name} holds text; use task='classification' "
                             "(--task classification) for class labels")
        y = np.array(self._column(path, col, "target column"), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(y))
        if len(bad):
            raise ValueError(f"{path}: the {name} holds NaN or inf on {_rows(bad)}; remove or "
                             "impute those rows")
        if task == "counts" and _bad_counts(y).any():
            first = int(np.flatnonzero(_bad_counts(y))[0])
            raise ValueError(f"{path}: counts must be non-negative integers; the {name} holds "
                             f"{y[first]:g} on row {first} (0-based)")
        return torch.from_numpy(y), None

    def text(self) -> Table:
        if self._text is None:
            cols = [[_number_label(v) if isinstance(v, float) else str(v) for v in
                     self._python_column(j)] for j in range(self.width)]
            rows = [list(row) for row in zip(*cols, strict=True)]
            self._text = Table(self.names, rows, list(range(1, self.num_rows + 1)), None)
        return self._text

    def _python_column(self, j: int) -> list[Any]:
        raise NotImplementedError


class ParquetTable(_ArrayTable):
    """A Parquet file, read a column at a time when asked for (Parquet stores it so): memory
    holds the output and one column, never the whole file twice."""

    def __init__(self, path: Path, parquet: pq.ParquetFile) -> None:
        schema = parquet.schema_arrow
        super().__init__(path, list(schema.names), None, parquet.metadata.num_rows,
                         len(schema.names))
        self._file = parquet
        self._types = list(schema.types)

    def _read(self, j: int) -> pa.ChunkedArray:
        try:
            return self._file.read(columns=[self.names[j]]).column(0)
        except (pa.ArrowException, OSError) as err:
            raise ValueError(f"{self.path} is not a readable Parquet file (column "
                             f"{self.names[j]!r}: {_first_line(err)})") from None

    def _column(self, path: str | Path, j: int, what: str, missing: bool = False) -> np.ndarray:
        kind = self._types[j]
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_boolean(kind) or pa.types.is_decimal(kind)):
            hint = ("; use task='classification' (--task classification) for class labels"
                    if what == "target column" else f"; {what}s must be numeric")
            raise ValueError(f"{path}: the {what} {self.names[j]!r} holds {kind} values{hint}")
        column = self._read(j)
        if column.null_count and missing:
            column = pc.fill_null(pc.cast(column, pa.float64()), float("nan"))
        elif column.null_count:
            nulls = np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))
            hint = f" (or {DROP_HINT})" if what == "target column" else ""
            raise ValueError(f"{path}: the {what} {self.names[j]!r} has missing values (null) "
                             f"on {_rows(nulls)}; remove or impute those rows{hint}")
        return np.asarray(column.to_numpy(), dtype=np.float64)

    def _is_text(self, j: int) -> bool:
        kind = self._types[j]
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        return pa.types.is_string(kind) or pa.types.is_large_string(kind)

    def _labels(self, j: int) -> tuple[torch.Tensor, list[str]]:
        column = self._read(j)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if column.null_count:
            nulls = np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))
            raise ValueError(f"{self.path}: the target column {self.names[j]!r} has missing "
                             f"values (null) on {_rows(nulls)}; remove or impute those rows")
        codes = _string_codes(column, strip=False)
        if codes is None:
            bad = [v for v, name in canonical_labels(pc.unique(column).to_pylist()).items()
                   if name is None]
            rows = np.flatnonzero(pc.is_in(column, value_set=pa.array(bad)).to_numpy(
                zero_copy_only=False))
            raise ValueError(f"{self.path}: the target column {self.names[j]!r} holds NaN or "
                             f"inf on {_rows(rows)}; remove or impute those rows")
        return codes

    def _python_column(self, j: int) -> list[Any]:
        return self._read(j).to_pylist()


class NpyTable(_ArrayTable):
    """A 2-D ``.npy`` array, memory-mapped (``numpy.load(mmap_mode="r")``).

    :meth:`numeric` copies the columns asked for out of the map, a block of rows at a time, into
    one float64 array: the x that ``load_csv`` hands to ``torch.from_numpy``. Methods that stream
    over rows could read ``self.array`` (the map itself) instead and never hold a copy.
    """

    def __init__(self, path: Path, array: np.ndarray) -> None:
        super().__init__(path, None, None, array.shape[0], array.shape[1])
        self.array = array

    def numeric(self, path: str | Path, columns: list[int]) -> np.ndarray:
        out = np.empty((self.num_rows, len(columns)), dtype=np.float64)
        index = np.asarray(columns, dtype=np.intp)
        for start in range(0, self.num_rows, _ROW_BLOCK):
            stop = min(start + _ROW_BLOCK, self.num_rows)
            out[start:stop] = self.array[start:stop][:, index]
        self._check_finite(path, out, columns)
        return out

    def _column(self, path: str | Path, j: int, what: str, missing: bool = False) -> np.ndarray:
        return np.asarray(self.array[:, j], dtype=np.float64)

    def _python_column(self, j: int) -> list[Any]:
        return self.array[:, j].tolist()


class LabelledNpyTable(NpyTable):
    """An array of N images (N, H, W[, C]), or any (N, ...) array, memory-mapped and read as N
    flattened rows (channel-last for images), with the N labels of a second ``.npy`` file as
    one more, last, column.

    Attributes:
        item_shape: the shape of one item, (H, W[, C]) for images.
    """

    def __init__(self, path: Path, array: np.ndarray, labels: np.ndarray) -> None:
        super().__init__(path, array.reshape(array.shape[0], -1))  # a view of the map
        self._width += 1
        self.labels = labels
        self.item_shape = tuple(int(k) for k in array.shape[1:])

    def _column(self, path: str | Path, j: int, what: str, missing: bool = False) -> np.ndarray:
        if j == self.width - 1:
            return np.asarray(self.labels, dtype=np.float64)
        return super()._column(path, j, what, missing)

    def _python_column(self, j: int) -> list[Any]:
        if j == self.width - 1:
            return self.labels.tolist()
        return super()._python_column(j)


def _rows(rows: np.ndarray) -> str:
    shown = ", ".join(str(int(i)) for i in rows[:5])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more} (0-based)"


def _bad_counts(y: np.ndarray) -> np.ndarray:
    return (y < 0) | (y != np.round(y))


def _number_label(value: float | int | bool) -> str:
    """A class label for a number: ``"3"`` for 3.0, else the shortest repr."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def _string_codes(column: pa.ChunkedArray, *,
                  strip: bool) -> tuple[torch.Tensor, list[str]] | None:
    """Class codes (sorted labels, numeric order when all are numbers, numeric labels compared
    by value: :func:`~gpscale.data.lines.canonical_labels`) of a text column; ``None`` when
    numeric labels hold NaN or inf."""
    uniques = pc.unique(column)
    raw = uniques.to_pylist()
    labels = [v.strip() for v in raw] if strip else raw
    canon = canonical_labels(labels)
    if any(name is None for name in canon.values()):
        return None
    classes = sort_labels(set(canon.values()))
    code = {label: c for c, label in enumerate(classes)}
    lookup = np.array([code[canon[label]] for label in labels], dtype=np.int64)
    index = pc.index_in(column, value_set=uniques).to_numpy()
    return torch.from_numpy(lookup[index]), classes


# -- Parquet and .npy -----------------------------------------------------------------------------

def _check_size(path: Path) -> int:
    """The size of ``path``, a regular file that is not empty."""
    size = check_regular(path).st_size  # a named pipe or a device is refused, not opened
    if size == 0:
        raise ValueError(f"{path} is empty (0 bytes)")
    return size


def read_parquet(path: str | Path) -> ParquetTable:
    """A Parquet file as a :class:`ParquetTable`; its column names are the header.

    Raises:
        OSError: the file cannot be opened.
        ValueError: not a regular file (a folder, named pipe or device), empty, not Parquet
            (corrupt; a damaged column is found when it is read,
            and damage inside a data page only if the writer stored page checksums),
            duplicate column names, or no rows.
    """
    path = Path(path)
    _check_size(path)
    try:
        try:  # page checksums, where the writer stored them, are checked (pyarrow >= 15)
            parquet = pq.ParquetFile(path, page_checksum_verification=True)
        except TypeError:
            parquet = pq.ParquetFile(path)
        names = list(parquet.schema_arrow.names)
    except (pa.ArrowException, OSError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise ValueError(f"{path} is not a readable Parquet file ({_first_line(err)})") from None
    check_names(path, names)
    rows = parquet.metadata.num_rows
    if rows == 0:
        raise ValueError(f"{path} has no data rows")
    check_fits(path, 16 * rows, f"the {rows:,} rows its metadata declares (one column of them)")
    return ParquetTable(path, parquet)


def read_npy(path: str | Path, labels: str | Path | None = None, *,
             items: bool = False) -> NpyTable:
    """A ``.npy`` file as a memory-mapped :class:`NpyTable` (no header); with ``labels`` (a
    ``.npy`` file of one number per row) an array of any number of dimensions, e.g. images
    (N, H, W[, C]), as a :class:`LabelledNpyTable` whose last column holds the labels; with
    ``items`` (prediction) an array of any number of dimensions as flattened rows.

    The header is read and checked first (:func:`_npy_header`), so that nothing is mapped or
    allocated for a file that is not a ``.npy`` array of numbers of the size it declares.

    Raises:
        OSError: the file cannot be opened.
        ValueError: not a regular file (a folder, named pipe or device), empty, not a ``.npy``
            file (text, an ``.npz`` archive, corrupt), truncated, Python objects, not 2-D
            (without ``labels``), not numbers, or no rows; labels not one per row.
    """
    path = Path(path)
    shape, dtype = _npy_header(path, _check_size(path))
    if labels is None and len(shape) != 2 and not (items and len(shape) > 2):
        hint = (" (for an array of images, (N, H, W) or (N, H, W, C), give their labels as a "
                "second .npy file: --data-option labels=FILE.npy)" if len(shape) > 2 else "")
        raise ValueError(f"{path}: a .npy file must hold a 2-D array (rows, columns); this one "
                         f"has shape {shape}{hint}")
    if labels is not None and len(shape) < 2:
        raise ValueError(f"{path}: an array of items (N, ...) is needed beside labels; this "
                         f"one has shape {shape}")
    if dtype.kind not in "biuf":
        raise ValueError(f"{path} holds {dtype} values; gpscale reads .npy arrays of "
                         "numbers (float, int or bool)")
    if shape[0] == 0:
        raise ValueError(f"{path} has no data rows")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError) as err:
        raise ValueError(f"{path} is not a readable .npy file ({_first_line(err)})") from None
    if labels is None:
        return NpyTable(path, array.reshape(array.shape[0], -1))
    values = _read_labels(Path(labels))
    if values.shape[0] != shape[0]:
        raise ValueError(f"{labels} holds {values.shape[0]:,} labels for the {shape[0]:,} items "
                         f"of {path}; give one label per item")
    return LabelledNpyTable(path, array, values)


def _read_labels(path: Path) -> np.ndarray:
    """A ``.npy`` array of numbers, one per row: shape (N,) or (N, 1)."""
    shape, dtype = _npy_header(path, _check_size(path))
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1) \
            or dtype.kind not in "biuf":
        raise ValueError(f"{path}: labels must be a .npy array of numbers, one per row, shape "
                         f"(N,) or (N, 1); this one has shape {shape} and dtype {dtype}")
    return np.load(path, mmap_mode="r", allow_pickle=False).reshape(-1)


_NPY_MAGIC = b"\x93NUMPY"
_HEADER_READERS = {(1, 0): npy_format.read_array_header_1_0,  # version 3.0 is written only
                   (2, 0): npy_format.read_array_header_2_0}  # for structured arrays


def _npy_header(path: Path, size: int) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from a ``.npy`` file's header, checked against the ``size`` bytes the
    file holds; Python objects (which only unpickling could read) are refused."""
    with open_regular(path) as f:
        start = f.read(len(_NPY_MAGIC))
        if start != _NPY_MAGIC:
            raise ValueError(f"{path} is not a .npy file: it does not start with NumPy's magic "
                             f"bytes{_what_it_is(start + f.read(512))}")
        f.seek(0)
        try:
            version = npy_format.read_magic(f)
            shape, _, dtype = _HEADER_READERS[version](f)
        except (ValueError, KeyError, EOFError, OSError) as err:
            raise ValueError(f"{path} is not a readable .npy file (its header is damaged or of "
                             f"an unknown version: {_first_line(err)})") from None
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError(f"{path} holds Python objects (dtype {dtype}), which only unpickling "
                         "could read; gpscale reads .npy arrays of numbers (float, int or "
                         "bool)")
    need = math.prod(shape) * dtype.itemsize
    if need > size - offset:
        raise ValueError(f"{path} is truncated: its header declares an array of shape {shape} "
                         f"and dtype {dtype} ({need} bytes); the file holds {size - offset} "
                         "bytes after the header")
    return shape, dtype


def _what_it_is(start: bytes) -> str:
    """What a file that is not a ``.npy`` array seems to be, for the error message."""
    if start.startswith(b"PK\x03\x04"):
        return " (it is a zip archive, an .npz file?; save one 2-D array with numpy.save)"
    try:
        start.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(start) - 4:  # not just a character cut at the end
            return ""
    return " (it looks like text: a delimited file? name it .csv, .tsv or .txt)"
