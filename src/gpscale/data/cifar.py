"""Reader for the binary distribution of CIFAR-10 (``cifar-10-batches-bin/``).

Each file (``data_batch_1.bin`` … ``data_batch_5.bin``: 50,000 training images;
``test_batch.bin``: 10,000 test images) is a sequence of 3,073-byte records: one label byte
(0–9), then the 32 × 32 red, green and blue planes of the image (1,024 bytes each, row-major).
gpscale returns the images channel-last, (n, 32, 32, 3), so that a flattened row is the layout
of :mod:`gpscale.methods.solvegp.images`.

The Python distribution (``cifar-10-batches-py/``) holds the same data as pickles, which run
code when read; gpscale never reads it (:data:`REFUSED`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpscale.regular_files import open_regular

__all__ = ["CIFAR_FOLDER", "CIFAR_TRAIN", "CIFAR_TEST", "RECORD_BYTES", "REFUSED",
           "read_cifar_batch"]

CIFAR_FOLDER = "cifar-10-batches-bin"
CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST = "test_batch.bin"
RECORD_BYTES = 1 + 3 * 32 * 32
REFUSED = {"cifar-10-batches-py": "the Python (pickle) distribution of CIFAR-10, which gpscale "
                                  "does not read because loading a pickle can run code; get "
                                  "the binary version (cifar-10-binary.tar.gz) instead"}
"""Folders that hold a distribution gpscale will not read, with the reason."""

MAX_BATCH_BYTES = 64 * RECORD_BYTES * 1024
"""The largest batch file read (65,536 records; the official ones hold 10,000)."""


def read_cifar_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file: images (n, 32, 32, 3) uint8, channel-last, and labels (n,) int64.

    Raises:
        ValueError: naming the file, for a size that is not whole records or is too large,
            or a label outside 0–9.
    """
    path = Path(path)
    with open_regular(path) as stream:
        raw = stream.read(MAX_BATCH_BYTES + 1)
    if len(raw) > MAX_BATCH_BYTES:
        raise ValueError(f"{path}: larger than {MAX_BATCH_BYTES:,} bytes; not a CIFAR-10 batch")
    if not raw or len(raw) % RECORD_BYTES:
        raise ValueError(f"{path}: {len(raw):,} bytes is not a whole number of "
                         f"{RECORD_BYTES:,}-byte CIFAR-10 records")
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    if labels.max() > 9:
        row = int(np.argmax(labels > 9))
        raise ValueError(f"{path}: record {row} has label {labels[row]}; CIFAR-10 labels are 0-9")
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels
