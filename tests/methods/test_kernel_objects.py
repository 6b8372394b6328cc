"""A GPyTorch kernel object of the user's own, where a method only evaluates K: the model gets
a copy of it (its hyperparameters trained there, the user's object untouched), the exact GP's
likelihood is the dense one of that kernel, the methods that build their kernel from text refuse
it in one line, and saving says why it cannot and what to do."""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import torch

from gpscale.estimators import GPRegressor
from gpscale.io import save
from gpscale.methods import build
from gpscale.methods.options import OptionError

TAKE = ("exact", "cggp", "sgpr", "svgp", "solvegp", "cagp-cg", "cagp-opt")


def _kernel() -> gpytorch.kernels.Kernel:
    return gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(active_dims=[0])
                                        * gpytorch.kernels.PeriodicKernel(active_dims=[1]))


def _data(n=120):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64) * 3
    return x, torch.sin(3 * x[:, 0]) * torch.cos(2 * x[:, 1]) + 0.05 * torch.randn(
        n, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("key", TAKE)
def test_the_model_trains_a_copy_of_the_users_kernel(key):
    x, y = _data()
    mine = _kernel().double()
    before = [p.clone() for p in mine.parameters()]
    model = build(key, 2, init=(x, y), kernel=mine, **({"num_inducing": 8} if key in (
        "sgpr", "svgp", "solvegp") else {})).double()
    periodic = [m for m in model.modules() if isinstance(m, gpytorch.kernels.PeriodicKernel)]
    assert len(periodic) == 1 and periodic[0] is not mine.base_kernel.kernels[1]
    loss = model.loss(model.condition(x, y))
    loss.backward()
    assert periodic[0].raw_period_length.grad is not None
    assert all(torch.equal(a, b) for a, b in zip(before, mine.parameters(), strict=True))


def test_the_exact_likelihood_is_the_dense_one_of_that_kernel():
    x, y = _data()
    model = build("exact", 2, init=(x, y), kernel=_kernel().double()).double()
    with torch.no_grad():
        loss = model.loss(model.condition(x, y))
        noise = model.likelihood.noise.squeeze()
        K = model.kernel(x, x).to_dense() + noise * torch.eye(len(y), dtype=torch.float64)
        r = y - model.mean.constant
        ref = -torch.distributions.MultivariateNormal(torch.zeros_like(r), K).log_prob(r)
    assert float(loss) * len(y) == pytest.approx(float(ref), rel=1e-8)


def test_methods_that_build_from_text_refuse_it_and_saving_says_what_to_do(tmp_path):
    x, y = _data()
    for key in ("ggp", "softki", "iterncgp", "ski"):
        with pytest.raises(OptionError, match="kernel") as err:
            build(key, 2, init=(x, (y > 0).long() if key == "iterncgp" else y),
                  task="classification" if key == "iterncgp" else "regression",
                  num_classes=2 if key == "iterncgp" else None, kernel=_kernel())
        assert "\n" not in str(err.value)
    plain = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(ard_num_dims=2))
    reg = GPRegressor(method="exact", kernel=plain, max_time=5).fit(x.numpy(), y.numpy())
    mean = reg.predict(x.numpy()[:10])
    assert np.abs(mean - y.numpy()[:10]).max() < 0.3
    with pytest.raises(ValueError, match="write the kernel as an expression"):
        save(reg.model_, tmp_path / "m.pt", data=(x, y))
