"""Arrays of images (N, H, W[, C]) with their labels in a second ``.npy`` file: read as
flattened channel-last rows, errors that name the problem, and the shape handed to an image
method through ``gpscale fit``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpscale.cli.__main__ import main
from gpscale.data import load_csv


def _bars(n: int = 90, shape: tuple[int, ...] = (6, 8), seed: int = 0):
    """Two classes: a bright row or a bright column, on noise."""
    g = np.random.default_rng(seed)
    images = g.uniform(0, 0.2, size=(n, *shape)).astype(np.float32)
    labels = np.arange(n) % 2
    for i in range(n):
        where = g.integers(1, 5)
        if labels[i] == 0:
            images[i, where, :] += 0.8
        else:
            images[i, :, where] += 0.8
    return images, labels


def test_images_and_labels_are_flattened_rows(tmp_path):
    images, labels = _bars(shape=(6, 8, 3))
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "y.npy", labels)
    data = load_csv(tmp_path / "x.npy", "-1", task="classification", labels=tmp_path / "y.npy",
                    standardize_x=False, test_fraction=0.2)
    assert data.info["item_shape"] == [6, 8, 3]
    assert data.num_dims == 6 * 8 * 3
    rows = np.concatenate([data.x_train.numpy(), data.x_test.numpy()])
    y = np.concatenate([data.y_train.numpy(), data.y_test.numpy()])
    flat = images.reshape(len(images), -1).astype(np.float64)
    order = [int(np.flatnonzero((flat == r).all(1))[0]) for r in rows]  # each row an image
    assert sorted(order) == list(range(len(images)))
    np.testing.assert_array_equal(y, labels[order])


def test_bad_image_arrays_are_named(tmp_path):
    images, labels = _bars()
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "short.npy", labels[:-1])
    np.save(tmp_path / "y.npy", labels)
    np.save(tmp_path / "wide.npy", np.stack([labels, labels], 1))
    with pytest.raises(ValueError, match=r"labels=FILE\.npy"):
        load_csv(tmp_path / "x.npy", "-1", task="classification")
    with pytest.raises(ValueError, match="89 labels for the 90 items"):
        load_csv(tmp_path / "x.npy", "-1", task="classification", labels=tmp_path / "short.npy")
    with pytest.raises(ValueError, match=r"shape \(N,\) or \(N, 1\)"):
        load_csv(tmp_path / "x.npy", "-1", task="classification", labels=tmp_path / "wide.npy")
    with pytest.raises(ValueError, match="the target is the labels"):
        load_csv(tmp_path / "x.npy", "3", task="classification", labels=tmp_path / "y.npy")
    (tmp_path / "t.csv").write_text("a,b\n1,2\n3,4\n")
    with pytest.raises(ValueError, match="goes with a .npy array"):
        load_csv(tmp_path / "t.csv", "-1", labels=tmp_path / "short.npy")


def test_fit_on_an_image_array_takes_its_shape(tmp_path):
    images, labels = _bars(n=200)
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "y.npy", labels)
    out = tmp_path / "run"
    assert main(["fit", "--data", str(tmp_path / "x.npy"), "--data-option",
                 f"labels={tmp_path / 'y.npy'}", "--task", "classification", "--method",
                 "conv-svgp", "-o", "num_inducing=8", "-o", "patch_size=3", "--epochs", "40",
                 "--lr", "0.05", "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_dims"] == 48 and metrics["test_accuracy"] >= 0.9
    new, new_labels = _bars(n=20, seed=1)
    np.save(tmp_path / "new.npy", new)
    assert main(["predict", "--model", str(out / "model.pt"), "--data",
                 str(tmp_path / "new.npy"), "--out", str(tmp_path / "p.csv")]) == 0
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert len(lines) == 21  # a header and one row per image
