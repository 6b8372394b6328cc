"""Load any delimited text file (optionally gzipped) as a :class:`Dataset`.

The target is chosen by column name (when the file has a header row) or by integer index; every
other column is an input and must be numeric. Rows are split at random (seeded) and standardised
with training statistics only, exactly like the UCI sets: x always, y only for regression. Class
labels (any strings or numbers) are mapped to 0..C-1 in sorted order (numeric order when all
labels are numbers); the original labels are kept in ``info["classes"]``.
"""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpscale.data.datasets import TASKS, Dataset, standardized_dataset
from gpscale.data.splits import random_split

__all__ = ["load_csv"]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_rows(path: Path, delimiter: str) -> list[list[str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as stream:
        text = stream.read()
    rows = [[field.strip() for field in row] for row in csv.reader(io.StringIO(text),
                                                                      delimiter=delimiter)]
    rows = [row for row in rows if any(row)]
    if not rows:
        raise ValueError(f"{path} is empty")
    width = len(rows[0])
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"{path}: row {i + 1} has {len(row)} fields, row 1 has {width}")
    return rows


def _has_header(rows: list[list[str]]) -> bool:
    """A first row is a header when some column is numeric below it but not in it."""
    below = rows[1:6]
    if not below:
        return not all(_is_number(v) for v in rows[0])
    return any(not _is_number(rows[0][j]) and all(_is_number(r[j]) for r in below)
               for j in range(len(rows[0])))


def _target_index(target: str | int, names: list[str] | None, width: int) -> int:
    if isinstance(target, str) and (names is None or target not in names):
        if target.lstrip("-").isdigit():
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


def _targets(values: list[str], task: str) -> tuple[torch.Tensor, list[str] | None]:
    if task == "classification":
        classes = sorted(set(values), key=(lambda v: (float(v), v)) if all(
            _is_number(v) for v in values) else None)
        if len(classes) < 2:
            raise ValueError(f"classification needs at least 2 classes; found {classes}")
        code = {label: c for c, label in enumerate(classes)}
        return torch.tensor([code[v] for v in values], dtype=torch.long), classes
    bad = next((i for i, v in enumerate(values) if not _is_number(v)), None)
    if bad is not None:
        raise ValueError(f"target value {values[bad]!r} in data row {bad + 1} is not a number; "
                         "use task='classification' for class labels")
    y = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if task == "counts" and bool(((y < 0) | (y != y.round())).any()):
        raise ValueError("counts must be non-negative integers")
    return y, None


def load_csv(path: str | Path, target: str | int, *, task: str = "regression",
             test_fraction: float = 0.1, seed: int = 0, header: str | int | None = "infer",
             delimiter: str = ",", dtype: torch.dtype = torch.float64) -> Dataset:
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
        delimiter: field separator.
        dtype: floating dtype of x (and of y for regression and counts).

    Returns:
        The :class:`Dataset`; ``info`` holds the source, target and input column names, seed and,
        for classification, the original labels in ``info["classes"]``.

    Raises:
        ValueError: unknown task, missing target column, non-numeric inputs, bad labels.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")
    if header not in ("infer", None, 0):
        raise ValueError(f"header must be 'infer', None or 0; got {header!r}")
    path = Path(path)
    rows = _read_rows(path, delimiter)
    has_header = header == 0 or (header == "infer" and _has_header(rows))
    names = rows.pop(0) if has_header else None
    if len(rows) < 2:
        raise ValueError(f"{path} has {len(rows)} data rows; at least 2 are needed to split")
    width = len(rows[0])
    col = _target_index(target, names, width)
    inputs = [j for j in range(width) if j != col]
    labels = names or [str(j) for j in range(width)]
    try:
        x = np.array([[float(row[j]) for j in inputs] for row in rows], dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"{path}: input columns must be numeric ({err})") from None
    y, classes = _targets([row[col] for row in rows], task)
    train_idx, test_idx = random_split(len(rows), test_fraction, seed)
    info: dict[str, Any] = {"source": str(path), "target": labels[col],
                            "columns": [labels[j] for j in inputs], "seed": seed,
                            "test_fraction": test_fraction}
    if classes is not None:
        info["classes"] = classes
    return standardized_dataset(path.name.split(".")[0], torch.from_numpy(x), y, train_idx,
                                test_idx, task=task,
                                num_classes=len(classes) if classes else None, dtype=dtype,
                                info=info)
