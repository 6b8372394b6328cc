"""What each field of a saved model must hold, checked when it is loaded.

A file's checksum tells damage apart from what gpscale wrote, but anyone can write a file with
a valid checksum (:mod:`gpscale.io`): a field of the wrong type, a NaN parameter or a summary
that is not one would otherwise pass ``gpscale.load`` and fail later, in ``predict``, with an
error that names neither the file nor the field. Each check here raises a :class:`FieldError`
naming the field (``model.data``, ``transform``, ``info.feature_names``, ...); :mod:`gpscale.io`
reports it as a :class:`~gpscale.errors.SavedFileError` naming the file.

The ``info`` fields checked are those ``gpscale fit`` writes and ``gpscale predict`` reads
(:data:`INFO_FIELDS`); any other ``info`` entry is free-form.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

import torch
from torch import Tensor, nn

from gpscale.methods.base import Method

__all__ = ["FieldError", "INFO_FIELDS", "check_model_fields", "check_parameters",
           "check_saved"]


class FieldError(ValueError):
    """A field of a saved model holds what it cannot (the message names the field)."""


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def _wrong(field: str, value: Any, expected: str) -> FieldError:
    return FieldError(f"its field {field!r} holds {_kind(value)}, not {expected} (edited, or "
                      "written by another program?)")


def _is_int(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


_MODEL_FIELDS = {  # field: (test, what it must be)
    "key": (lambda v: isinstance(v, str), "a method key (text)"),
    "num_dims": (lambda v: _is_int(v, 1), "a positive integer"),
    "task": (lambda v: isinstance(v, str), "a task name (text)"),
    "num_classes": (lambda v: v is None or _is_int(v, 1), "a positive integer or nothing"),
    "options": (lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
                "a dict of options"),
    "dtype": (lambda v: isinstance(v, str) and isinstance(getattr(torch, v, None), torch.dtype),
              "a torch dtype name"),
    "state_dict": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(t, Tensor) for k, t in v.items()),
        "a dict of tensors"),
}


def check_model_fields(model: Any) -> None:
    """The ``model`` entry of a saved file: a dict of the fields that rebuild the module."""
    if not isinstance(model, dict):
        raise _wrong("model", model, "a dict")
    for name, (test, expected) in _MODEL_FIELDS.items():
        if name not in model:
            raise FieldError(f"its field 'model.{name}' is missing (edited, or written by "
                             "another program?)")
        if not test(model[name]):
            raise _wrong(f"model.{name}", model[name], expected)


def check_parameters(module: nn.Module) -> None:
    """Every parameter finite, and no buffer NaN (constraint bounds may be infinite). A GPyTorch
    raw parameter may be −∞ where its constraint maps that to a positive bound: a noise
    variance started at its floor (a pre-fit that ended there) has the raw value −∞."""
    for name, p in module.named_parameters():
        if not _usable(module, name, p.detach()):
            raise FieldError(f"its parameter {name!r} holds NaN or inf: a model with "
                             "non-finite parameters cannot predict (train it again)")
    for name, b in module.named_buffers():
        if b.is_floating_point() and bool(torch.isnan(b).any()):
            raise FieldError(f"its buffer {name!r} holds NaN (edited, or written by another "
                             "program?)")


def _usable(module: nn.Module, name: str, value: Tensor) -> bool:
    """Every entry finite, or infinite in a GPyTorch raw parameter whose constraint
    (``raw_x`` → ``raw_x_constraint``) maps it to a finite positive bound."""
    finite = torch.isfinite(value)
    if bool(finite.all()):
        return True
    owner, _, attr = name.rpartition(".")
    constraint = getattr(module.get_submodule(owner), attr + "_constraint", None)
    transform = getattr(constraint, "transform", None)
    if transform is None or bool(torch.isnan(value).any()):
        return False
    used = transform(value)
    return bool((finite | (torch.isfinite(used) & (used > 0))).all())


INFO_FIELDS = {  # field: (test, what it must be); each may also be missing or None
    "feature_names": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
                      "a list of column names"),
    "num_features": (lambda v: _is_int(v, 1), "a positive integer"),
    "target_name": (lambda v: isinstance(v, str), "a column name"),
    "target_index": (lambda v: _is_int(v), "a column index"),
    "num_columns": (lambda v: _is_int(v, 1), "a positive integer"),
    "classes": (lambda v: isinstance(v, list) and all(
        isinstance(c, str | int | float) for c in v), "a list of class labels"),
}


def check_saved(model: Method, data: Any, summary: Any, transform: Any, info: Any) -> None:
    """The fields beside the module: training data, summary, raw-data transform and info.

    Args:
        model: the rebuilt method (``num_dims``, ``summary_types``, ...).
        data: the ``model.data`` field; summary: ``model.summary`` as rebuilt from records;
        transform: the ``transform`` field; info: the ``info`` field.
    """
    _check_data(model, data)
    _check_summary(model, summary)
    if data is None and summary is None and model.needs_data_for_prediction:
        raise FieldError(f"its fields 'model.data' and 'model.summary' are both empty; method "
                         f"{model.method_key!r} predicts from its training data or their "
                         "summary (edited, or written by another program?)")
    num_inputs = _check_transform(model, transform)
    _check_info(model, info, num_inputs)


def _check_data(model: Method, data: Any) -> None:
    if data is None:
        return
    if not (isinstance(data, tuple | list) and len(data) == 2
            and all(isinstance(t, Tensor) for t in data)):
        raise _wrong("model.data", data, "two tensors (x, y) or nothing")
    x, y = data
    if not x.is_floating_point() or x.dim() != 2 or x.shape[1] != model.num_dims or not len(x):
        raise FieldError(f"its field 'model.data' holds x of shape {tuple(x.shape)} and dtype "
                         f"{x.dtype} where floating-point rows of {model.num_dims} inputs were "
                         "expected (edited, or written by another program?)")
    if y.dim() == 0 or y.shape[0] != x.shape[0]:
        raise FieldError(f"its field 'model.data' holds {x.shape[0]} rows of x but y of shape "
                         f"{tuple(y.shape)}")
    for name, t in (("x", x), ("y", y)):
        if not bool(torch.isfinite(t).all()):
            raise FieldError(f"its field 'model.data' holds NaN or inf in {name}")


def _check_summary(model: Method, summary: Any) -> None:
    if summary is None:
        return
    expected = " or ".join(t.__name__ for t in model.summary_types) or "nothing"
    if not model.summary_types or not isinstance(summary, model.summary_types):
        raise _wrong("model.summary", summary, expected)
    _check_record(summary, "model.summary")


def _check_record(value: Any, field: str) -> None:
    """The fields of a dataclass hold what its annotations say (nested dataclasses too)."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return
    hints = typing.get_type_hints(type(value))
    for f in dataclasses.fields(value):
        item = getattr(value, f.name)
        allowed = _classes(hints.get(f.name))
        if allowed is not None and not isinstance(item, allowed):
            raise _wrong(f"{field}.{f.name}", item,
                         " or ".join(c.__name__ for c in allowed if c is not int or
                                     float not in allowed))
        _check_record(item, f"{field}.{f.name}")


def _classes(hint: Any) -> tuple[type, ...] | None:
    """The classes an annotation admits, or None when it cannot be checked with isinstance."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        parts = [_classes(arg) for arg in typing.get_args(hint)]
        return None if any(p is None for p in parts) else sum(parts, ())  # type: ignore[arg-type]
    if origin is not None:
        return (origin,) if isinstance(origin, type) else None
    if hint is None or hint is type(None):
        return (type(None),)
    if hint is float:
        return (float, int)
    return (hint,) if isinstance(hint, type) else None


def _numbers(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(_is_number(v) for v in value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


TRANSFORM_FIELDS = {  # field: (test, what it must be), as Standardizer.to_dict writes them
    "x_mean": (_numbers, "a list of finite numbers"),
    "x_std": (lambda v: _numbers(v) and all(s > 0 for s in v), "a list of positive numbers"),
    "kept_columns": (lambda v: isinstance(v, list | tuple) and all(_is_int(j) for j in v),
                     "a list of column indices"),
    "num_input_dims": (lambda v: _is_int(v, 1), "a positive integer"),
    "y_mean": (_is_number, "a finite number"),
    "y_std": (lambda v: _is_number(v) and v > 0, "a positive number"),
}


def _check_transform(model: Method, transform: Any) -> int:
    """The raw-data transform (``Standardizer.to_dict()``); returns the number of raw input
    columns it expects."""
    if transform is None:
        return model.num_dims
    if not isinstance(transform, dict):
        raise _wrong("transform", transform, "a dict (the raw-data standardisation) or nothing")
    for name, (test, expected) in TRANSFORM_FIELDS.items():
        if name not in transform:
            raise FieldError(f"its field 'transform.{name}' is missing (edited, or written by "
                             "another program?)")
        if not test(transform[name]):
            raise _wrong(f"transform.{name}", transform[name], expected)
    low = transform.get("x_mean_low", [])
    if not _numbers(low):
        raise _wrong("transform.x_mean_low", low, "a list of finite numbers")
    kept, width = transform["kept_columns"], transform["num_input_dims"]
    sizes = {len(transform["x_mean"]), len(transform["x_std"]), len(kept), len(low) or len(kept)}
    if sizes != {model.num_dims} or any(j >= width for j in kept):
        raise FieldError(f"its field 'transform' standardises {len(kept)} of {width} input "
                         f"columns (x_mean {len(transform['x_mean'])}, x_std "
                         f"{len(transform['x_std'])} values); the model takes {model.num_dims}")
    return width


def _check_info(model: Method, info: Any, num_inputs: int) -> None:
    if info is None:
        return
    if not isinstance(info, dict):
        raise _wrong("info", info, "a dict or nothing")
    for name, (test, expected) in INFO_FIELDS.items():
        value = info.get(name)
        if value is not None and not test(value):
            raise _wrong(f"info.{name}", value, expected)
    num_features, names = info.get("num_features"), info.get("feature_names")
    if num_features is not None and num_features != num_inputs:
        raise FieldError(f"its field 'info.num_features' is {num_features}; the model and its "
                         f"transform take {num_inputs} input columns")
    if names is not None and (len(names) != num_inputs or len(set(names)) != len(names)):
        raise FieldError(f"its field 'info.feature_names' names {len(set(names))} distinct "
                         f"columns; the model and its transform take {num_inputs}")
    classes = info.get("classes")
    if classes is not None and model.num_classes is not None and \
            len(classes) != model.num_classes:
        raise FieldError(f"its field 'info.classes' holds {len(classes)} labels; the model has "
                         f"{model.num_classes} classes")
