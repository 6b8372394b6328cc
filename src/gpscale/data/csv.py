"""Load a data file of your own (delimited text, Parquet or ``.npy``) as a :class:`Dataset`.

The format follows from the file name: ``.csv``, ``.tsv``, ``.txt`` (each optionally ``.gz``),
``.parquet``/``.pq`` or ``.npy`` (:func:`gpscale.data.readers.file_format`). The target is chosen
by column name (when the file has a header row; a Parquet file's column names are one) or by
integer index; every other column is an input and must be numeric. Rows are split at random
(seeded) and standardised with training statistics only, exactly like the UCI sets: x always, y
only for regression. Class labels (any strings or numbers) are mapped to 0..C-1 in sorted order
(numeric order when all labels are numbers); the original labels are kept in ``info["classes"]``.

Reading (:func:`read_table`, shared with ``gpscale predict``) is column-wise: delimited text
through pyarrow's CSV reader, Parquet through pyarrow, ``.npy`` memory-mapped
(:mod:`gpscale.data.readers`). Text files follow the rules of the line-by-line reader
(:mod:`gpscale.data.lines`), which also writes every error message: a ``ValueError`` naming the
file, the line and the column for anything that cannot be read correctly: not UTF-8 text, a bad
gzip stream, rows of different widths, duplicate header names, a header without data rows, empty
or non-numeric inputs, NaN or inf in inputs or targets, and decimal commas (``1,5``). The
delimiter is sniffed unless given: tab, semicolon, comma or ``|``, the first that splits the
first lines into equally many fields. Parquet and ``.npy`` errors name rows (0-based) instead of
lines.

Whether a text file's first row is a header is inferred (:mod:`gpscale.data.head`): text above
numbers makes a header; so does a first row of numbers only when it is written unlike the rows
below (quoted above unquoted numbers, or distinct integers above columns of decimals), which is
logged as a warning on ``gpscale.data``; a first row of numbers read as data is logged at INFO.

Input columns constant on the training rows are dropped with a warning naming them
(:class:`~gpscale.data.transforms.Standardizer` keeps any column whose values differ, at any
scale: ``1e-300`` apart or near ``2**64``).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpscale.data.datasets import TASKS, Dataset, standardized_dataset
from gpscale.data.dates import decimal_years
from gpscale.data.lines import _NAMES, Table, check_header, read_lines, target_index
from gpscale.data.splits import SPLITS, ordered_split, random_split
from gpscale.regular_files import check_regular
from gpscale.validation import check_class_labels

__all__ = ["load_csv", "load_table", "read_table", "Table", "numeric_columns"]

log = logging.getLogger("gpscale.data")


def read_table(path: str | Path, *, delimiter: str | None = None,
               header: str | int | None = "infer", items: bool = False) -> Table:
    """Read a data file into a :class:`Table` (names, width, numeric columns on demand).

    Args:
        path: the file; its name gives the format (see the module docstring).
        delimiter: field separator of a text file; ``None`` sniffs it. Text files only.
        header: ``"infer"`` (the rules of :mod:`gpscale.data.head`), ``None`` or ``0``; a
            Parquet file's header is its column names, a ``.npy`` file has none.
        items: a ``.npy`` array of more than two dimensions (images (N, H, W[, C])) is read as
            N flattened rows.

    Raises:
        OSError: the file cannot be opened.
        ValueError: an unknown file type; not a regular file (a folder, named pipe or
            device); a text file that is not UTF-8 or not gzip, has no
            rows, no data rows, rows of different widths, duplicate header names, or a delimiter
            that does not split it; a corrupt, empty or non-2-D Parquet or ``.npy`` file.
    """
    return _read(Path(path), delimiter, header, items=items)


def _read(path: Path, delimiter: str | None, header: str | int | None,
          target: str | int | None = None, labels: bool = False,
          label_file: str | Path | None = None, items: bool = False) -> Table:
    # the column-wise readers import pyarrow (a second to import): only when a file is read
    from gpscale.data.csv_arrow import read_csv_columns
    from gpscale.data.readers import file_format, read_npy, read_parquet

    check_header(header)
    kind = file_format(path)
    check_regular(path)  # a named pipe or a device is refused before it is opened
    if label_file is not None and kind != "npy":
        raise ValueError(f"{path}: a labels file goes with a .npy array of items (images), not "
                         f"with a {kind} file; put the labels in a column of the file instead")
    if kind != "csv":
        if delimiter is not None:
            raise ValueError(f"{path}: a delimiter applies to text files only, not to {kind} "
                             "files")
        if kind == "npy" and header == 0:
            raise ValueError(f"{path}: a .npy file has no header row; pick the target by index")
        if kind == "parquet" and header is None:
            raise ValueError(f"{path}: a Parquet file always names its columns; leave header "
                             "at 'infer'")
        return read_parquet(path) if kind == "parquet" else read_npy(path, label_file, items=items)
    table, why = read_csv_columns(path, delimiter=delimiter, header=header, target=target,
                                  labels=labels)
    if table is None:
        table = read_lines(path, delimiter=delimiter, header=header)  # raises what is wrong
        log.warning("%s: read line by line (slower) because %s", path, why)
    if table.header_note and table.names is not None:
        log.warning("%s: %s; if it is data, add a header row of names that are not numbers (or "
                    "pass header=None; gpscale fit: --data-option header=none)", path,
                    table.header_note)
    elif table.header_note:
        log.info("%s: %s; if it is a header, use names that are not numbers (or pass "
                 "header=0; gpscale fit: --data-option header=0)", path, table.header_note)
    return table


def numeric_columns(path: str | Path, table: Table, columns: list[int]) -> np.ndarray:
    """The given columns of ``table`` as a float64 array (rows, len(columns)).

    Raises:
        ValueError: naming the line (text) or row (Parquet, ``.npy``) and the column of the
            first empty or non-numeric field, or the lines or rows (first five) and columns
            holding NaN or inf.
    """
    return table.numeric(path, columns)


def load_csv(path: str | Path, target: str | int, *, task: str = "regression",
             test_fraction: float = 0.1, seed: int = 0, header: str | int | None = "infer",
             delimiter: str | None = None, dtype: torch.dtype = torch.float64,
             standardize_x: bool = True, labels: str | Path | None = None,
             split: str = "random", dates: str | int | None = None,
             missing_target: str = "error") -> Dataset:
    """Load a data file (CSV, Parquet or ``.npy``) with a random train/test split.

    Args:
        path: the file; ``.csv``, ``.tsv``, ``.txt`` (``.gz`` is decompressed), ``.parquet``,
            ``.pq`` or ``.npy`` (a 2-D array without header).
        target: column name (needs a header row) or integer index (negative counts from the
            end); a string of digits is read as an index when no column has that name.
        task: ``"regression"``, ``"classification"`` or ``"counts"``.
        test_fraction: fraction of rows in the test set.
        seed: seed of the random split.
        header: ``"infer"`` (text above numbers is a header; the rules for a first row of
            numbers are in :mod:`gpscale.data.head`), ``None`` (no header) or ``0`` (the
            first row is a header). Text files.
        delimiter: field separator; ``None`` sniffs it (tab, ';', ',' or '|'). Text files.
        dtype: floating dtype of x (and of y for regression and counts).
        standardize_x: ``False`` keeps the inputs as they are, every column (the pixels of
            images for a convolutional method); by default they are standardised and constant
            columns dropped.
        labels: a ``.npy`` file of one target per item of the ``.npy`` array ``path``, which
            may then hold items of any shape, e.g. images (N, H, W[, C]), read as flattened
            rows; ``target`` must then be -1 (the labels, added as the last column), and
            ``info["item_shape"]`` records (H, W[, C]).
        split: ``"random"`` (seeded by ``seed``) or ``"last"``: the last ``test_fraction`` of
            the rows, in file order, are the test set (a forecast).
        dates: an input column (name or index) of dates written ``YYYYMMDD``, read as
            decimal years (:func:`gpscale.data.dates.decimal_years`).
        missing_target: ``"error"`` (default: a row without a target is an error naming its
            line) or ``"drop"``: rows whose target is missing (an empty field, ``NA``, ``NaN``,
            ``null``) are dropped before the split, with a warning counting them; a numeric
            target (regression or counts). Their inputs must still be readable.

    Returns:
        The :class:`Dataset`; ``info`` holds the source, target and input column names
        (``header`` says whether they come from a header row; else they are indices), the
        target's column index, seed and, for classification, the original labels in
        ``info["classes"]``.

    Raises:
        ValueError: unknown task or file type, unreadable file (see :func:`read_table`),
            missing or duplicate target column, fewer than 2 data rows, empty or non-numeric
            inputs, NaN or inf in inputs or targets, bad labels.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")
    if not isinstance(target, str | int) or isinstance(target, bool):
        raise ValueError(f"target must be a column name or an integer index; got {target!r}")
    path = Path(path)
    table = _read(path, delimiter, header, target, labels=task == "classification",
                  label_file=labels)
    names, width, num_rows = table.names, table.width, table.num_rows
    if labels is not None and str(target) not in ("-1", str(width - 1)):
        raise ValueError(f"{path}: with a labels file the target is the labels (-1); got target "
                         f"{target!r}")
    if num_rows < 2:
        raise ValueError(f"{path} has {num_rows} data row; at least 2 are needed to split")
    if width < 2:
        layout = (f" ({_NAMES.get(table.delimiter)}-separated)" if table.delimiter is not None
                  else "")
        raise ValueError(f"{path} has a single column{layout}; it needs the target and at "
                         "least one input column")
    col = target_index(target, names, width, table.header_note if names is None else "")
    inputs = [j for j in range(width) if j != col]
    labels = names or [str(j) for j in range(width)]
    x = table.numeric(path, inputs)
    if dates is not None:
        date_col = target_index(dates, names, width, "")
        if date_col == col:
            raise ValueError(f"{path}: the dates column {labels[date_col]!r} is the target")
        k = inputs.index(date_col)
        x[:, k] = decimal_years(x[:, k], where=f"{path}: the dates column {labels[date_col]!r}")
    if missing_target == "drop":
        x, y, classes = _drop_missing(path, table, col, task, labels[col], x)
        num_rows = len(y)
    else:
        y, classes = table.targets(path, col, task)
    if classes is not None:  # a continuous target is not one class per distinct value
        check_class_labels(classes, num_rows, name=f"{path}: the target column {labels[col]!r}")
    item_shape = getattr(table, "item_shape", None)
    del table  # the file's columns: x and y hold what is needed
    if task == "regression":
        _warn_if_labels(path, labels[col], y)
    if num_rows < 2:
        raise ValueError(f"{path} has {num_rows} data row with a target; at least 2 are needed")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    train_idx, test_idx = (ordered_split(num_rows, test_fraction) if split == "last"
                           else random_split(num_rows, test_fraction, seed))
    if train_idx.numel() < 2:
        raise ValueError(f"{path} has {num_rows} data rows: too few for at least 2 "
                         f"training rows and 1 test row (test_fraction {test_fraction:g})")
    info: dict[str, Any] = {"source": str(path), "target": labels[col],
                            "columns": [labels[j] for j in inputs], "seed": seed,
                            "test_fraction": test_fraction, "header": names is not None,
                            "target_index": col, "num_columns": width}
    if classes is not None:
        info["classes"] = classes
    if item_shape is not None:
        info["item_shape"] = list(item_shape)
    x = torch.from_numpy(x)
    data = standardized_dataset(path.name.split(".")[0], x, y, train_idx, test_idx, task=task,
                                num_classes=len(classes) if classes else None, dtype=dtype,
                                info=info, standardize_x=standardize_x)
    _warn_if_dropped(path, data, x[train_idx[:1]])
    return data


def _drop_missing(path: Path, table: Table, col: int, task: str, name: str,
                  x: np.ndarray) -> tuple[np.ndarray, torch.Tensor, None]:
    """The inputs and targets of the rows with a target, warning how many rows had none."""
    if task == "classification":
        raise ValueError(f"{path}: missing_target='drop' applies to a numeric target "
                         "(regression or counts), not to class labels")
    values = table.target_values(path, col)
    keep = ~np.isnan(values)
    locate = table.locator()
    for bad, why in ((np.isinf(values), "holds inf"),
                     (keep & ((values < 0) | (values != np.round(values))) if task == "counts"
                      else np.zeros_like(keep), "holds counts that are not non-negative integers")):
        if bad.any():
            raise ValueError(f"{path}: the target column {name!r} {why} on "
                             f"{locate(np.flatnonzero(bad)[:5].tolist())}")
    y = values[keep]
    dropped = np.flatnonzero(~keep)
    if len(dropped):
        where = locate(dropped[:5].tolist())
        warnings.warn(f"{path}: dropped {len(dropped):,} row{'s' if len(dropped) > 1 else ''} "
                      f"without a value in the target column {name!r} ({where}"
                      f"{', ...' if len(dropped) > 5 else ''}) of {len(values):,}",
                      UserWarning, stacklevel=3)
    return np.ascontiguousarray(x[keep]), torch.from_numpy(np.ascontiguousarray(y)), None


def _warn_if_dropped(path: Path, data: Dataset, first: torch.Tensor) -> None:
    """Warn naming the input columns dropped as constant on the training rows (``first``: the
    first training row, whose values they all hold)."""
    dropped = data.transform.dropped_columns if data.transform is not None else ()
    if not dropped:
        return
    names = data.info["columns"]
    shown = ", ".join(f"{names[j]!r} (every value {float(first[0, j]):.17g})" for j in dropped)
    big = [names[j] for j in dropped if abs(float(first[0, j])) >= 2.0 ** 53]
    hint = (f"; {', '.join(map(repr, big))} holds numbers of magnitude 2**53 or more, whose "
            "float64 values can be equal although their digits differ: subtract an offset "
            "(say the column's minimum) in the file to keep it") if big else ""
    warnings.warn(f"{path}: dropped the input column{'s' if len(dropped) > 1 else ''} "
                  f"{shown}: constant on the training rows, so no information for the "
                  f"model{hint}", UserWarning, stacklevel=3)


LABEL_LIKE_MAX = 10
"""A regression target whose first :data:`LABEL_SAMPLE` values are at most this many distinct
integers looks like class labels (or counts): :func:`load_csv` warns."""
LABEL_SAMPLE = 100_000


def _warn_if_labels(path: Path, name: str, y: torch.Tensor) -> None:
    """Warn when the regression target ``y`` looks like class labels: few distinct integers
    (the default task is regression, so 0/1 labels would otherwise be fitted as numbers)."""
    head = y[:LABEL_SAMPLE]
    if head.numel() < 10:
        return
    values = torch.unique(head)
    if values.numel() > LABEL_LIKE_MAX or not bool((values == values.round()).all()):
        return
    shown = ", ".join(f"{v:g}" for v in values.tolist())
    where = "" if head.numel() == y.numel() else f" among its first {head.numel():,} values"
    warnings.warn(f"{path}: the target column {name!r} holds only {values.numel()} distinct "
                  f"integer values{where} ({shown}) and is fitted as a regression target; for "
                  "class labels pass task='classification' (--task classification), for counts "
                  "task='counts' (--task counts)", UserWarning, stacklevel=3)


load_table = load_csv  # the same loader under a name that does not suggest one format
