"""Every regression and classification key, and ``auto``, through ``gpscale fit``'s own path on
CUDA: the CLI's runner with the pre-fits, ``auto``'s choice and the defaults, nothing but the
device, the time budget and the output folder given (issue #43: the CaGP-Opt pre-fit and the
dense baselines ended in tracebacks there while the three-epoch checks of
tests/test_cuda_methods.py passed).

Marked ``gpu`` (excluded from ``make test``). ``GPSCALE_TEST_DEVICE=cpu`` runs it on the CPU
(a check of the test itself; minutes).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.methods.registry import METHODS

DEVICE = os.environ.get("GPSCALE_TEST_DEVICE", "cuda")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                       reason="needs a CUDA device"),
]

CASES = [(key, task) for key, spec in METHODS.items() for task in spec.tasks  # tables: the
         if task in ("regression", "classification") and spec.inputs == "vectors"]  # image
# methods run on the card in scripts/gpu-check.sh conv
CASES += [("auto", "regression"), ("auto", "classification")]
REGRESSION_ROWS = 12_000
"""Above CaGP-Opt's exact pre-fit threshold (10,000 training points after the test split)."""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 3-D regression file (ski and ggp take d ≤ 3) and a 3-class file of 4-D inputs."""
    folder = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(REGRESSION_ROWS + 2_000, 3))
    y = np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + 0.5 * x[:, 2] + 0.1 * rng.standard_normal(
        len(x))
    regression = folder / "regression.csv"
    np.savetxt(regression, np.column_stack([x, y]), delimiter=",", header="a,b,c,y",
               comments="")
    xc = rng.uniform(-1, 1, size=(3_000, 4))
    logits = np.stack([3 * xc[:, 0], 3 * xc[:, 1] * xc[:, 2], -3 * xc[:, 3]], 1)
    p = np.exp(logits - logits.max(1, keepdims=True))
    labels = np.array([rng.choice(3, p=row / row.sum()) for row in p])
    classification = folder / "classes.csv"
    np.savetxt(classification, np.column_stack([xc, labels]), delimiter=",",
               header="a,b,c,d,y", comments="", fmt=["%.6f"] * 4 + ["%d"])
    return {"regression": regression, "classification": classification}


@pytest.mark.parametrize(("key", "task"), CASES, ids=[f"{k}-{t}" for k, t in CASES])
def test_fit_defaults_on_the_device(key, task, files, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["fit", "--data", str(files[task]), "--target", "y", "--method", key,
                 "--task", task, "--device", DEVICE, "--max-time", "15", "--out", str(out),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert "Traceback" not in err
    metrics = json.loads((out / "metrics.json").read_text())
    if task == "regression":
        assert math.isfinite(metrics["test_nll"]) and metrics["test_rmse"] < 0.5, metrics
    else:
        assert metrics["test_accuracy"] > 0.5, metrics
