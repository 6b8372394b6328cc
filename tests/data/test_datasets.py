"""Registry, search path and the UCI / MNIST / generated loaders."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from gpscale.data.datasets import (
    ALIASES,
    DATASETS,
    Dataset,
    get_entry,
    list_datasets,
    load_dataset,
    search_path,
)
from gpscale.data.download import default_cache_dir
from gpscale.data.mnist import read_idx

# Label counts of the 10k MNIST test set, digits 0..9 (sum 10,000).
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def _raw_uci(root: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(root / "uci" / name / "data.csv.gz", "rt") as f:
        data = np.array([[float(v) for v in line.split(",")] for line in f if line.strip()])
    with gzip.open(root / "uci" / name / "test_mask.csv.gz", "rt") as f:
        mask = np.array([[int(float(v)) for v in line.split(",")] for line in f if line.strip()])
    return data, mask


def test_search_path_reads_env_then_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GPSCALE_DATA", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    assert search_path() == [tmp_path / "a", tmp_path / "b", default_cache_dir()]
    monkeypatch.delenv("GPSCALE_DATA")
    assert search_path() == [Path.home() / ".cache" / "gpscale"]


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown dataset 'nope'") as err:
        load_dataset("nope")
    for name in ("yacht", "mnist", "gmm10", "mixture", "field3d", "synthetic"):
        assert name in str(err.value)


def test_missing_files_name_folders_and_remedy(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("yacht", roots=[tmp_path / "r1", tmp_path / "r2"])
    message = str(err.value)
    assert str(tmp_path / "r1" / "uci" / "yacht") in message
    assert str(tmp_path / "r2" / "uci" / "yacht") in message
    assert "GPSCALE_DATA" in message
    assert "gpscale datasets download yacht" in message


def test_registry_keys_and_aliases_are_consistent():
    assert all(key == entry.name for key, entry in DATASETS.items())
    assert all(target in DATASETS for target in ALIASES.values())
    assert get_entry("mixture") is DATASETS["gmm10"]
    assert get_entry("YACHT") is DATASETS["yacht"]
    assert {"binary1d", "binary2d", "poisson1d", "gmm10", "sine", "field3d",
            "synthetic", "mnist"} <= set(DATASETS)
    assert sum(entry.folder is not None and entry.folder.startswith("uci/")
               for entry in DATASETS.values()) == 13


def test_list_datasets_without_files(tmp_path):
    infos = {i.name: i for i in list_datasets(roots=[tmp_path])}
    assert infos.keys() == DATASETS.keys()
    assert (infos["yacht"].present, infos["yacht"].location) == (False, None)
    assert (infos["gmm10"].present, infos["gmm10"].location) == (True, "generated")
    assert (infos["yacht"].n, infos["yacht"].d, infos["mnist"].d) == (308, 6, 784)


def test_list_datasets_finds_shared_files(data_root):
    infos = {i.name: i for i in list_datasets(roots=[data_root])}
    users_own = {"cifar10"}  # read from the user's copy: not in the shared data
    assert all(i.present for i in infos.values() if i.name not in users_own)
    assert infos["yacht"].location == str(data_root / "uci" / "yacht")


@pytest.mark.parametrize("split", [0, 3, 9], ids=["split0", "split3", "split9"])
def test_yacht_sizes_follow_mask(data_root, split):
    data = load_dataset("yacht", split=split, roots=[data_root])
    _, mask = _raw_uci(data_root, "yacht")
    assert (data.num_train + data.num_test, data.num_dims) == (308, 6)
    assert data.num_test == int(mask[:, split].sum())
    assert data.x_train.dtype == torch.float64 and data.task == "regression"


def test_uci_standardised_with_training_statistics_only(data_root):
    """x_test and y_test equal (raw - train mean) / train std, computed independently."""
    data = load_dataset("housing", split=2, roots=[data_root])
    raw, mask = _raw_uci(data_root, "housing")
    train, test = raw[mask[:, 2] == 0], raw[mask[:, 2] == 1]
    mean, std = train.mean(0), train.std(0)
    torch.testing.assert_close(data.x_test, torch.from_numpy((test[:, :-1] - mean[:-1]) / std[:-1]))
    torch.testing.assert_close(data.y_test, torch.from_numpy((test[:, -1] - mean[-1]) / std[-1]))
    torch.testing.assert_close(data.x_train.mean(0), torch.zeros(13), rtol=0, atol=1e-12)
    torch.testing.assert_close(data.x_train.std(0, correction=0), torch.ones(13))
    torch.testing.assert_close(data.transform.inverse_mean(data.y_train),
                               torch.from_numpy(train[:, -1]))


def test_uci_constant_column_dropped(data_root):
    """keggundirected has 27 inputs, column 9 constant: 26 remain."""
    data = load_dataset("keggundirected", roots=[data_root])
    assert (data.num_dims, data.info["dropped_columns"]) == (26, [9])
    assert data.num_train + data.num_test == 63608


def test_uci_bad_split_names_range(data_root):
    with pytest.raises(ValueError, match=r"0\.\.9"):
        load_dataset("yacht", split=10, roots=[data_root])


def test_uci_float32(data_root):
    data = load_dataset("yacht", roots=[data_root], dtype=torch.float32)
    assert data.x_train.dtype == data.y_test.dtype == torch.float32


def test_mnist_parsing(data_root):
    images = read_idx(data_root / "mnist" / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(data_root / "mnist" / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels, minlength=10).tolist() == MNIST_TEST_COUNTS


def test_mnist_dataset(data_root):
    data = load_dataset("mnist", roots=[data_root])
    assert (data.num_train, data.num_test, data.num_dims) == (8000, 2000, 784)
    assert data.y_train.dtype == torch.int64 and data.num_classes == 10
    assert 0 <= int(data.y_train.min()) and int(data.y_train.max()) == 9
    assert float(data.x_train.min()) == 0.0 and float(data.x_train.max()) == 1.0
    torch.testing.assert_close(data.x_test * 255, (data.x_test * 255).round(), rtol=0, atol=1e-9)
    counts = torch.bincount(torch.cat([data.y_train, data.y_test]), minlength=10)
    assert counts.tolist() == MNIST_TEST_COUNTS


def test_mnist_split_selects_permutation(data_root):
    a = load_dataset("mnist", roots=[data_root], num_train=100, num_test=50)
    b = load_dataset("mnist", roots=[data_root], num_train=100, num_test=50)
    c = load_dataset("mnist", roots=[data_root], split=1, num_train=100, num_test=50)
    assert (a.num_train, a.num_test) == (100, 50)
    torch.testing.assert_close(a.x_train, b.x_train, rtol=0, atol=0)
    assert not torch.equal(a.x_train, c.x_train)
    with pytest.raises(ValueError, match="num_train"):
        load_dataset("mnist", roots=[data_root], num_train=9000, num_test=2000)


def test_generated_defaults():
    gmm = load_dataset("gmm10")
    assert (gmm.num_train, gmm.num_test, gmm.num_dims, gmm.num_classes) == (20_000, 10_000, 3, 10)
    assert torch.bincount(gmm.y_train).tolist() == [2000] * 10
    torch.testing.assert_close(load_dataset("mixture").x_train, gmm.x_train, rtol=0, atol=0)
    assert gmm.info["source"] == "generated"


def test_generated_overrides_and_split_offsets_seed():
    field = load_dataset("field3d", n=1000, num_test=100)
    assert (field.num_train, field.num_test, field.num_dims) == (1000, 100, 3)
    a, b = load_dataset("sine", split=1), load_dataset("sine", seed=1)
    torch.testing.assert_close(a.x_train, b.x_train, rtol=0, atol=0)
    assert not torch.equal(a.x_train, load_dataset("sine").x_train)


@pytest.mark.parametrize(("name", "task", "dtype"),
                         [("binary1d", "classification", torch.int64),
                          ("poisson1d", "counts", torch.float64),
                          ("synthetic", "regression", torch.float64)],
                         ids=["binary1d", "poisson1d", "synthetic"])
def test_generated_tasks_and_label_dtypes(name, task, dtype):
    data = load_dataset(name)
    assert (data.task, data.y_train.dtype, data.num_dims) == (task, dtype, 1)


def test_dataset_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="train set needs"):
        Dataset("bad", torch.zeros(3, 2), torch.zeros(2), torch.zeros(1, 2), torch.zeros(1))
    with pytest.raises(ValueError, match="num_classes"):
        Dataset("bad", torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), torch.zeros(1, 2),
                torch.zeros(1, dtype=torch.long), task="classification")
