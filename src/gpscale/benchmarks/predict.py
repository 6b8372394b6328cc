"""``gpscale predict``: a saved model applied to the rows of a CSV file."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpscale.data.transforms import Standardizer
from gpscale.io import load_with_data
from gpscale.validation import check_x

__all__ = ["PredictionTable", "predict_csv", "read_features"]


@dataclass(frozen=True)
class PredictionTable:
    """Predictions as named columns of equal length."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(self.columns)
        for row in zip(*self.columns.values(), strict=True):
            writer.writerow([f"{v:.8g}" if isinstance(v, float | np.floating) else v
                             for v in row])
        return buf.getvalue()


def read_features(path: str | Path, target: str | None = None) -> np.ndarray:
    """Numeric CSV rows as a float array; a header row is detected; ``target`` is dropped."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    if not rows:
        raise ValueError(f"{path} has no rows")
    header = None
    try:
        [float(v) for v in rows[0]]
    except ValueError:
        header, rows = rows[0], rows[1:]
    if target is not None:
        if header is not None and target in header:
            drop = header.index(target)
        elif target.lstrip("-").isdigit():
            drop = int(target) % len(rows[0])
        else:
            raise ValueError(f"target column {target!r} is not in the header {header}")
        rows = [r[:drop] + r[drop + 1:] for r in rows]
    try:
        return np.asarray(rows, dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"{path}: every feature must be numeric ({err})") from None


def predict_csv(model_path: str | Path, csv_path: str | Path,
                target: str | None = None) -> PredictionTable:
    """Predict at every row of ``csv_path`` with the model saved by ``gpscale fit``.

    Regression returns ``mean`` and ``std`` of y (latent plus noise) in the units of the
    training targets; classification returns ``label`` and one ``p_<class>`` column per class.
    """
    saved = load_with_data(model_path)
    x = torch.as_tensor(read_features(csv_path, target))
    expected = saved.info.get("num_features")
    if expected is not None and x.shape[1] != expected:
        raise ValueError(f"{csv_path} has {x.shape[1]} feature columns but the model was "
                         f"trained on {expected}; pass --target to drop the target column")
    transform = None if saved.transform is None else Standardizer.from_dict(saved.transform)
    if transform is not None:
        x = transform.transform_x(x)
    check_x(x, num_dims=saved.model.num_dims)
    train_x, train_y = saved.data
    dtype = train_x.dtype
    with torch.no_grad():
        pred = saved.model.predict(saved.model.condition(train_x, train_y), x.to(dtype))
    if pred.probs is not None:
        probs = pred.probs.double().numpy()
        classes = saved.info.get("classes") or list(range(probs.shape[1]))
        cols = {"label": np.asarray(classes, dtype=object)[probs.argmax(1)]}
        cols.update({f"p_{c}": probs[:, j] for j, c in enumerate(classes)})
        return PredictionTable(cols)
    mean, var = pred.mean.double(), pred.observed_variance.double()
    if transform is not None:
        mean, var = transform.inverse_mean(mean), transform.inverse_variance(var)
    return PredictionTable({"mean": mean.numpy(), "std": var.sqrt().numpy()})
