"""Train/test splits: the fixed UCI masks and seeded random splits.

The UCI collection ships ``test_mask.csv.gz``: one row per data point and one 0/1 column per split,
where column s marks the test rows of split s (about 10 % each; each point is a test point in
exactly one split). Index tensors are returned sorted, so the original row order is kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gpscale.typing import Int, Tensor

__all__ = ["read_mask", "uci_split", "random_split", "ordered_split", "SPLITS"]

SPLITS = ("random", "last")
"""How a data file of the user's own is split: seeded at random, or its last rows as the test
set (forecasting: the model never sees the future)."""


def read_mask(path: str | Path) -> np.ndarray:
    """Read a 0/1 test mask file (csv, optionally gzipped) as a bool array (n, num_splits)."""
    raw = np.loadtxt(path, delimiter=",", ndmin=2)
    if not np.isin(raw, (0, 1)).all():
        raise ValueError(f"test mask {path} must contain only 0 and 1")
    return raw.astype(bool)


def uci_split(mask: str | Path | np.ndarray | Tensor,
              split: int) -> tuple[Int[Tensor, " n_train"], Int[Tensor, " n_test"]]:
    """Train and test row indices of one split of a test mask.

    Args:
        mask: a mask file path, or an array/tensor of shape (n, num_splits) with 0/1 entries.
        split: which column to use, 0 <= split < num_splits.

    Returns:
        ``(train_idx, test_idx)``, sorted int64 tensors that partition ``range(n)``.

    Raises:
        ValueError: for a split outside the valid range (the message names it), a mask that is
            not 2-D 0/1, or a split with no test or no training rows.
    """
    if isinstance(mask, (str, Path)):
        table = read_mask(mask)
    else:
        table = np.asarray(mask.cpu() if isinstance(mask, Tensor) else mask)
        if table.ndim != 2 or not np.isin(table, (0, 1)).all():
            raise ValueError(f"mask must be a 2-D array of 0/1; got shape {table.shape}")
        table = table.astype(bool)
    num_splits = table.shape[1]
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)):
        raise ValueError(f"split must be an integer in 0..{num_splits - 1}; got {split!r}")
    if not 0 <= split < num_splits:
        raise ValueError(f"split must be in 0..{num_splits - 1} (the mask has {num_splits} "
                         f"splits); got {split}")
    is_test = torch.from_numpy(table[:, split].copy())
    test_idx = is_test.nonzero().flatten()
    train_idx = (~is_test).nonzero().flatten()
    if test_idx.numel() == 0 or train_idx.numel() == 0:
        raise ValueError(f"split {split} has {test_idx.numel()} test and {train_idx.numel()} "
                         "training rows; both must be non-empty")
    return train_idx, test_idx


def random_split(n: int, test_fraction: float = 0.1,
                 seed: int = 0) -> tuple[Int[Tensor, " n_train"], Int[Tensor, " n_test"]]:
    """A seeded random train/test partition of ``range(n)``.

    The test set has ``round(test_fraction * n)`` rows, clipped to 1..n-1.

    Args:
        n: number of points, at least 2.
        test_fraction: fraction of points in the test set, 0 < test_fraction < 1.
        seed: seed of the permutation.

    Returns:
        ``(train_idx, test_idx)``, sorted int64 tensors that partition ``range(n)``.
    """
    if n < 2:
        raise ValueError(f"need at least 2 points to split; got n={n}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1); got {test_fraction}")
    num_test = min(max(round(test_fraction * n), 1), n - 1)
    generator = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=generator)
    return perm[num_test:].sort().values, perm[:num_test].sort().values


def ordered_split(n: int, test_fraction: float = 0.1
                  ) -> tuple[Int[Tensor, " n_train"], Int[Tensor, " n_test"]]:
    """The first rows of ``range(n)`` to train and the last ``round(test_fraction · n)``
    (clipped to 1..n−1) to test, as :func:`random_split` sizes them: a forecast's split."""
    if n < 2:
        raise ValueError(f"need at least 2 points to split; got n={n}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1); got {test_fraction}")
    num_test = min(max(round(test_fraction * n), 1), n - 1)
    rows = torch.arange(n)
    return rows[:n - num_test], rows[n - num_test:]
