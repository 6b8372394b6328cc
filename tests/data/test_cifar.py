"""The CIFAR-10 binary reader and the ``cifar10`` data set, on small files written here in the
official record format; the pickled distribution is refused."""

from __future__ import annotations

import numpy as np
import pytest

from gpscale.data.cifar import CIFAR_TEST, CIFAR_TRAIN, RECORD_BYTES, read_cifar_batch
from gpscale.data.datasets import load_dataset


def _write_batch(path, labels, seed):
    rng = np.random.default_rng(seed)
    planes = rng.integers(0, 256, size=(len(labels), 3, 32, 32), dtype=np.uint8)
    records = np.concatenate([np.asarray(labels, dtype=np.uint8)[:, None],
                              planes.reshape(len(labels), -1)], axis=1)
    path.write_bytes(records.tobytes())
    return planes


def test_records_become_channel_last_images(tmp_path):
    planes = _write_batch(tmp_path / "b.bin", [3, 9, 0], seed=0)
    images, labels = read_cifar_batch(tmp_path / "b.bin")
    assert images.shape == (3, 32, 32, 3) and labels.tolist() == [3, 9, 0]
    # pixel (row 5, column 7) of image 1: its red, green and blue planes at that place
    assert images[1, 5, 7].tolist() == planes[1, :, 5, 7].tolist()


@pytest.mark.parametrize("content, match", [
    (b"\x00" * (RECORD_BYTES + 5), "whole number"),
    (b"", "whole number"),
    (bytes([10]) + b"\x00" * (RECORD_BYTES - 1), "label 10")])
def test_damaged_batches_are_refused_naming_the_file(tmp_path, content, match):
    path = tmp_path / "bad.bin"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as info:
        read_cifar_batch(path)
    assert "bad.bin" in str(info.value)


def test_the_data_set_loads_subsets_of_the_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for i, name in enumerate(CIFAR_TRAIN):
        _write_batch(folder / name, [i, (i + 1) % 10], seed=i)
    _write_batch(folder / CIFAR_TEST, [1, 2, 3], seed=9)
    data = load_dataset("cifar10", roots=tmp_path, num_train=6, num_test=2)
    assert data.x_train.shape == (6, 3072) and data.x_test.shape == (2, 3072)
    assert float(data.x_train.max()) <= 1.0 and data.num_classes == 10
    with pytest.raises(ValueError, match="num_train: 11 asked for"):
        load_dataset("cifar10", roots=tmp_path, num_train=11, num_test=2)


def test_the_pickled_distribution_is_refused(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    with pytest.raises(FileNotFoundError, match="pickle"):
        load_dataset("cifar10", roots=tmp_path)


def test_download_says_where_cifar_comes_from():
    from gpscale.data.download import download

    with pytest.raises(ValueError, match="your copy of the binary batches"):
        download("cifar10")
