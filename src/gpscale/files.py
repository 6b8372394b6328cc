"""Files that hold data and nothing else, written so that they cannot clobber anything.

**The format.** Every file gpscale writes for itself to read back (saved models and
estimators, training checkpoints, the rank results of a ``--nproc`` run) is a safetensors file:
an 8-byte header length, a JSON header, then the raw bytes of the tensors. The rest of the
content — nested dicts, lists, tuples, strings, numbers, NumPy arrays, dtypes and the frozen
dataclasses of a method's summary — is a JSON document stored in the header's metadata under
the key ``gpscale``, with each tensor replaced by a reference to its entry. Reading it parses JSON
and copies bytes into tensors; nothing in a file names a function, a class to import or an
object to build, so a crafted file can be wrong but can never run code. (The alternative,
``torch.save`` of plain containers read back with ``torch.load(weights_only=True)``, keeps a
pickle interpreter on the read path: its allow-list is PyTorch's to get right, and releases
before 2.6 — which the package still accepts — had a hole in it, CVE-2025-32434.)

JSON cannot tell a tuple from a list, holds only string keys and no NaN, so those values are
tagged: a JSON object with one key starting with ``$`` is a tag (``{"$tuple": [...]}``,
``{"$dict": [[key, value], ...]}``, ``{"$float": "nan"}``, ``{"$tensor": "t3"}``, ...), and a dict
with such a key is always written in the ``$dict`` form. A dataclass is written as its field
values under its type's name and read back as a :class:`Record`; the code that expects it
rebuilds it from a closed list of its own types (:func:`rebuild`), never from the name alone.

**The writes.** :func:`atomic_write` and :func:`atomic_output` write to a temporary file made
by :func:`tempfile.mkstemp` in the target's folder — an unpredictable name, created with
``O_EXCL`` (a planted file or symlink is never opened) — and rename it over the target only when
complete (``os.replace`` replaces a symlink at the target itself, never the file it points to).
A failed or interrupted write removes its temporary file and leaves the target as it was.

**The reads.** :func:`read_bytes` reads a regular file only
(:func:`gpscale.regular_files.open_regular`: a named pipe or a device is refused before it is
read) and reads no further than its header allows: the header length is checked against the
file's size and :data:`MAX_HEADER_BYTES`, and every tensor's declared dtype, shape and offsets
against the bytes the file holds, before the tensors are read. Decoding allocates nothing the
file does not hold: an array stored as items must hold as many items as its shape declares.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
import os
import struct
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import Tensor

from gpscale.regular_files import open_regular

__all__ = ["Record", "FormatError", "LegacyFormatError", "encode", "decode", "read_bytes",
           "rebuild", "atomic_write", "atomic_output", "temporary_beside", "is_legacy_pickle",
           "MAX_HEADER_BYTES"]

KEY = "gpscale"  # the metadata entry holding the JSON document
MAX_DEPTH = 64  # nesting deeper than this is refused (no payload of ours comes close)
_NUMERIC_NDARRAY = "biufc"  # NumPy dtype kinds stored as tensors
_ITEM_NDARRAY = "USO"  # kinds stored as a list of their items (labels: text, objects)
MAX_HEADER_BYTES = 100_000_000
"""The longest header read (the safetensors reader refuses longer ones itself)."""
MAX_PADDED_ITEMS_BYTES = 1 << 20
"""A text array may declare a wider dtype than its longest item needs only up to this size."""
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8,
                "I64": 8, "U64": 8}  # safetensors' dtype codes and their sizes


class FormatError(ValueError):
    """The bytes are not a well-formed gpscale data file (the message says what is wrong)."""


class LegacyFormatError(FormatError):
    """The file is a pickle written by an earlier gpscale (or by ``torch.save``)."""


PICKLE_PROBLEM = "is a pickle (the format of earlier gpscale versions, or a torch.save file)"
"""What a :class:`LegacyFormatError` says of the file."""


@dataclass(frozen=True)
class Record:
    """A dataclass as read from a file: its type's name and its field values (plain data)."""

    type: str
    fields: dict[str, Any]


def rebuild(value: Any, *types: type) -> Any:
    """``value`` with every :class:`Record` (at any depth) rebuilt as the dataclass of that
    name among ``types``; a record of any other name is a :class:`FormatError`. Values that
    are not records pass through, so in-process objects are returned unchanged."""
    known = {t.__qualname__: t for t in types}
    if isinstance(value, Record):
        if value.type not in known:
            expected = f"one of {', '.join(sorted(known))}" if known else "only plain data"
            raise FormatError(f"holds a {value.type!r} where {expected} was expected")
        cls = known[value.type]
        names = {f.name for f in dataclasses.fields(cls)}
        if not set(value.fields) <= names:
            raise FormatError(f"holds a {value.type} with unknown fields "
                              f"{sorted(set(value.fields) - names)}")
        return cls(**{k: rebuild(v, *types) for k, v in value.fields.items()})
    if isinstance(value, dict):
        return {k: rebuild(v, *types) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(rebuild(v, *types) for v in value)
    return value


# -- encoding -----------------------------------------------------------------------------------

class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, Tensor] = {}

    def tensor(self, t: Tensor) -> str:
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise TypeError(f"cannot store a {t.layout} tensor; convert it to a dense one")
        name = f"t{len(self.tensors)}"
        # own contiguous CPU memory: safetensors refuses views that share storage
        self.tensors[name] = t.detach().to("cpu").resolve_conj().resolve_neg().contiguous() \
            .clone()
        return name

    def __call__(self, obj: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise TypeError(f"the content is nested more than {MAX_DEPTH} levels deep")
        enc = self
        if obj is None or isinstance(obj, bool | str):
            return obj
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj) if np.isfinite(obj) else {"$float": repr(float(obj))}
        if isinstance(obj, Tensor) and obj.dtype == torch.complex128:  # not a safetensors dtype
            return {"$complex128": enc.tensor(torch.view_as_real(obj.detach().resolve_conj()))}
        if isinstance(obj, Tensor):
            return {"$tensor": enc.tensor(obj)}
        if isinstance(obj, np.ndarray):
            return _encode_ndarray(obj, enc, depth)
        if isinstance(obj, np.generic):
            return enc(obj.item(), depth + 1)
        if isinstance(obj, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in obj):
                return {k: enc(v, depth + 1) for k, v in obj.items()}
            return {"$dict": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in obj.items()]}
        if isinstance(obj, tuple):  # torch.Size included
            return {"$tuple": [enc(v, depth + 1) for v in obj]}
        if isinstance(obj, list):
            return [enc(v, depth + 1) for v in obj]
        if isinstance(obj, bytes | bytearray):
            return {"$bytes": base64.b64encode(bytes(obj)).decode("ascii")}
        if isinstance(obj, torch.dtype):
            return {"$dtype": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.device):
            return {"$device": str(obj)}
        if isinstance(obj, Record):
            return {"$record": obj.type, "fields": enc(obj.fields, depth + 1)}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            return {"$record": type(obj).__qualname__, "fields": enc(fields, depth + 1)}
        raise TypeError(f"cannot store a {type(obj).__module__}.{type(obj).__qualname__} in a "
                        "gpscale file (tensors, arrays and plain data only)")


def _encode_ndarray(a: np.ndarray, enc: _Encoder, depth: int) -> dict[str, Any]:
    if a.dtype.kind in _NUMERIC_NDARRAY:
        return {"$ndarray": enc.tensor(torch.from_numpy(np.array(a, order="C", copy=True)))}
    if a.dtype.kind in _ITEM_NDARRAY:
        return {"$ndarray_items": enc(a.tolist(), depth + 1), "dtype": a.dtype.str,
                "shape": list(a.shape)}
    raise TypeError(f"cannot store a NumPy array of dtype {a.dtype}")


def encode(content: Any) -> bytes:
    """The bytes of a gpscale data file holding ``content``.

    Raises:
        TypeError: ``content`` holds something other than tensors, arrays and plain data.
    """
    enc = _Encoder()
    document = json.dumps(enc(content), allow_nan=False, separators=(",", ":"))
    from safetensors.torch import save

    try:
        return save(enc.tensors, metadata={KEY: document})
    except (KeyError, ValueError) as err:  # e.g. a dtype safetensors has no code for
        raise TypeError(f"cannot store these tensors: {err}") from None


# -- decoding -----------------------------------------------------------------------------------

def is_legacy_pickle(raw: bytes) -> bool:
    """Whether ``raw`` starts like a ``torch.save`` file (a zip archive) or a bare pickle
    (protocol 2–5) rather than a safetensors file (8-byte length, then ``{``)."""
    if raw[8:9] == b"{":  # a header length's low byte may well be 0x80
        return False
    return raw[:4] == b"PK\x03\x04" or (raw[:1] == b"\x80" and raw[1:2] in b"\x02\x03\x04\x05")


def _header_length(raw: bytes, size: int) -> int:
    """The header length in the first 8 bytes of a file of ``size`` bytes, checked."""
    if is_legacy_pickle(raw):
        raise LegacyFormatError(PICKLE_PROBLEM)
    if size < 8:
        raise FormatError(f"is too short ({size} bytes) to be a gpscale file")
    (length,) = struct.unpack("<Q", raw[:8])
    if length < 2 or length > size - 8:
        raise FormatError("is not a gpscale file, or is truncated (its header length "
                          f"{length} does not fit its {size} bytes)")
    if length > MAX_HEADER_BYTES:
        raise FormatError(f"is not a gpscale file (its header length {length} is over the "
                          f"limit of {MAX_HEADER_BYTES} bytes)")
    return length


def _parse_header(text: bytes, body: int) -> dict[str, Any]:
    """The JSON header, its tensor table checked against the ``body`` bytes after it."""
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FormatError("is not a gpscale file, or is damaged (its header is not JSON)") \
            from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get(KEY), str):
        raise FormatError("is not a gpscale file (no gpscale content in its header)")
    _check_tensor_table(header, body)
    return header


def _check_tensor_table(header: dict[str, Any], body: int) -> None:
    """Every tensor entry's dtype, shape and offsets fit the ``body`` bytes the file holds,
    and the entries cover them (as the safetensors reader requires): checked before any
    tensor is read or allocated."""
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            shape, (begin, stop) = entry["shape"], entry["data_offsets"]
            if not all(isinstance(v, int) and v >= 0 for v in (*shape, begin, stop)):
                raise TypeError
        except (TypeError, KeyError, ValueError):
            raise FormatError(f"is damaged (its tensor entry {name[:40]!r} is malformed)") \
                from None
        size = _DTYPE_BYTES.get(entry.get("dtype"))
        if not begin <= stop <= body or (size is not None and
                                         math.prod(shape) * size != stop - begin):
            raise FormatError(f"is damaged or truncated (its tensor {name[:40]!r} declares "
                              f"shape {list(shape)[:8]} at bytes {begin}..{stop}; the file "
                              f"holds {body} bytes of tensors)")
        end = max(end, stop)
    if end != body:
        raise FormatError(f"is damaged or truncated (its header declares {end} bytes of "
                          f"tensors; the file holds {body})")


def _header(raw: bytes) -> dict[str, Any]:
    length = _header_length(raw, len(raw))
    return _parse_header(raw[8:8 + length], len(raw) - 8 - length)


def read_bytes(path: str | Path) -> bytes:
    """The bytes of a gpscale data file, read as far as its header allows (module docstring).

    Returns the whole file when it is shorter than a header (:func:`decode` then says so).

    Raises:
        OSError: the file cannot be opened.
        gpscale.regular_files.NotRegularFileError: a folder, named pipe, device or socket.
        LegacyFormatError: a pickle (only its first bytes are read).
        FormatError: a header that does not fit the file (nothing more is read).
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        start = f.read(9)
        if is_legacy_pickle(start):
            raise LegacyFormatError(PICKLE_PROBLEM)
        if len(start) < 9:
            return start
        length = _header_length(start, size)
        text = start[8:] + f.read(length - 1)
        _parse_header(text, size - 8 - length)
        return start[:8] + text + f.read(size - 8 - length)


def decode(raw: bytes) -> Any:
    """The content of a file written with :func:`encode`.

    Raises:
        LegacyFormatError: a pickled file of the earlier format (never unpickled here).
        FormatError: anything else that is not a well-formed gpscale data file.
    """
    header = _header(raw)
    try:
        document = json.loads(header["__metadata__"][KEY])
    except (ValueError, RecursionError):
        raise FormatError("is damaged (its content is not JSON)") from None
    from safetensors.torch import load

    try:
        tensors = load(raw)
    except Exception as err:  # the Rust reader's own checks: offsets, dtypes, sizes
        text = " ".join(str(err).split())[:120]
        raise FormatError(f"is damaged or truncated (its tensors cannot be read: {text})") \
            from None
    return _Decoder(tensors)(document)


class _Decoder:
    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.tensors = tensors

    def tensor(self, name: Any) -> Tensor:
        if not isinstance(name, str) or name not in self.tensors:
            raise FormatError(f"refers to a tensor {name!r} it does not hold")
        return self.tensors[name]

    def __call__(self, node: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise FormatError(f"is nested more than {MAX_DEPTH} levels deep")
        dec = self
        if node is None or isinstance(node, bool | int | float | str):
            return node
        if isinstance(node, list):
            return [dec(v, depth + 1) for v in node]
        if not isinstance(node, dict):
            raise FormatError(f"holds an unexpected {type(node).__name__}")
        tags = [k for k in node if k.startswith("$")]
        if not tags:
            return {k: dec(v, depth + 1) for k, v in node.items()}
        handler = _TAGS.get(tags[0]) if len(tags) == 1 else None
        if handler is None:
            raise FormatError(f"holds an unknown tag {', '.join(tags)}")
        try:
            return handler(dec, node, depth)
        except FormatError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError,
                RuntimeError) as err:
            raise FormatError(f"holds a malformed {tags[0]} entry ({err})") from None


def _pairs(dec: _Decoder, node: dict, depth: int) -> dict:
    return {_hashable(dec(k, depth + 1)): dec(v, depth + 1) for k, v in node["$dict"]}


def _hashable(key: Any) -> Any:
    hash(key)  # TypeError (a malformed entry) for a list or dict used as a key
    return key


def _float(dec: _Decoder, node: dict, depth: int) -> float:
    if node["$float"] not in ("nan", "inf", "-inf"):
        raise ValueError(f"{node['$float']!r} is not nan, inf or -inf")
    return float(node["$float"])


def _dtype(dec: _Decoder, node: dict, depth: int) -> torch.dtype:
    value = getattr(torch, str(node["$dtype"]), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"{node['$dtype']!r} is not a torch dtype")
    return value


def _items(dec: _Decoder, node: dict, depth: int) -> np.ndarray:
    dtype = np.dtype(str(node["dtype"]))
    if dtype.kind not in _ITEM_NDARRAY:
        raise ValueError(f"dtype {dtype} is not stored as items")
    shape = tuple(int(s) for s in node["shape"])
    flat: list[Any] = []
    _flatten(dec(node["$ndarray_items"], depth + 1), shape, flat)  # before any allocation
    if dtype.kind == "O":  # np.array would turn nested lists into more dimensions
        out = np.empty(len(flat), dtype=object)
        for i, item in enumerate(flat):  # one by one: an item may itself be a list
            out[i] = item
        return out.reshape(shape)
    tight = np.array(flat, dtype=dtype.kind)  # as wide as the longest item needs
    if dtype.itemsize > tight.dtype.itemsize and \
            len(flat) * dtype.itemsize > MAX_PADDED_ITEMS_BYTES:
        raise ValueError(f"dtype {dtype} is wider than its items need ({tight.dtype}) for "
                         f"{len(flat)} items")
    return tight.astype(dtype).reshape(shape)


def _flatten(items: Any, shape: tuple[int, ...], out: list[Any]) -> None:
    """Append the items of nested lists of ``shape`` to ``out``; a ValueError unless the lists
    hold exactly that shape."""
    if not shape:
        out.append(items)
        return
    if not isinstance(items, list) or len(items) != shape[0]:
        raise ValueError(f"its items do not fill the declared shape {list(shape)[:8]}")
    for item in items:
        _flatten(item, shape[1:], out)


_TAGS = {
    "$tensor": lambda dec, node, depth: dec.tensor(node["$tensor"]),
    "$complex128": lambda dec, node, depth: torch.view_as_complex(dec.tensor(node["$complex128"])
                                                                  .to(torch.float64)),
    "$ndarray": lambda dec, node, depth: dec.tensor(node["$ndarray"]).numpy(),
    "$ndarray_items": _items,
    "$tuple": lambda dec, node, depth: tuple(dec(v, depth + 1) for v in node["$tuple"]),
    "$dict": _pairs,
    "$float": _float,
    "$bytes": lambda dec, node, depth: base64.b64decode(node["$bytes"], validate=True),
    "$dtype": _dtype,
    "$device": lambda dec, node, depth: torch.device(str(node["$device"])),
    "$record": lambda dec, node, depth: Record(str(node["$record"]),
                                               dict(dec(node["fields"], depth + 1))),
}


# -- writing ------------------------------------------------------------------------------------

_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    with _UMASK_LOCK:  # the only way to read the umask is to set it
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path: str | Path, mode: str = "wb", **kwargs: Any) -> Iterator[IO]:
    """A file object to write ``path``'s new content into; on a clean exit the content
    replaces ``path`` at once, on an exception (Ctrl-C included) ``path`` is left as it was.

    The temporary file is created next to ``path`` with an unpredictable name and ``O_EXCL``
    (mode 0600 while written, then the usual permissions for a new file under the umask).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def temporary_beside(path: str | Path) -> Path:
    """A new empty file next to ``path`` (unpredictable name, ``O_EXCL``, the permissions of a
    new file under the umask) for writers that open their output by name; the caller renames
    it over ``path`` when complete (``os.replace``) and removes it on failure."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    finally:
        os.close(fd)
    return Path(tmp)


def atomic_write(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through :func:`atomic_output`; returns the path."""
    with atomic_output(path) as f:
        f.write(data)
    return Path(path)
