"""The convolutional keys through the user's paths: ``gpscale fit`` on MNIST and ``predict``
from the saved model, the estimator on an image array, and two processes. Small inducing sets
and few images: these check the plumbing, the accuracy lives in BENCHMARKS."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.data.datasets import load_dataset
from gpscale.io import load

SMALL = ["-o", "num_inducing=16", "-o", "num_orthogonal=16",
         "--data-option", "num_train=256", "--data-option", "num_test=64"]


def test_fit_predict_and_reload_on_mnist(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("GPSCALE_DATA", str(data_root))
    out = tmp_path / "run"
    assert main(["fit", "--dataset", "mnist", "--method", "conv-solvegp", "--epochs", "6",
                 "--lr", "0.05", "--out", str(out), "--no-progress", *SMALL]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["method"] == "conv-solvegp" and metrics["epochs"] == 6
    assert metrics["test_accuracy"] > 0.2  # 24 steps of 64 images; ten classes: chance 0.1
    model = load(out / "model.pt")
    assert model.method_key == "conv-solvegp"
    assert model.options["image_shape"] == [28, 28, 1] and model.options["stride"] == 2
    data = load_dataset("mnist", num_train=256, num_test=64)
    with torch.no_grad():
        probs = model.predict(None, data.x_test.to(torch.float32)).probs
    assert probs.shape == (64, 10)
    torch.testing.assert_close(probs.sum(1), torch.ones_like(probs[:, 0]), rtol=0, atol=1e-5)
    accuracy = float((probs.argmax(1) == data.y_test).double().mean())
    assert accuracy == pytest.approx(metrics["test_accuracy"], abs=1e-9)


def test_estimator_on_an_image_array():
    from gpscale import GPClassifier

    g = np.random.default_rng(0)
    # two classes of 6 × 6 images: a bright bar across the top, or down the left side
    images = g.uniform(0, 0.2, size=(120, 6, 6))
    labels = np.arange(120) % 2
    images[labels == 0, 0, :] += 0.8
    images[labels == 1, :, 0] += 0.8
    x = images.reshape(120, -1)
    clf = GPClassifier(method="conv-svgp", epochs=30, num_inducing=8, patch_size=3,
                       batch_size=40).fit(x[:100], labels[:100])
    assert (clf.predict(x[100:]) == labels[100:]).mean() >= 0.9
    assert clf.predict_proba(x[100:]).shape == (20, 2)


@pytest.mark.slow
def test_two_processes(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("GPSCALE_DATA", str(data_root))
    out = tmp_path / "run"
    assert main(["fit", "--dataset", "mnist", "--method", "conv-svgp", "--epochs", "1",
                 "--out", str(out), "--no-progress", "--nproc", "2", *SMALL[:2], *SMALL[4:]]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nproc"] == 2 and 0 <= metrics["test_accuracy"] <= 1


def test_images_from_a_file_keep_every_pixel(tmp_path):
    """--data: the pixels stay as they are (no standardising, no dropping of the border
    pixels that are 0 in every image), so that the rows are still images."""
    g = np.random.default_rng(1)
    images = np.zeros((90, 6, 6))
    labels = np.arange(90) % 2
    images[labels == 0, 1, 1:5] = 1.0  # the border stays 0 everywhere
    images[labels == 1, 1:5, 1] = 1.0
    images += g.uniform(0, 0.1, size=images.shape) * (images > 0)
    path = tmp_path / "images.npy"
    np.save(path, np.concatenate([images.reshape(90, -1), labels[:, None]], axis=1))
    out = tmp_path / "run"
    assert main(["fit", "--data", str(path), "--target", "-1", "--task", "classification",
                 "--method", "conv-svgp", "--epochs", "20", "--batch-size", "30", "-o",
                 "num_inducing=6", "-o", "patch_size=3", "--out", str(out),
                 "--no-progress"]) == 0
    model = load(out / "model.pt")
    assert model.options["image_shape"] == [6, 6, 1]
    assert json.loads((out / "metrics.json").read_text())["test_accuracy"] >= 0.8
