"""UCI mask splits and seeded random splits."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from gpscale.data.splits import random_split, read_mask, uci_split

MASK = np.array([[1, 0], [0, 1], [0, 0], [1, 0]])


@pytest.mark.parametrize(("split", "train", "test"), [(0, [1, 2], [0, 3]), (1, [0, 2, 3], [1])],
                         ids=["split0", "split1"])
def test_uci_split_selects_mask_column(split, train, test):
    train_idx, test_idx = uci_split(MASK, split)
    assert train_idx.tolist() == train
    assert test_idx.tolist() == test
    assert train_idx.dtype == torch.int64


def test_uci_split_from_file_equals_array(tmp_path):
    path = tmp_path / "test_mask.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(",".join(str(v) for v in row) for row in MASK) + "\n")
    assert read_mask(path).tolist() == MASK.astype(bool).tolist()
    for split in range(2):
        for a, b in zip(uci_split(path, split), uci_split(MASK, split), strict=True):
            assert a.tolist() == b.tolist()


@pytest.mark.parametrize("split", [2, -1, 10], ids=["past-end", "negative", "ten"])
def test_bad_split_names_valid_range(split):
    with pytest.raises(ValueError, match=r"0\.\.1"):
        uci_split(MASK, split)


def test_non_binary_mask_is_rejected():
    with pytest.raises(ValueError, match="0/1"):
        uci_split(np.array([[0, 2], [1, 0]]), 0)


@pytest.mark.parametrize(("n", "fraction", "num_test"), [(10, 0.1, 1), (308, 0.1, 31),
                                                          (5, 0.01, 1), (5, 0.99, 4)],
                         ids=["n10", "yacht-size", "clip-low", "clip-high"])
def test_random_split_sizes_and_partition(n, fraction, num_test):
    train, test = random_split(n, fraction, seed=3)
    assert test.numel() == num_test
    assert sorted(train.tolist() + test.tolist()) == list(range(n))


def test_random_split_is_seeded():
    a, b, c = random_split(100, 0.2, 0), random_split(100, 0.2, 0), random_split(100, 0.2, 1)
    assert a[1].tolist() == b[1].tolist()
    assert a[1].tolist() != c[1].tolist()


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1], ids=["zero", "one", "negative"])
def test_random_split_bad_fraction(fraction):
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\)"):
        random_split(10, fraction, 0)


def test_uci_mask_columns_select_exactly_the_marked_rows(data_root):
    """Every split of yacht: the test rows are the 1s of column s, read independently."""
    with gzip.open(data_root / "uci" / "yacht" / "test_mask.csv.gz", "rt") as f:
        rows = [[int(float(v)) for v in line.split(",")] for line in f if line.strip()]
    assert len(rows) == 308
    for split in range(10):
        train, test = uci_split(data_root / "uci" / "yacht" / "test_mask.csv.gz", split)
        assert test.tolist() == [i for i, row in enumerate(rows) if row[split] == 1]
        assert train.numel() + test.numel() == 308
