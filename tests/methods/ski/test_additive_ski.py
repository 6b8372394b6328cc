"""Additive SKI (``ski`` with a sum of kernels on groups of inputs): the model of additive GGP
solved by n-dimensional CG, so on the same grids its likelihood, gradients and predictive are
additive GGP's dense reference (float64); it trains through ``GPRegressor``, round-trips
through save / load with its data, and refuses what no grid can take."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from gpscale.errors import ConvergenceWarning
from gpscale.estimators import GPRegressor
from gpscale.io import load, save
from gpscale.methods import build, get_spec
from gpscale.methods.options import OptionError
from gpscale.methods.ski.additive import AdditiveGGP
from gpscale.methods.ski.additive_ski import AdditiveSKI

_F64 = torch.float64
KERNEL = "rbf(0) + rbf(1, 2) + matern32(3)"
MIXED = "rbf(0) * periodic(1, period=4) + rq(2) + matern32(3)"


def _problem(n=400, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, dtype=_F64, generator=g)
    f = torch.sin(2 * x[:, 0]) + torch.cos(x[:, 1] * x[:, 2]) + 0.5 * x[:, 3].tanh()
    return x, f + 0.1 * torch.randn(n, dtype=_F64, generator=g)


def _pair(kernel, **options):
    """Additive SKI and the dense additive GGP on the same data, grids and hyperparameters."""
    x, y = _problem()
    ski = build("ski", 4, init=(x, y), kernel=kernel, rtol=1e-11, **options).double()
    ggp = build("ggp", 4, init=(x, y), kernel=kernel, solver="dense").double()
    assert isinstance(ski, AdditiveSKI) and type(ggp) is AdditiveGGP
    assert ski.grids == ggp.grids
    return x, y, ski, ggp


@pytest.mark.parametrize("kernel", [KERNEL, MIXED])
def test_the_likelihood_and_its_gradients_are_additive_ggps(kernel):
    x, y, ski, ggp = _pair(kernel, num_probes=512)
    ref = ggp.condition(x, y)
    ggp.loss(ref).backward()
    ref_grads = {k: p.grad.clone() for k, p in ggp.named_parameters() if p.grad is not None}
    state = ski.condition(x, y)
    # rᵀK̃⁻¹r and the mean weights K_B Wᵀz̃ are solved; log det K̃ is a 512-probe estimate
    assert float(state.quad.detach()) == pytest.approx(float(ref.quad.detach()), rel=1e-8)
    torch.testing.assert_close(state.mean_weights, ref.mean_weights, rtol=1e-7, atol=1e-9)
    assert float(state.logdet.detach()) == pytest.approx(float(ref.logdet.detach()),
                                                         abs=0.01 * x.shape[0])
    ski.loss(state).backward()
    grads = {k: p.grad for k, p in ski.named_parameters() if p.grad is not None}
    assert grads.keys() == ref_grads.keys()
    key = next(k for k in grads if "mean" in k)  # exact; the others carry the trace estimate
    torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-7, atol=1e-10)
    for k in grads:
        assert torch.allclose(grads[k], ref_grads[k], rtol=0.2, atol=0.02), k


@pytest.mark.parametrize("variance, tol", [("auto", 1e-9), ("exact", 1e-8), ("lanczos", 1e-4)])
def test_the_predictive_is_additive_ggps(variance, tol):
    x, y, ski, ggp = _pair(KERNEL, variance=variance, variance_rank=300)
    ggp.options["variance"] = "exact"
    g = torch.Generator().manual_seed(1)
    x_test = 0.8 * torch.randn(60, 4, dtype=_F64, generator=g)
    x_test[:10, 3] = 1e4  # beyond the reach of the last group's grid: its prior there
    with torch.no_grad():
        ref = ggp.predict(ggp.condition(x, y), x_test)
        pred = ski.predict(ski.condition(x, y), x_test)
    scale = float(y.var())
    assert float((pred.mean - ref.mean).abs().max()) < 1e-8 * scale**0.5
    assert float((pred.variance - ref.variance).abs().max()) < tol * scale
    assert bool((pred.variance[:10] >= ski._terms()[-1].outputscale * (1 - 1e-9)).all())


def test_it_trains_and_round_trips_with_its_data(tmp_path):
    x, y = _problem(n=600)
    reg = GPRegressor(method="ski", kernel=KERNEL, epochs=8, max_time=60, progress=False)
    reg.fit(x.numpy(), y.numpy())
    assert isinstance(reg.model_, AdditiveSKI)
    losses = [row["loss"] for row in reg.history_.rows]
    assert losses[-1] < losses[0]
    x_test = 0.5 * torch.randn(40, 4, dtype=_F64, generator=torch.Generator().manual_seed(2))
    mean, std = reg.predict(x_test.numpy(), return_std=True)
    f = torch.sin(2 * x_test[:, 0]) + torch.cos(x_test[:, 1] * x_test[:, 2]) \
        + 0.5 * x_test[:, 3].tanh()
    assert float(np.sqrt(np.mean((mean - f.numpy()) ** 2))) < 0.25
    assert np.all(std > 0)
    model = reg.model_
    xs, ys = (t.to(next(model.parameters()).dtype) for t in (x, y))
    save(model, tmp_path / "m.pt", data=(xs, ys))
    loaded = load(tmp_path / "m.pt")
    assert isinstance(loaded, AdditiveSKI) and loaded.grids == model.grids
    with torch.no_grad():
        a = model.predict(model.condition(xs, ys), x_test.to(xs.dtype))
        b = loaded.predict(loaded.condition(xs, ys), x_test.to(xs.dtype))
    torch.testing.assert_close(b.mean, a.mean)
    torch.testing.assert_close(b.variance, a.variance)


def test_what_no_grid_can_take_is_refused_in_one_line():
    spec = get_spec("ski")
    with pytest.raises(OptionError) as err:
        spec.resolve({"kernel": "rbf(0) + linear(1)"})
    assert "'linear' is not a function of x − x'" in str(err.value)
    assert "\n" not in str(err.value)
    x, y = _problem()
    with pytest.raises(ValueError, match="on 4 inputs; a grid takes at most 3"):
        build("ski", 4, init=(x, y), kernel="rbf(0, 1, 2, 3)")
    # one grid over every input: the error points to the groups
    with pytest.raises(ValueError, match="sum of kernels on groups of at most 3 inputs"):
        build("ski", 4, init=(x, y))


def test_a_solve_that_stops_short_says_so():
    """CG that runs out of iterations before rtol warns, naming max_iters; its defaults do
    not."""
    x, y = _problem()
    x_test = 0.5 * torch.randn(20, 4, dtype=_F64, generator=torch.Generator().manual_seed(3))
    for key, kernel in (("ski", KERNEL), ("ski", "rbf")):
        d = 4 if kernel == KERNEL else 2
        model = build(key, d, init=(x[:, :d], y), kernel=kernel, max_iters=2, rtol=1e-10,
                      variance="exact").double()
        with pytest.warns(ConvergenceWarning, match="max_iters=2"):
            state = model.condition(x[:, :d], y)
        with pytest.warns(ConvergenceWarning, match="predictive variances"), torch.no_grad():
            model.predict(state, x_test[:, :d])
    model = build("ski", 4, init=(x, y), kernel=KERNEL).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model.condition(x, y)
