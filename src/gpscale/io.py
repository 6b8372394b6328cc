"""Saving and loading fitted models: ``gpscale.save`` / ``gpscale.load``.

A saved file holds the method key, input dimension, task, the resolved constructor options
(``model.options``), the state dict and, for methods whose prediction conditions on training
data, that data (or the method's summary of it). Loading rebuilds the module through the registry
and loads the state dict, so predictions are identical. Estimators are saved with their
parameters, standardising transform and training data.

Files hold data only (:mod:`gpscale.files`: safetensors for the tensors, JSON for the rest), so
loading a file from a stranger cannot run code. Files of the earlier, pickled formats (format
versions 1 and 2) are refused with a line naming ``gpscale convert OLD NEW --trust``:
:func:`convert` is the one place that unpickles, and only when told the file is trusted.

File integrity (also for the training checkpoints of ``training.fit``): every file carries a
format marker, a format version, its kind (``method``, ``estimator``, ``checkpoint``) and the
SHA-256 of its content (:func:`payload_digest`: tensors by dtype, shape and bytes, other values by
type and value). :func:`read_file` checks all of them, so an empty, truncated, partly overwritten
or foreign file is a :class:`~gpscale.errors.SavedFileError` (a ``ValueError``) naming the file
and the problem, never a model with silently wrong parameters. The digest guards against damage,
not against a forger (who can recompute it); safety against a forger comes from the format, and
from :mod:`gpscale.saved_fields`, which checks on load what each field holds (types, shapes, no
NaN or inf parameters), so that a crafted file is refused by ``load`` with a line naming the file
and the field rather than failing later in ``predict``. Only regular files are read (a named pipe
or a device is refused before it is opened), and no further than their header allows
(:func:`gpscale.files.read_bytes`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpscale.errors import NumericalError, SavedFileError
from gpscale.files import (
    FormatError,
    LegacyFormatError,
    Record,
    atomic_write,
    decode,
    encode,
    read_bytes,
)
from gpscale.files import rebuild as rebuild_records
from gpscale.methods.base import Method
from gpscale.regular_files import NotRegularFileError, read_regular
from gpscale.saved_fields import FieldError, check_model_fields, check_parameters, check_saved

__all__ = ["save", "load", "load_with_data", "SavedModel", "model_payload", "model_from_payload",
           "payload_digest", "write_file", "read_file", "register_loader", "convert"]

MAGIC = "gpscale"  # the format marker of every file gpscale writes
VERSION = 3  # 3: data-only files (gpscale.files); 2: pickled with a SHA-256; 1: pickled
LEGACY_FORMAT = "gpscale-1"  # model files of version 1 (pickled, no checksum): convert only
_META = ("format", "version", "kind", "sha256")
_WHAT = {"method": "a saved model", "estimator": "a saved estimator",
         "checkpoint": "a training checkpoint"}


def model_payload(model: Method, data: tuple[Tensor, Tensor] | None = None,
                  summary: Any = None) -> dict[str, Any]:
    """Everything needed to rebuild ``model`` and its prediction state: the training data it
    conditions on, or the ``summary`` (``model.summary(state)``) that replaces them."""
    if not hasattr(model, "method_key"):
        raise ValueError("only models built with gpscale.methods.build can be saved")
    if model.needs_data_for_prediction and data is None and summary is None:
        raise ValueError(f"method {model.method_key!r} conditions on its training data to "
                         "predict; pass data=(x, y) to save it with the model")
    own = [k for k, v in model.options.items() if isinstance(v, torch.nn.Module)]
    if own:
        raise ValueError(f"the option {own[0]!r} holds a {type(model.options[own[0]]).__name__} "
                         "object of your own, which gpscale's data-only file cannot hold: "
                         "write the kernel as an expression (guide: kernels) to save the "
                         "model, or keep the object and pickle the model yourself")
    return {
        "key": model.method_key,
        "num_dims": model.num_dims,
        "task": model.task,
        "num_classes": model.num_classes,
        "options": dict(model.options),
        "dtype": str(next(iter(model.state_dict().values())).dtype).replace("torch.", ""),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "data": None if data is None else tuple(t.detach().cpu() for t in data),
        "summary": summary,
    }


def model_from_payload(payload: dict[str, Any]) -> Method:
    """The module a :func:`model_payload` describes, its fields and parameters checked.

    Raises:
        gpscale.saved_fields.FieldError: a field of the wrong type, or a parameter that is
            NaN or inf.
    """
    from gpscale.methods.registry import build, get_spec

    check_model_fields(payload)
    options = {**get_spec(payload["key"]).saved_defaults, **payload["options"]}
    model = build(payload["key"], payload["num_dims"], task=payload["task"],
                  num_classes=payload["num_classes"], init=None, **options)
    model.to(getattr(torch, payload["dtype"]))
    model.load_state_dict(payload["state_dict"])
    check_parameters(model)
    model.eval()
    return model


def save(obj: Any, path: str | Path, *, data: tuple[Tensor, Tensor] | None = None,
         transform: dict[str, Any] | None = None, info: dict[str, Any] | None = None,
         summary: Any = None) -> Path:
    """Save a fitted Method or a fitted gpscale estimator.

    Args:
        obj: a Method built through the registry, or a fitted ``GPRegressor``/``GPClassifier``.
        data: for a Method, the (standardised) training data it conditions on to predict.
        transform: for a Method, ``Standardizer.to_dict()`` of the raw-data transform, so that
            ``gpscale predict`` can take raw features.
        info: free-form JSON-like description (dataset, split, metrics).
        summary: for a Method that summarises its data (SoftKI, GGP), ``model.summary(state)``
            of its prediction state: saved instead of ``data``, so the file's size does not
            grow with n and it predicts without the training set.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(obj, Method):
        kind, content = "method", {"model": model_payload(obj, data, summary),
                                   "transform": transform,
                                   "info": dict(info or {})}
    elif hasattr(obj, "_to_payload"):
        kind, content = "estimator", obj._to_payload()
    else:
        raise TypeError(f"cannot save a {type(obj).__name__}; expected a Method or estimator")
    return write_file(path, kind, content)


def load(path: str | Path) -> Any:
    """Load what :func:`save` wrote: the Method or the estimator.

    Raises:
        SavedFileError: the file is empty, truncated, corrupt, not a gpscale model file,
            holds a model that cannot be rebuilt or a field that holds what it cannot
            (:mod:`gpscale.saved_fields`: the message names the field).
    """
    payload = read_file(path, ("method", "estimator"))
    if payload["kind"] == "method":
        return _saved_model(path, payload).model
    if "estimator" not in _LOADERS:  # registered by gpscale.estimators, which gpscale imports
        raise SavedFileError(path, "holds a fitted estimator; import gpscale.estimators first")
    return _rebuild(path, lambda: _LOADERS["estimator"](payload))


_LOADERS: dict[str, Any] = {}


def register_loader(kind: str, rebuild: Any) -> None:
    """Rebuild files of ``kind`` with ``rebuild(payload)`` (``gpscale.estimators`` registers
    ``"estimator"``; this module imports no layer above the methods)."""
    _LOADERS[kind] = rebuild


@dataclass(frozen=True)
class SavedModel:
    """A saved Method with what was stored beside it."""

    model: Method
    data: tuple[Tensor, Tensor] | None
    transform: dict[str, Any] | None
    info: dict[str, Any]
    summary: Any = None
    path: str | None = None

    def state(self) -> Any:
        """The prediction state: from the saved data (``model.posterior``), else from the saved
        summary (``model.from_summary``), else ``None`` (methods that need neither).

        Raises:
            SavedFileError: the data or summary cannot be conditioned on (names the file).
        """
        try:
            if self.data is not None:
                return self.model.posterior(*self.data)
            if self.summary is not None:
                return self.model.from_summary(self.summary)
        except torch.cuda.OutOfMemoryError:
            raise
        except (NumericalError, KeyError, TypeError, AttributeError, IndexError, RuntimeError,
                ValueError) as err:
            what = "training data" if self.data is not None else "summary of its training data"
            raise SavedFileError(self.path or "the saved model", f"its {what} cannot be "
                                 f"conditioned on: {_one_line(err, 240)}") from None
        return None


def load_with_data(path: str | Path) -> SavedModel:
    """Load a saved Method with its training data, raw-data transform and info."""
    payload = read_file(path, ("method", "estimator"))
    if payload["kind"] != "method":
        raise SavedFileError(path, "holds a scikit-learn style estimator saved with "
                             "gpscale.save, not a model written by `gpscale fit`; load it "
                             "with gpscale.load")
    return _saved_model(path, payload)


def _saved_model(path: str | Path, payload: dict[str, Any]) -> SavedModel:
    """The Method of a ``method`` file with what was stored beside it, every field checked."""
    model = _rebuild(path, lambda: model_from_payload(payload["model"]))
    summary = _rebuild(path, lambda: rebuild_records(payload["model"].get("summary"),
                                                      *model.summary_types))
    data, transform, info = (payload["model"].get("data"), payload.get("transform"),
                             payload.get("info"))
    _rebuild(path, lambda: check_saved(model, data, summary, transform, info))
    return SavedModel(model, data, transform, info or {}, summary, str(path))


def _rebuild(path: str | Path, make: Any) -> Any:
    """``make()``, with a payload that does not fit its model reported as a SavedFileError."""
    try:
        return make()
    except NumericalError:
        raise
    except FieldError as err:
        raise SavedFileError(path, str(err)) from None
    except (KeyError, TypeError, AttributeError, IndexError, RuntimeError, ValueError) as err:
        raise SavedFileError(path, "holds a model that cannot be rebuilt (written by another "
                             f"gpscale version, or edited?): {_one_line(err)}") from None


def write_file(path: str | Path, kind: str, content: dict[str, Any]) -> Path:
    """Write ``content`` atomically with the format marker, version, ``kind`` and checksum.

    The file is a data-only :mod:`gpscale.files` file, written to an unpredictable temporary
    name beside ``path`` and renamed over it when complete.

    Raises:
        TypeError: ``content`` holds something other than tensors, arrays and plain data
            (nothing is written then).
    """
    if kind not in _WHAT or any(key in content for key in _META):
        raise ValueError(f"kind must be one of {', '.join(_WHAT)} and content must not hold "
                         f"the keys {', '.join(_META)}")
    path = Path(path)
    payload = {"format": MAGIC, "version": VERSION, "kind": kind, **content}
    payload["sha256"] = payload_digest(payload)
    raw = encode(payload)  # before any file is touched
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, raw)


def read_file(path: str | Path, kinds: tuple[str, ...]) -> dict[str, Any]:
    """Read and verify a file written by :func:`write_file` holding one of ``kinds``.

    Returns:
        The payload dict (``kind`` says which it is).

    Raises:
        OSError: the file cannot be opened (missing, no permission).
        SavedFileError: not a regular file (a folder, named pipe or device), empty,
            truncated or corrupt (checksum mismatch), not a gpscale file,
            a newer format version, another kind of file, or a file of the earlier pickled
            formats (the message names ``gpscale convert``).
    """
    path = Path(path)
    expected = " or ".join(_WHAT[k] for k in kinds)
    try:
        raw = read_bytes(path)
        if not raw:
            raise SavedFileError(path, f"the file is empty (0 bytes); expected {expected}")
        payload = decode(raw)
    except NotRegularFileError as err:
        raise SavedFileError(path, err.problem) from None
    except LegacyFormatError:
        raise SavedFileError(path, _legacy_message(path)) from None
    except FormatError as err:
        raise SavedFileError(path, f"cannot be read as {expected}: {err}") from None
    if not isinstance(payload, dict) or payload.get("format") != MAGIC:
        raise SavedFileError(path, f"is not a gpscale file; expected {expected}")
    _verify(path, payload)
    if payload.get("kind") not in kinds:
        found = _WHAT.get(payload.get("kind"), f"kind {payload.get('kind')!r}")
        raise SavedFileError(path, f"holds {found}, not {expected}")
    return payload


def _legacy_message(path: Path) -> str:
    return ("is in the pickled format of earlier gpscale versions, which gpscale no longer "
            "reads: loading a pickle can run any code it holds. If you trust where the file "
            f"came from, convert it once: gpscale convert {path} NEW_FILE --trust")


def _verify(path: Path, payload: dict[str, Any]) -> None:
    version = payload.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise SavedFileError(path, f"has format version {version!r}; this gpscale reads "
                             f"versions up to {VERSION} (upgrade gpscale to read it)")
    stored = payload.pop("sha256", None)
    if stored != payload_digest(payload):
        raise SavedFileError(path, "checksum mismatch: the file is corrupt (changed or partly "
                             "overwritten after gpscale wrote it); write it again")


def convert(old: str | Path, new: str | Path, *, trust: bool = False) -> str:
    """Rewrite a model, estimator or checkpoint file of the earlier pickled formats (1 and 2)
    in the current data-only format; returns its kind.

    This is the one function of gpscale that unpickles a file, with torch's restricted
    unpickler (:func:`_unpickle_trusted`: no code runs); ``trust=True`` still says the caller
    trusts where ``old`` came from. A file already in the current format is verified and
    copied.

    Raises:
        ValueError: ``trust`` is not set; ``new`` is ``old``.
        SavedFileError: ``old`` is damaged or not a gpscale file, or holds objects that are
            not plain data (nothing is written then).
    """
    old, new = Path(old), Path(new)
    if not trust:
        raise ValueError(f"converting {old} unpickles it (restricted to tensors, arrays and "
                         "gpscale's records); pass --trust for a file from a source you trust")
    if new.resolve() == old.resolve():
        raise ValueError(f"write the converted file to a new path, not over {old}")
    try:
        payload = decode(read_bytes(old))
    except NotRegularFileError as err:
        raise SavedFileError(old, err.problem) from None
    except LegacyFormatError:
        payload = _unpickle_trusted(old, read_regular(old))
    except FormatError as err:
        raise SavedFileError(old, f"is not a gpscale file ({err})") from None
    if not isinstance(payload, dict):
        raise SavedFileError(old, "is not a gpscale file")
    payload = dict(payload)
    if payload.get("format") == LEGACY_FORMAT:
        payload.setdefault("kind", "method")
    elif _is_legacy_checkpoint(payload):
        payload["kind"] = "checkpoint"
    elif payload.get("format") == MAGIC:
        _verify(old, payload)
    else:
        raise SavedFileError(old, "is not a gpscale file")
    kind = payload.get("kind")
    if kind not in _WHAT:
        raise SavedFileError(old, f"holds an unknown kind {kind!r}")
    content = {k: v for k, v in payload.items() if k not in _META}
    try:
        write_file(new, kind, content)
    except TypeError as err:
        raise SavedFileError(old, f"holds more than plain data and tensors ({err}); it cannot "
                             "be converted") from None
    return kind


def _unpickle_trusted(path: Path, raw: bytes) -> Any:
    """The earlier formats' reader, only for :func:`convert`: torch's restricted unpickler
    (``weights_only=True``), which builds tensors, containers and the allowlisted types of
    :func:`_legacy_globals` only, so a file cannot run code (needs torch ≥ 2.6, whose
    restricted unpickler has no known way out, CVE-2025-32434)."""
    if not hasattr(torch.serialization, "safe_globals") or _torch_before((2, 6)):
        raise SavedFileError(path, f"is in an earlier, pickled format; converting it needs torch "
                             f"2.6 or later (this is {torch.__version__})")
    try:
        with torch.serialization.safe_globals(_legacy_globals()):
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as err:  # any failure to unpickle means an unreadable file
        raise SavedFileError(path, "cannot be read: the file is truncated, corrupt or not "
                             f"written by gpscale ({_one_line(err)})") from None


def _torch_before(version: tuple[int, int]) -> bool:
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return (major, minor) < version


# The summary types that have moved since gpscale wrote the pickled formats: their path now →
# their path then, the name an old file gives them (the modules of then are gone).
_PICKLED_AS = {
    "gpscale.methods.softki.posterior.SoftKIPosterior":
        "gpscale.methods._softki_posterior.SoftKIPosterior",
    "gpscale.methods.ski.statistics.SufficientStatistics":
        "gpscale.methods._ski_parts.SufficientStatistics",
    "gpscale.linalg.interpolation.Grid": "gpscale.linalg.grid.Grid",
}


def _legacy_globals() -> list[Any]:
    """What the pickled formats held besides tensors and containers: NumPy arrays (class
    labels) and the dataclasses of the methods' summaries (SoftKI's posterior, GGP's
    statistics), a moved one also under the name an old file gives it (:data:`_PICKLED_AS`:
    the restricted unpickler looks a class up by that name and imports nothing). Nothing that
    runs code."""
    import importlib

    from gpscale.methods.base import Method

    core = importlib.import_module("numpy._core.multiarray" if hasattr(np, "_core")
                                   else "numpy.core.multiarray")
    arrays = [np.ndarray, np.dtype, core._reconstruct]
    dtypes = [type(np.dtype(name)) for name in ("float64", "float32", "int64", "int32", "bool",
                                                "<U1", "O")]
    classes, summaries = list(Method.__subclasses__()), set()
    while classes:  # every Method subclass's declared summary types
        cls = classes.pop()
        summaries.update(cls.summary_types)
        classes += cls.__subclasses__()
    former = [(cls, _PICKLED_AS[path]) for cls in summaries
              if (path := f"{cls.__module__}.{cls.__qualname__}") in _PICKLED_AS]
    return [*arrays, *dtypes, *summaries, *former]


def _is_legacy_checkpoint(payload: Any) -> bool:
    keys = {"epoch", "time_s", "model", "optimizer", "generator", "history"}
    return isinstance(payload, dict) and "format" not in payload and keys <= payload.keys()


def _one_line(err: BaseException, limit: int = 120) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def payload_digest(obj: Any) -> str:
    """SHA-256 (hex) of a payload: nested dicts, lists, tuples, tensors, arrays and scalars.

    Tensors and arrays contribute dtype, shape and raw bytes; other values their type and value,
    so the digest of what a file read back holds equals that of what was saved.
    """
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, Tensor):
        t = obj.detach().cpu().resolve_conj().resolve_neg()
        t = (t.to_dense() if t.layout != torch.strided else t).contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, np.ndarray):
        h.update(f"A{obj.dtype}{obj.shape}".encode())
        if obj.dtype.hasobject:
            _feed(h, obj.tolist())
        else:
            h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):
        h.update(b"D%d:" % len(obj))
        for key, value in obj.items():
            _feed(h, key)
            _feed(h, value)
    elif isinstance(obj, list | tuple):
        h.update(b"%s%d:" % (b"L" if isinstance(obj, list) else b"U", len(obj)))
        for item in obj:
            _feed(h, item)
    elif isinstance(obj, set | frozenset):
        _feed(h, ("set", sorted(repr(item) for item in obj)))
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        h.update(b"S%d:" % len(data) + data)
    elif isinstance(obj, bytes | bytearray):
        h.update(b"B%d:" % len(obj) + bytes(obj))
    elif isinstance(obj, float):
        h.update(b"F" + obj.hex().encode())
    elif obj is None or isinstance(obj, bool | int | complex | torch.dtype | torch.device):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    elif isinstance(obj, np.generic):
        _feed(h, obj.item())
    elif isinstance(obj, Record):  # a dataclass as read back from a file
        _feed(h, (obj.type, obj.fields))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        _feed(h, (type(obj).__qualname__,
                  {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}))
    elif callable(getattr(obj, "state_dict", None)):
        _feed(h, (type(obj).__qualname__, obj.state_dict()))
    else:  # an object without a stable value representation: its type only
        h.update(f"O{type(obj).__module__}.{type(obj).__qualname__};".encode())
