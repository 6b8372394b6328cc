"""The exact-GP pre-fit that starts CaGP-Opt's hyperparameters (opt-in ``prefit='exact'``)."""

from __future__ import annotations

import pytest
import torch

from gpscale.errors import NumericalError
from gpscale.kernels import kernel_hyperparameters
from gpscale.testing import toy_problem
from gpscale.training import METHOD_DEFAULTS
from gpscale.training import prefit as prefit_module
from gpscale.training.harness import build_method, train_method
from gpscale.training.prefit import exact_prefit, fill_prefit_options

KERNEL = {"kernel": "matern32", "ard": True}


def _data(n: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    x, y, _ = toy_problem(n=n, seed=seed)  # y = sin 3x₁ · cos 2x₂ + N(0, 0.1²)
    return x, y


def test_whole_data_prefit_is_the_exact_gp_with_its_defaults():
    """n ≤ prefit_size: the pre-fit is the exact key's default training on all points, and it
    finds the generating noise variance 0.01."""
    x, y = _data(150)
    found = exact_prefit(x, y, **KERNEL, size=1000, seed=0)
    trained = train_method("exact", (x, y), task="regression", num_classes=None,
                           options=dict(KERNEL), config=METHOD_DEFAULTS["exact"].updated(
                               progress=False, max_time=60.0), seed=0)
    hp = kernel_hyperparameters(trained.model.kernel)
    assert found["lengthscale"] == pytest.approx(hp.lengthscale.reshape(-1).tolist(), rel=1e-6)
    assert found["outputscale"] == pytest.approx(float(hp.outputscale.detach()), rel=1e-6)
    assert found["noise"] == pytest.approx(float(trained.model.likelihood.noise), rel=1e-6)
    assert len(found["lengthscale"]) == 2 and 0.004 < found["noise"] < 0.025


def test_subset_prefit_uses_random_rows_seeded():
    x, y = _data(400)
    a = exact_prefit(x, y, **KERNEL, size=100, seed=1)
    assert exact_prefit(x, y, **KERNEL, size=100, seed=1) == a
    rows = torch.randperm(400, generator=torch.Generator().manual_seed(1))[:100]
    b = exact_prefit(x[rows], y[rows], **KERNEL, size=100, seed=1)
    assert b["lengthscale"] == pytest.approx(a["lengthscale"], rel=1e-6)
    assert (b["outputscale"], b["noise"]) == pytest.approx((a["outputscale"], a["noise"]))
    assert exact_prefit(x, y, **KERNEL, size=100, seed=2)["noise"] != a["noise"]


def test_fill_prefit_options_fills_only_what_is_missing(monkeypatch):
    x, y = _data(120)
    calls = []

    def fake(*args, **kwargs):
        calls.append(kwargs)
        return {"lengthscale": [0.3, 0.4], "outputscale": 2.0, "noise": 0.02}

    monkeypatch.setattr(prefit_module, "exact_prefit", fake)
    fill = lambda **o: fill_prefit_options("cagp-opt", (x, y), task="regression",  # noqa: E731
                                           num_classes=None, options=o)
    assert fill(prefit="exact", lengthscale=[1.0, 2.0]) == {
        "prefit": "exact", "lengthscale": [1.0, 2.0], "outputscale": 2.0, "noise": 0.02}
    assert calls[-1]["size"] == 2000 and calls[-1]["seed"] == 0
    assert fill() == {} and fill(prefit="off") == {"prefit": "off"}  # off by default
    given = {"prefit": "exact", "lengthscale": 1.0, "outputscale": 1.0, "noise": 0.1}
    assert fill(**given) == given and len(calls) == 1  # nothing missing: no pre-fit
    assert fill_prefit_options("sgpr", (x, y), task="regression", num_classes=None,
                               options={}) == {}  # a method without the option


def test_built_model_starts_at_the_prefit_values():
    x, y = _data(200)
    config = METHOD_DEFAULTS["cagp-opt"].updated(progress=False)
    model, _ = build_method("cagp-opt", (x, y), task="regression", num_classes=None,
                            options={"num_actions": 8, "prefit": "exact", "prefit_size": 100},
                            config=config,
                            seed=0)
    found = exact_prefit(x.float(), y.float(), **KERNEL, size=100, seed=0)
    hp = kernel_hyperparameters(model.kernel)
    assert hp.lengthscale.reshape(-1).tolist() == pytest.approx(found["lengthscale"], rel=1e-5)
    assert float(model.likelihood.noise) == pytest.approx(found["noise"], rel=1e-5)
    assert model.options["prefit"] == "exact" and model.options["prefit_size"] == 100


def test_failed_prefit_warns_and_starts_from_the_defaults(monkeypatch):
    x, y = _data(120)

    def broken(*args, **kwargs):
        raise NumericalError("Cholesky of the 120 × 120 kernel matrix failed")

    monkeypatch.setattr(prefit_module, "exact_prefit", broken)
    config = METHOD_DEFAULTS["cagp-opt"].updated(progress=False)
    with pytest.warns(UserWarning, match=r"pre-fit of the hyperparameters failed \(Cholesky"):
        model, _ = build_method("cagp-opt", (x, y), task="regression", num_classes=None,
                                options={"num_actions": 8, "prefit": "exact"}, config=config,
                                seed=0)
    assert float(model.likelihood.noise) == pytest.approx(0.1 * float(y.var()), rel=1e-4)
