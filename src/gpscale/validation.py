"""Input checks run once, at public entry points (estimators, CLI, ``condition``), and the
check that no NaN or inf prediction leaves an entry point unnoticed."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["check_x", "check_xy", "check_class_labels", "check_num_points", "check_finite_output",
           "nonfinite_rows", "TASKS"]

TASKS = ("regression", "classification", "counts")


def check_x(x: Tensor, *, num_dims: int | None = None, name: str = "X") -> Tensor:
    """Check a 2-D, finite input array; with ``num_dims`` also its feature count."""
    if x.dim() == 1:
        raise ValueError(f"{name} must be 2-D (n, d); got a 1-D array of length {x.shape[0]}. "
                         "Reshape a single feature with x.reshape(-1, 1).")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (n, d); got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} has no rows")
    if not torch.is_floating_point(x):
        raise ValueError(f"{name} must be a floating-point tensor; got {x.dtype}")
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        rows = torch.nonzero(bad.any(1)).flatten()[:5].tolist()
        raise ValueError(f"{name} contains NaN or inf values (first rows: {rows}); "
                         "remove or impute those rows")
    if num_dims is not None and x.shape[1] != num_dims:
        raise ValueError(f"{name} has {x.shape[1]} features, but the model was fitted with "
                         f"{num_dims}")
    return x


def check_xy(x: Tensor, y: Tensor, *, task: str = "regression",
             num_classes: int | None = None) -> tuple[Tensor, Tensor]:
    """Check inputs and targets for ``task`` ('regression', 'classification' or 'counts')."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")
    check_x(x)
    if y.dim() != 1:
        raise ValueError(f"y must be 1-D (n,); got shape {tuple(y.shape)}")
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"X has {x.shape[0]} rows but y has {y.shape[0]} entries; "
                         "they must have the same length")
    yf = y.double()
    bad = ~torch.isfinite(yf)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten()[:5].tolist()
        raise ValueError(f"y contains NaN or inf values (first rows: {rows}); remove or impute "
                         "them before fitting")
    if task == "classification":
        if bool((yf != yf.round()).any()) or bool((yf < 0).any()):
            raise ValueError("classification labels must be integers in 0..C-1")
        if num_classes is not None and bool((yf > num_classes - 1).any()):
            raise ValueError(f"labels must lie in 0..{num_classes - 1} for {num_classes} "
                             f"classes; found label {int(yf.max())}")
    if task == "counts":
        if bool((yf < 0).any()):
            raise ValueError("count targets must be non-negative; found "
                             f"{float(yf.min())}")
        if bool((yf != yf.round()).any()):
            raise ValueError("count targets must be integers for a Poisson likelihood")
    return x, y


_REGRESSION = "fit it as a regression (GPRegressor, --task regression)"


def check_class_labels(classes: Sequence[Any], num_rows: int, *, name: str = "y") -> None:
    """Refuse a target that is not class labels, before one class per distinct value is made.

    Numbers with a fractional part are a continuous target passed as labels (scikit-learn's
    ``check_classification_targets`` refuses them, and so does ``GPClassifier``). So are more
    classes than half the rows: most classes would then hold a single row, nothing a classifier
    can learn from (an identifier column, or a regression target of integers).

    Args:
        classes: the distinct labels (numbers, or text as read from a file).
        num_rows: the rows the labels come from.
        name: what holds the labels, for the message (``"y"``, ``"FILE: the target column 'y'"``).

    Raises:
        ValueError: naming ``name`` and why; it suggests regression.
    """
    values = [_label_number(c) for c in classes]
    if len(values) > 0 and all(v is not None for v in values):
        fractional = [c for c, v in zip(classes, values, strict=True)
                      if v is not None and math.isfinite(v) and not v.is_integer()]
        if fractional:
            shown = ", ".join(str(c) for c in fractional[:3]) + ", ..." * (len(fractional) > 3)
            raise ValueError(f"{name} holds numbers with a fractional part ({shown}): a "
                             f"continuous target, not class labels; {_REGRESSION}")
    if len(classes) > num_rows // 2:
        raise ValueError(f"{name} has {len(classes):,} distinct values in {num_rows:,} rows: "
                         f"fewer than 2 rows per class, so not class labels; {_REGRESSION}")


def _label_number(label: Any) -> float | None:
    """A label's value when it is a real number (or the text of one), else ``None``."""
    if isinstance(label, bool | np.bool_):
        return None
    if isinstance(label, numbers.Real):
        return float(label)
    if isinstance(label, str):
        try:
            return float(label)
        except ValueError:
            return None
    return None


def check_num_points(n: int, needed: int, what: str) -> None:
    """Raise when there are fewer training points than ``needed`` (inducing points, actions)."""
    if n < needed:
        raise ValueError(f"{n} training points are fewer than the {needed} {what}; "
                         f"use at most {n} {what} or more data")


def nonfinite_rows(*arrays: Any) -> list[int]:
    """The rows (0-based) where any of ``arrays`` (NumPy arrays or tensors of equal length,
    each (t,) or (t, ...)) holds NaN or inf."""
    bad = np.zeros(len(arrays[0]), dtype=bool)
    for a in arrays:
        a = a.detach().cpu().numpy() if isinstance(a, Tensor) else np.asarray(a)
        bad |= ~np.isfinite(a).reshape(len(a), -1).all(1)
    return np.flatnonzero(bad).tolist()


def check_finite_output(*outputs: Any, what: str, rows_of: str = "X") -> None:
    """Raise when a prediction is NaN or inf, naming the first rows (0-based) of ``rows_of``.

    Args:
        *outputs: the predicted arrays, each (t,) or (t, k).
        what: what was predicted, for the message (``"predictive mean or std"``).
        rows_of: the input whose rows the outputs follow.

    Raises:
        ValueError: some row of the outputs is not finite.
    """
    bad = nonfinite_rows(*outputs)
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ValueError(f"the {what} is NaN or inf for rows {bad[:5]}{more} of {rows_of} "
                         "(0-based); those inputs may lie far outside the training data: "
                         "remove them, or fit on data that covers them")
