"""``gpscale predict``: a saved model applied to the rows of a CSV file.

Columns are matched by name: a model saved by ``gpscale fit`` records the names of its input
columns (the training CSV's header, else ``x0..x{d-1}``), and a file with a header row may hold
them in any order. A missing input column is an error naming it; so is an unknown extra column,
except the training target column (or the ``--target`` column), which is dropped. A file without a
header row is matched by position: it holds the d input columns in training order, or the
training file's d + 1 columns with the target at its training position (or at ``--target``).
A first row that holds exactly the model's column names (numbers, say ``10,20,30``) is the
header even where the file's own rules (:mod:`gpscale.data.head`) would read it as data.

The output columns follow the model's task:

- regression: ``mean`` and ``std`` of y (latent plus noise variance), in the units of the
  training targets;
- classification: ``label`` (the most probable class) and ``p_<class>``, one column per class;
- counts (a Poisson likelihood with a Gaussian latent log-rate f ~ N(μ, σ²)): ``mean``, the
  expected count E[y] = E[exp f] = exp(μ + σ²/2), and ``std``, the standard deviation of the
  predictive count, Var[y] = E[exp f] + Var[exp f] = E[y] + (exp(σ²) − 1) E[y]² (Poisson noise
  plus the uncertainty of the rate): the same two columns as regression, on the count scale.

Nothing non-finite passes: NaN or inf among the inputs (also after standardisation with the
training statistics) or in a prediction is a ``ValueError`` naming the first lines (rows, for
Parquet and ``.npy`` files) where it occurs.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from gpscale.cli.outputs import check_same_run, settle_fit_outputs
from gpscale.data.csv import Table, numeric_columns, read_table
from gpscale.data.transforms import Standardizer
from gpscale.io import load_with_data
from gpscale.validation import check_x, nonfinite_rows

__all__ = ["PredictionTable", "count_moments", "predict_csv", "predict_csv_chunks",
           "read_features"]

CHUNK_ROWS = 65_536
"""Test rows per prediction chunk of ``gpscale predict``."""


@dataclass(frozen=True)
class PredictionTable:
    """Predictions as named columns of equal length."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def to_csv(self) -> str:
        buf = io.StringIO()
        self.write(buf)
        return buf.getvalue()

    def write(self, f: TextIO, header: bool = True) -> None:
        """Write the rows (and the header row) as CSV to the text stream ``f``."""
        writer = csv.writer(f)
        if header:
            writer.writerow(self.columns)
        for row in zip(*self.columns.values(), strict=True):
            writer.writerow([f"{v:.8g}" if isinstance(v, float | np.floating) else v
                             for v in row])

    @staticmethod
    def concat(parts: list[PredictionTable]) -> PredictionTable:
        return PredictionTable({k: np.concatenate([p.columns[k] for p in parts])
                                for k in parts[0].columns})


def read_features(path: str | Path, target: str | None = None, *,
                  feature_names: list[str] | None = None, num_features: int | None = None,
                  train_target: str | None = None,
                  train_target_index: int | None = None) -> np.ndarray:
    """The model's input columns of a CSV file as a float array (rows, d), in training order.

    Args:
        path: the CSV file (delimiter sniffed, header row detected).
        target: a column to drop if present: a header name or an index (``--target``).
        feature_names: the model's input column names, in training order; with a header row
            the columns are matched by these names. ``None``: matched by position.
        num_features: d, the number of input columns the model was trained on.
        train_target: the training target's column name (dropped if present).
        train_target_index: the training target's position in the training file.

    Raises:
        ValueError: unreadable file, no data rows, missing or unknown columns, a column count
            that fits neither d nor d + 1, empty, non-numeric, NaN or inf features.
    """
    return _read_features(path, target, feature_names=feature_names,
                          num_features=num_features, train_target=train_target,
                          train_target_index=train_target_index)[0]


def _read_features(path: str | Path, target: str | None, **model: Any
                   ) -> tuple[np.ndarray, Callable[[list[int]], str]]:
    """:func:`read_features` and a function naming rows by their lines (or rows)."""
    table = read_table(path, items=True)  # an array of images: one flattened row each
    if table.names is None and _is_model_header(table.first_row(), model):
        table = read_table(path, header=0)
    if table.names is not None and model["feature_names"] is not None:
        cols = _columns_by_name(path, table, target, model["feature_names"],
                                model["train_target"])
    else:
        cols = _columns_by_position(path, table, target, model["num_features"],
                                    model["train_target_index"])
    return numeric_columns(path, table, cols), table.locator()


def _is_model_header(row: list[str] | None, model: dict[str, Any]) -> bool:
    """Whether a first data row is the model's training header: its input names, alone or
    with the training target's name, as text (only names can make the cells all match)."""
    names = model["feature_names"]
    if row is None or not names:
        return False
    target = model["train_target"]
    return sorted(row) in (sorted(names), sorted([*names, str(target)]))


def _columns_by_name(path: str | Path, table: Table, target: str | None,
                     feature_names: list[str], train_target: str | None) -> list[int]:
    header = table.names
    drop = {name for name in (target, train_target) if name is not None and name in header}
    index = _index(target, table.width)
    if target is not None and target not in header and index is not None:
        drop.add(header[index])
    inputs = sorted(drop & set(feature_names))
    if inputs:
        raise ValueError(f"--target {target} names the column {inputs[0]!r}, an input of the "
                         f"model (inputs: {_names(feature_names)}; its training target was "
                         f"{train_target!r})")
    missing = [name for name in feature_names if name not in header]
    if missing:
        raise ValueError(f"{path} lacks the input column{_s(missing)} {_names(missing)} the "
                         f"model was trained on (its columns: {_names(header)})")
    extra = [name for name in header if name not in feature_names and name not in drop]
    if extra:
        hint = "" if target is not None else "; pass --target NAME to drop a target column"
        raise ValueError(f"{path} has column{_s(extra)} {_names(extra)} the model was not "
                         f"trained on (its inputs: {_names(feature_names)}){hint}")
    return [header.index(name) for name in feature_names]


def _columns_by_position(path: str | Path, table: Table, target: str | None,
                         num_features: int | None, train_target_index: int | None) -> list[int]:
    width = table.width
    index = _index(target, width)
    if target is not None and index is None and table.names is not None and target in table.names:
        index = table.names.index(target)
    if num_features is None:  # a model of an older format: drop --target, keep the rest
        return [j for j in range(width) if j != index]
    if width == num_features:  # the target is absent
        return list(range(width))
    if width == num_features + 1:
        drop = index if target is not None else train_target_index
        if drop is None:
            raise ValueError(f"{path} has {width} columns, one more than the {num_features} "
                             "input columns of the model, and nothing says which is the "
                             "target; pass --target INDEX to drop it")
        return [j for j in range(width) if j != drop % width]
    raise ValueError(f"{path} has {width} column{_s(range(width))}; the model was trained on "
                     f"{num_features} input columns (give those, in training order, or the "
                     f"training file's {num_features + 1} columns with the target)")


def _index(target: str | None, width: int) -> int | None:
    """``target`` as a column index when it is an integer in range, else None."""
    if target is None or not re.fullmatch(r"-?[0-9]+", target):
        return None
    index = int(target)
    return index % width if -width <= index < width else None


def _s(items: Any) -> str:
    return "s" if len(items) > 1 else ""


def _names(items: list[str], limit: int = 12) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def predict_csv(model_path: str | Path, csv_path: str | Path,
                target: str | None = None) -> PredictionTable:
    """Predict at every row of ``csv_path`` with the model saved by ``gpscale fit``.

    Regression returns ``mean`` and ``std`` of y (latent plus noise) in the units of the
    training targets; classification returns ``label`` and one ``p_<class>`` column per class;
    counts return ``mean`` and ``std`` of the predictive count (module docstring).

    Raises:
        ValueError: what :func:`read_features` raises, and NaN or inf in the standardised
            inputs or the predictions (naming the lines).
    """
    return PredictionTable.concat(list(predict_csv_chunks(model_path, csv_path, target)))


def predict_csv_chunks(model_path: str | Path, csv_path: str | Path, target: str | None = None,
                       chunk_rows: int = CHUNK_ROWS) -> Iterator[PredictionTable]:
    """:func:`predict_csv` as tables of at most ``chunk_rows`` rows, in order: the model's
    predictive of one chunk at a time, so memory beyond the input rows does not grow with
    their number (``gpscale predict`` writes each chunk as it comes).

    A ``model.pt`` in the output folder of ``gpscale fit`` is read as one of that fit's set
    (:mod:`gpscale.cli.outputs`): outputs a killed fit left half made current are completed
    first, and a ``metrics.json`` beside it that belongs to another run is refused."""
    settle_fit_outputs(model_path)
    saved = load_with_data(model_path)
    check_same_run(model_path, saved.info)
    info = saved.info
    transform = None if saved.transform is None else Standardizer.from_dict(saved.transform)
    expected = info.get("num_features") or (transform.num_input_dims if transform is not None
                                            else saved.model.num_dims)
    x, locate = _read_features(
        csv_path, target, feature_names=info.get("feature_names"), num_features=expected,
        train_target=info.get("target_name"), train_target_index=info.get("target_index"))
    x = torch.as_tensor(x)
    if transform is not None:
        x = transform.transform_x(x)
        bad = nonfinite_rows(x)
        if bad:
            raise ValueError(f"{csv_path}: the inputs on {locate(bad)} are beyond float64 once "
                             "standardised with the training statistics (far outside the "
                             "training data); remove or rescale those rows")
    check_x(x, num_dims=saved.model.num_dims)
    dtype = (saved.data[0].dtype if saved.data is not None else
             next(p.dtype for p in saved.model.parameters() if p.is_floating_point()))
    with torch.no_grad():
        state = saved.state()
    for start in range(0, x.shape[0], chunk_rows):
        with torch.no_grad():
            pred = saved.model.predict(state, x[start:start + chunk_rows].to(dtype))
        table = _table(pred, saved, transform)
        bad = nonfinite_rows(*(v for v in table.columns.values() if v.dtype != object))
        if bad:
            raise ValueError(f"{csv_path}: the model predicts NaN or inf on "
                             f"{locate([start + i for i in bad])}; those inputs may lie far "
                             "outside the training data: remove those rows, or refit the model "
                             "with training data that covers them")
        yield table


def _table(pred: Any, saved: Any, transform: Standardizer | None) -> PredictionTable:
    if pred.probs is not None:
        probs = pred.probs.detach().double().numpy()
        classes = saved.info.get("classes") or list(range(probs.shape[1]))
        cols = {"label": np.asarray(classes, dtype=object)[probs.argmax(1)]}
        cols.update({f"p_{c}": probs[:, j] for j, c in enumerate(classes)})
        return PredictionTable(cols)
    if saved.model.task == "counts":
        mean, std = count_moments(pred.mean.detach().double(), pred.variance.detach().double())
        return PredictionTable({"mean": mean.numpy(), "std": std.numpy()})
    mean, var = pred.mean.detach().double(), pred.observed_variance.detach().double()
    if transform is not None:
        return PredictionTable({"mean": transform.inverse_mean(mean).numpy(),
                                "std": transform.inverse_std(var).numpy()})
    return PredictionTable({"mean": mean.numpy(), "std": var.sqrt().numpy()})


def count_moments(mu: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Mean and standard deviation of a Poisson count whose log-rate is f ~ N(mu, var).

    :math:`E[y] = e^{\mu + \sigma^2/2}` (the log-normal mean of the rate) and
    :math:`\mathrm{Var}[y] = E[y] + (e^{\sigma^2} - 1) E[y]^2`, computed as
    :math:`\sqrt{E[y]} \sqrt{1 + E[y] (e^{\sigma^2} - 1)}`, so that the square of a large mean
    does not overflow and a mean that underflows to 0 gives 0.

    Args:
        mu: (t,) latent mean of the log-rate.
        var: (t,) latent variance (≥ 0).

    Returns:
        The (t,) mean and (t,) standard deviation of the count.
    """
    mean = torch.exp(mu + var / 2)
    return mean, mean.sqrt() * torch.sqrt(1 + mean * torch.expm1(var))
