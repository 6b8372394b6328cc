"""A method written entirely in this file — an exact GP on a random subset of the rows it is
given — registers itself and runs through every path: ``gpscale fit`` and ``predict``, ``fit
--nproc 2`` (whose fresh rank processes import this module through ``GPSCALE_PLUGINS``), the
estimators, save / load and the contract tests. Nothing outside this file knows it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import gpytorch
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from gpscale.distributions import Predictive
from gpscale.methods.base import Method
from gpscale.methods.options import Option
from gpscale.methods.registry import FULL_BATCH, METHODS, MethodSpec, register, training_presets

KEY = "test-subset-exact"


@dataclass(frozen=True)
class SubsetState:
    x: Tensor
    cholesky: Tensor
    weights: Tensor
    y: Tensor
    noise: Tensor


class SubsetExact(Method):
    """Exact GP regression on ``subset`` rows drawn with ``seed`` from the rows given."""

    minibatch = True  # the loss on any rows is the same kind of estimate: ranks train on shards

    def __init__(self, num_dims: int, *, subset: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(
            ard_num_dims=num_dims))
        self.raw_noise = nn.Parameter(torch.tensor(-2.0))
        self.subset, self.seed = subset, seed

    def condition(self, x: Tensor, y: Tensor) -> SubsetState:
        rows = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(self.seed))
        x, y = x[rows[:self.subset]], y[rows[:self.subset]]
        noise = nn.functional.softplus(self.raw_noise) + 1e-4
        K = self.kernel(x).to_dense() + noise * torch.eye(x.shape[0], dtype=x.dtype)
        L = torch.linalg.cholesky(K)
        return SubsetState(x, L, torch.cholesky_solve(y[:, None], L)[:, 0], y, noise)

    def loss(self, s: SubsetState) -> Tensor:  # the negative log marginal likelihood per datum
        fit = s.y @ s.weights + 2 * s.cholesky.diagonal().log().sum()
        return 0.5 * fit / s.y.shape[0] + 0.5 * np.log(2 * np.pi)

    def predict(self, s: SubsetState, x_test: Tensor) -> Predictive:
        cross = self.kernel(x_test, s.x).to_dense()
        w = torch.linalg.solve_triangular(s.cholesky, cross.mT, upper=False)
        variance = self.kernel(x_test, diag=True) - w.square().sum(0)
        return Predictive(cross @ s.weights, variance.clamp_min(0.0), noise=s.noise)


SPEC = MethodSpec(
    key=KEY, tasks=("regression",), summary="exact GP on a random subset (a test's own method)",
    factory=lambda num_dims, *, task, num_classes, init, **opts: SubsetExact(
        num_dims, task=task, num_classes=num_classes, options=opts, **opts),
    options=(Option("subset", "int", 200, "rows the GP conditions on", minimum=1),
             Option("seed", "int", 0, "seeds the choice of rows")),
    training_defaults=training_presets({**FULL_BATCH, "epochs": 100, "lr": 0.05}),
    test_options={"subset": 20})


def register_method() -> None:
    """Registers the key (what ``GPSCALE_PLUGINS=<this module>:register_method`` calls)."""
    if KEY not in METHODS:
        register(SPEC)


# -- the paths it runs through ------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_method():
    register_method()
    yield KEY
    METHODS.pop(KEY)


def _rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 2))
    return x, np.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.standard_normal(n)


def _csv(path, n: int, seed: int):
    x, y = _rows(n, seed)
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header="a,b,y", comments="")
    return str(path)


def test_the_contract_tests_pass_on_it(own_method, tmp_path):
    from gpscale.methods import build
    from gpscale.testing import SMALL_OPTIONS, toy_problem

    from . import test_contract_all as contract

    contract.test_every_key_declares_what_the_pipeline_needs(KEY)
    x, y, x_test = toy_problem("regression")
    model = build(KEY, 2, init=(x, y), **SMALL_OPTIONS[KEY])
    with torch.no_grad():
        model.raw_noise.add_(0.1)
    fitted = (model, x, y, x_test)
    contract.test_condition_does_not_change_the_module(fitted)
    contract.test_rebuilt_from_options_and_state_dict_predicts_identically(fitted)
    contract.test_save_load_round_trip_is_bit_identical(fitted, tmp_path)


def test_gpscale_fit_and_predict(own_method, tmp_path, capsys):
    from gpscale.cli.__main__ import main
    from gpscale.io import load

    train, test = _csv(tmp_path / "train.csv", 300, 0), _csv(tmp_path / "test.csv", 40, 1)
    assert main(["fit", "--data", train, "--target", "y", "--method", KEY, "--epochs", "30",
                 "--out", str(tmp_path / "run"), "--no-progress", "-o", "subset=150"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["method"] == KEY and metrics["epochs"] == 30
    assert metrics["test_rmse"] < 0.4  # standardised scale: the target's std is ≈ 1
    assert main(["predict", "--model", str(tmp_path / "run" / "model.pt"), "--data", test,
                 "--out", str(tmp_path / "pred.csv")]) == 0
    predicted = np.genfromtxt(tmp_path / "pred.csv", delimiter=",", names=True)
    x, y = _rows(40, 1)
    assert np.sqrt(np.mean((predicted["mean"] - y) ** 2)) < 0.4 * y.std()
    model = load(tmp_path / "run" / "model.pt")
    assert model.method_key == KEY and model.subset == 150


def test_two_processes(own_method, tmp_path, monkeypatch):
    """The ranks are fresh interpreters: they learn the key from GPSCALE_PLUGINS."""
    from gpscale.cli.__main__ import main

    monkeypatch.setenv("GPSCALE_PLUGINS", f"{__name__}:register_method")
    train = _csv(tmp_path / "train.csv", 300, 0)
    assert main(["fit", "--data", train, "--target", "y", "--method", KEY, "--epochs", "20",
                 "--batch-size", "100", "--out", str(tmp_path / "run"), "--no-progress",
                 "--nproc", "2"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["method"] == KEY and metrics["nproc"] == 2 and metrics["test_rmse"] < 0.5


def test_estimator(own_method):
    from gpscale import GPRegressor

    x, y = _rows(300, 0)
    reg = GPRegressor(method=KEY, epochs=30, subset=150).fit(x[:250], y[:250])
    mean, std = reg.predict(x[250:], return_std=True)
    assert mean.shape == std.shape == (50,) and np.all(std > 0)
    assert np.sqrt(np.mean((mean - y[250:]) ** 2)) < 0.4 * y.std()


def test_a_plugin_that_cannot_be_imported_is_named(monkeypatch):
    from gpscale.methods.registry import get_spec

    monkeypatch.setenv("GPSCALE_PLUGINS", "no_such_module_anywhere")
    with pytest.raises(ValueError, match="GPSCALE_PLUGINS: cannot import 'no_such_module"):
        get_spec("no-such-key")
    monkeypatch.setenv("GPSCALE_PLUGINS", f"{__name__}:no_such_function")
    with pytest.raises(ValueError, match="has no function 'no_such_function'"):
        get_spec("no-such-key")
