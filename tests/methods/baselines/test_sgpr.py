"""``sgpr``: GPyTorch's InducingPointKernel against the dense Titsias (2009) bound, predictive."""

from __future__ import annotations

import pytest
import torch

from gpscale.methods import build

from ._dense import matern32, nystrom, titsias_bound

LENGTHSCALE, OUTPUTSCALE, NOISE, MEAN = 0.9, 1.3, 0.05, 0.2
HYPERS = {"lengthscale": LENGTHSCALE, "outputscale": OUTPUTSCALE, "noise": NOISE,
          "mean_constant": MEAN}


def _sgpr(x, y, z):
    """An SGPR with fixed hyperparameters and inducing points ``z``."""
    model = build("sgpr", x.shape[1], init=(x, y), num_inducing=z.shape[0], **HYPERS)
    with torch.no_grad():
        model.inducing_points.copy_(z)
    return model


def _dense_titsias_loss(model, x, y):
    """−Titsias bound / n from the model's current (constrained) hyperparameters."""
    base = model.kernel.base_kernel
    ls, os = base.base_kernel.lengthscale[0], base.outputscale
    z = model.inducing_points
    bound = titsias_bound(torch.full_like(y, 1.0) * os, matern32(x, z, ls, os),
                          matern32(z, z, ls, os), y, model.mean.constant,
                          model.likelihood.noise[0])
    return -bound / x.shape[0]


def test_inducing_points_at_the_data_give_the_exact_gp(toy_regression, generator):
    """Z = X: Q = K, so the bound is log p(y) and the predictive is the exact GP's."""
    x, y = toy_regression
    sgpr = _sgpr(x, y, x.clone())
    exact = build("exact", 2, init=(x, y), **HYPERS)
    x_test = torch.cat([torch.rand(6, 2, generator=generator) * 4 - 2, x])
    state, ref_state = sgpr.condition(x, y), exact.condition(x, y)
    torch.testing.assert_close(sgpr.loss(state), exact.loss(ref_state), rtol=1e-7, atol=1e-9)
    for points in (x_test, x):  # x alone takes GPyTorch's "test inputs equal train inputs" path
        pred, ref = sgpr.predict(state, points), exact.predict(ref_state, points)
        torch.testing.assert_close(pred.mean, ref.mean, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(pred.variance, ref.variance, rtol=1e-6, atol=1e-7)


def test_loss_is_dense_titsias_bound(toy_regression, generator):
    """Titsias Eq. 9 for random inducing points, per datum."""
    x, y = toy_regression
    sgpr = _sgpr(x, y, torch.rand(6, 2, generator=generator) * 4 - 2)
    loss = sgpr.loss(sgpr.condition(x, y))
    # GPyTorch forms distances as ‖a‖² + ‖b‖² − 2aᵀb, which loses digits for close pairs.
    torch.testing.assert_close(loss, _dense_titsias_loss(sgpr, x, y), rtol=1e-7, atol=1e-9)


def test_loss_gradient_matches_dense_titsias(toy_regression, generator):
    """Gradients w.r.t. hyperparameters and inducing points equal the dense bound's."""
    x, y = toy_regression
    sgpr = _sgpr(x, y, torch.rand(6, 2, generator=generator) * 4 - 2)
    params = {n: p for n, p in sgpr.named_parameters()}
    grads = torch.autograd.grad(sgpr.loss(sgpr.condition(x, y)), list(params.values()))
    expected = torch.autograd.grad(_dense_titsias_loss(sgpr, x, y), list(params.values()))
    for name, g, e in zip(params, grads, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-8, msg=name)


def test_predictive_is_dense_titsias_predictive(toy_regression, generator):
    """Mean m + Q_*x(Q + σ²I)⁻¹(y − m); variance k_** − Q_*x(Q + σ²I)⁻¹Q_x* (no FITC term)."""
    x, y = toy_regression
    z = torch.rand(6, 2, generator=generator) * 4 - 2
    x_test = torch.rand(5, 2, generator=generator) * 4 - 2
    sgpr = _sgpr(x, y, z)
    pred = sgpr.predict(sgpr.condition(x, y), x_test)
    both = torch.cat([x, x_test])
    Q = nystrom(matern32(both, z, LENGTHSCALE, OUTPUTSCALE), matern32(z, z, LENGTHSCALE,
                                                                      OUTPUTSCALE))
    n = x.shape[0]
    A = Q[:n, :n] + NOISE * torch.eye(n)
    mean = MEAN + Q[n:, :n] @ torch.linalg.solve(A, y - MEAN)
    var = OUTPUTSCALE - (Q[n:, :n] * torch.linalg.solve(A, Q[:n, n:]).T).sum(1)
    torch.testing.assert_close(pred.mean, mean, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(pred.variance, var, rtol=1e-7, atol=1e-8)


def test_inducing_points_start_at_kmeans_centres(toy_regression):
    """k-means initialisation: every centre lies inside the data's bounding box."""
    x, y = toy_regression
    z = build("sgpr", 2, init=(x, y), num_inducing=5).inducing_points
    assert z.shape == (5, 2)
    assert bool((z >= x.min(0).values).all() and (z <= x.max(0).values).all())


def test_fewer_points_than_inducing_points_raises(toy_regression):
    x, y = toy_regression
    with pytest.raises(ValueError, match="fewer than the 41 inducing points"):
        build("sgpr", 2, init=(x, y), num_inducing=41)


def test_finalize_sets_the_noise_that_maximises_the_dense_bound(toy_regression, generator):
    """After ``finalize`` σ² maximises the dense Titsias bound over σ² (nearby values give
    less) and the loss is no larger than before."""
    x, y = toy_regression
    sgpr = _sgpr(x, y, torch.rand(6, 2, generator=generator, dtype=torch.float64) * 4 - 2)
    before = float(sgpr.loss(sgpr.condition(x, y)).detach())
    changed = sgpr.finalize(x, y)
    noise = float(sgpr.likelihood.noise.detach())
    assert changed == {"noise_trained": pytest.approx(NOISE), "noise_calibrated": noise}
    after = float(sgpr.loss(sgpr.condition(x, y)).detach())
    assert after < before
    for factor in (0.97, 1.03):
        with torch.no_grad():
            sgpr.likelihood.noise = torch.tensor(noise * factor, dtype=torch.float64)
        assert float(_dense_titsias_loss(sgpr, x, y)) > after
