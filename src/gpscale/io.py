"""Saving and loading fitted models: ``gpscale.save`` / ``gpscale.load``.

A saved file is a ``torch.save`` dictionary holding the method key, input dimension, task, the
resolved constructor options (``model.options``), the state dict and, for methods whose prediction
conditions on training data, that data. Loading rebuilds the module through the registry and loads
the state dict, so predictions are identical. Estimators are saved with their parameters,
standardising transform and training data. Files are pickles: load only files you trust.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpscale.methods.base import Method

__all__ = ["save", "load", "load_with_data", "SavedModel", "model_payload", "model_from_payload"]

FORMAT = "gpscale-1"


def model_payload(model: Method, data: tuple[Tensor, Tensor] | None = None) -> dict[str, Any]:
    """Everything needed to rebuild ``model`` (and condition it, when it needs data)."""
    if not hasattr(model, "method_key"):
        raise ValueError("only models built with gpscale.methods.build can be saved")
    if model.needs_data_for_prediction and data is None:
        raise ValueError(f"method {model.method_key!r} conditions on its training data to "
                         "predict; pass data=(x, y) to save it with the model")
    return {
        "key": model.method_key,
        "num_dims": model.num_dims,
        "task": model.task,
        "num_classes": model.num_classes,
        "options": dict(model.options),
        "dtype": str(next(iter(model.state_dict().values())).dtype).replace("torch.", ""),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "data": None if data is None else tuple(t.detach().cpu() for t in data),
    }


def model_from_payload(payload: dict[str, Any]) -> Method:
    from gpscale.methods.registry import build

    model = build(payload["key"], payload["num_dims"], task=payload["task"],
                  num_classes=payload["num_classes"], init=None, **payload["options"])
    model.to(getattr(torch, payload["dtype"]))
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return model


def save(obj: Any, path: str | Path, *, data: tuple[Tensor, Tensor] | None = None,
         transform: dict[str, Any] | None = None, info: dict[str, Any] | None = None) -> Path:
    """Save a fitted Method or a fitted gpscale estimator.

    Args:
        obj: a Method built through the registry, or a fitted ``GPRegressor``/``GPClassifier``.
        data: for a Method, the (standardised) training data it conditions on to predict.
        transform: for a Method, ``Standardizer.to_dict()`` of the raw-data transform, so that
            ``gpscale predict`` can take raw features.
        info: free-form JSON-like description (dataset, split, metrics).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(obj, Method):
        payload = {"format": FORMAT, "kind": "method", "model": model_payload(obj, data),
                   "transform": transform, "info": dict(info or {})}
    elif hasattr(obj, "_to_payload"):
        payload = {"format": FORMAT, "kind": "estimator", **obj._to_payload()}
    else:
        raise TypeError(f"cannot save a {type(obj).__name__}; expected a Method or estimator")
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def _read(path: str | Path) -> dict[str, Any]:
    payload = torch.load(Path(path), map_location="cpu", weights_only=False)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a gpscale model file (format {FORMAT})")
    return payload


def load(path: str | Path) -> Any:
    """Load what :func:`save` wrote: the Method or the estimator."""
    payload = _read(path)
    if payload["kind"] == "method":
        return model_from_payload(payload["model"])
    from gpscale.estimators import estimator_from_payload

    return estimator_from_payload(payload)


@dataclass(frozen=True)
class SavedModel:
    """A saved Method with what was stored beside it."""

    model: Method
    data: tuple[Tensor, Tensor] | None
    transform: dict[str, Any] | None
    info: dict[str, Any]


def load_with_data(path: str | Path) -> SavedModel:
    """Load a saved Method with its training data, raw-data transform and info."""
    payload = _read(path)
    if payload["kind"] != "method":
        raise ValueError(f"{path} holds an estimator; use gpscale.load")
    return SavedModel(model_from_payload(payload["model"]), payload["model"]["data"],
                      payload.get("transform"), payload.get("info", {}))
