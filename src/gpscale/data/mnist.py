"""Reader for the IDX format of the MNIST files (``*-idx3-ubyte.gz``, ``*-idx1-ubyte.gz``).

IDX layout (big-endian): two zero bytes, one type byte (0x08 = unsigned byte, the only type MNIST
uses), one byte with the number of dimensions k, then k unsigned 32-bit sizes, then the data in
row-major order. Files ending in ``.gz`` are decompressed on the fly.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

__all__ = ["read_idx", "MNIST_IMAGES", "MNIST_LABELS"]

MNIST_IMAGES = "t10k-images-idx3-ubyte.gz"
MNIST_LABELS = "t10k-labels-idx1-ubyte.gz"

# IDX type byte -> NumPy dtype (big-endian where it matters).
_IDX_TYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
              0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) into an array of its stated shape.

    Args:
        path: the file.

    Returns:
        The array, e.g. (10000, 28, 28) uint8 for MNIST test images.

    Raises:
        ValueError: for a bad magic number, an unknown type byte or a size that does not match
            the header.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as stream:
        raw = stream.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number)")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_TYPES:
        raise ValueError(f"{path}: unknown IDX type byte 0x{type_code:02x}")
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = _IDX_TYPES[type_code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(f"{path}: header says shape {shape} ({expected} bytes of data) but the "
                         f"file holds {len(raw) - header} bytes")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
