"""``exact``: GPyTorch's Cholesky ExactGP against dense float64 formulas (R&W Alg. 2.1)."""

from __future__ import annotations

import math

import pytest
import torch

from gpscale.methods import build
from gpscale.training import FitConfig, fit, resolve_fit_config

from ._dense import exact_posterior, gaussian_logpdf, matern32

LENGTHSCALE = torch.tensor([0.8, 1.5])
OUTPUTSCALE, NOISE, MEAN = 1.3, 0.05, 0.2


@pytest.fixture
def model(toy_regression):
    """An exact GP with fixed, distinct ARD hyperparameters."""
    model = build("exact", 2, init=toy_regression, outputscale=OUTPUTSCALE, noise=NOISE,
                  mean_constant=MEAN)
    model.kernel.base_kernel.lengthscale = LENGTHSCALE
    return model


def _dense_nll(x, y, lengthscale, outputscale, noise, mean):
    K = matern32(x, x, lengthscale, outputscale)
    cov = K + noise * torch.eye(x.shape[0])
    return -gaussian_logpdf(y, mean * torch.ones_like(y), cov) / x.shape[0]


def test_loss_is_dense_negative_log_marginal_likelihood(model, toy_regression):
    """R&W Eq. 2.30: loss = −log N(y | m, K + σ²I) / n."""
    x, y = toy_regression
    loss = model.loss(model.condition(x, y))
    expected = _dense_nll(x, y, LENGTHSCALE, OUTPUTSCALE, NOISE, MEAN)
    # GPyTorch forms distances as ‖a‖² + ‖b‖² − 2aᵀb, which loses digits for close pairs.
    torch.testing.assert_close(loss, expected, rtol=1e-7, atol=1e-9)


def test_loss_gradient_matches_dense_autograd(model, toy_regression):
    """Gradients w.r.t. every raw parameter equal those of the dense expression."""
    x, y = toy_regression
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(model.loss(model.condition(x, y)), list(params.values()))
    dense = _dense_nll(x, y, model.kernel.base_kernel.lengthscale[0], model.kernel.outputscale,
                       model.likelihood.noise[0], model.mean.constant)
    expected = torch.autograd.grad(dense, list(params.values()))
    for name, g, e in zip(params, grads, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-8, msg=name)


@pytest.mark.parametrize("grad", [True, False], ids=["gpytorch-path", "in-place-cholesky"])
def test_predictive_matches_dense_posterior(model, toy_regression, generator, grad):
    """R&W Eqs. 2.25–2.26: latent mean and variance; noise is σ². With gradients GPyTorch's
    prediction; without, one Cholesky factor written over K + σ²I (the lean path)."""
    x, y = toy_regression
    x_test = torch.rand(7, 2, generator=generator) * 4 - 2
    with torch.set_grad_enabled(grad):
        state = model.condition(x, y)
        pred = model.predict(state, x_test, chunk_size=3)
    assert hasattr(state.gp, "_gpscale_cholesky") is not grad
    K = matern32(x, x, LENGTHSCALE, OUTPUTSCALE)
    K_sx = matern32(x_test, x, LENGTHSCALE, OUTPUTSCALE)
    mean, var = exact_posterior(K, K_sx, torch.full((7,), OUTPUTSCALE), y, MEAN, NOISE)
    torch.testing.assert_close(pred.mean, mean, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(pred.variance, var, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(pred.noise, torch.tensor(NOISE), rtol=1e-10, atol=0)


def test_default_initial_hyperparameters_follow_the_data(toy_regression):
    """Documented defaults: lengthscale √d, outputscale var(y), noise 0.1 var(y), mean mean(y)."""
    x, y = toy_regression
    model = build("exact", 2, init=(x, 3 * y))
    var = float((3 * y).var())
    assert model.options["lengthscale"] == math.sqrt(2)
    torch.testing.assert_close(model.kernel.base_kernel.lengthscale.detach(),
                               torch.full((1, 2), math.sqrt(2)), rtol=1e-9, atol=0)
    assert math.isclose(model.options["outputscale"], var, rel_tol=1e-12)
    assert math.isclose(float(model.likelihood.noise.detach()), 0.1 * var, rel_tol=1e-6)
    assert math.isclose(float(model.mean.constant.detach()), float((3 * y).mean()), rel_tol=1e-9)


def test_follows_init_dtype(toy_regression):
    """Parameters take the dtype of the init inputs."""
    x, y = toy_regression
    model = build("exact", 2, init=(x.float(), y.float()))
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_default_training_is_lbfgs_and_reaches_the_maximum_likelihood(toy_regression):
    """The exact key's defaults (L-BFGS, 5 iterations an epoch, plateau of 2 epochs) converge
    on their own to the maximum of log p(y): a gradient near zero and the loss of a long
    L-BFGS run (200 iterations an epoch)."""
    x, y = toy_regression
    config = resolve_fit_config("exact", x.shape[0], progress=False)
    assert (config.optimizer, config.lr, config.lbfgs_max_iter) == ("lbfgs", 1.0, 5)
    model = build("exact", 2, init=(x, y))
    history = fit(model, None, (x, y), config)
    assert history.stopped == "converged"
    loss = model.loss(model.condition(x, y))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert max(float(g.abs().max()) for g in grads) < 1e-4
    reference = build("exact", 2, init=(x, y))
    fit(reference, None, (x, y), FitConfig(optimizer="lbfgs", lr=1.0, lbfgs_max_iter=200,
                                           epochs=3, progress=False))
    best = float(reference.loss(reference.condition(x, y)).detach())
    assert abs(float(loss.detach()) - best) < 1e-6


def test_lean_prediction_is_gpytorchs_and_reuses_its_factor(model, toy_regression, generator,
                                                             monkeypatch):
    """Without gradients: GPyTorch's numbers (float64) for ordinary and far rows (the prior),
    and a second call on the same state does not factorise again."""
    from gpscale.linalg import ops

    x, y = toy_regression
    x_test = torch.cat([torch.rand(9, 2, generator=generator) * 4 - 2,
                        torch.full((2, 2), 1e12)])
    want = model.predict(model.condition(x, y), x_test)  # grad enabled: GPyTorch's path
    with torch.no_grad():
        state = model.posterior(x, y)
        got = model.predict(state, x_test)
        calls = []
        monkeypatch.setattr(ops.torch.linalg, "cholesky_ex",
                            lambda *a, **k: calls.append(1) or torch.linalg.cholesky_ex(*a, **k))
        again = model.predict(state, x_test[:4])
    assert not calls
    torch.testing.assert_close(got.mean, want.mean.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.variance, want.variance.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(again.mean, got.mean[:4], rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(got.variance[-2:], torch.full((2,), OUTPUTSCALE), rtol=1e-12,
                               atol=0)


def test_cholesky_in_place_retries_with_jitter_from_a_fresh_matrix():
    """A singular matrix: the factorisation overwrites it, so each retry rebuilds it; the
    factor is of A + jitter·I, with the lower triangle meaningful."""
    from gpscale.errors import NumericalError
    from gpscale.linalg.ops import cholesky_in_place

    v = torch.tensor([[1.0, 2.0, 3.0]])
    builds = []

    def build():
        builds.append(1)
        return v.mT @ v  # rank 1

    factor = cholesky_in_place(build, jitter=1e-6, max_tries=3, name="rank one")
    L = torch.tril(factor)
    torch.testing.assert_close(L @ L.mT, v.mT @ v + 1e-6 * 10 ** (len(builds) - 2)
                               * torch.eye(3), rtol=1e-9, atol=1e-12)
    assert len(builds) >= 2
    with pytest.raises(NumericalError, match="rank one .3, 3.*after 0 tries"):
        cholesky_in_place(build, jitter=1e-6, max_tries=0, name="rank one")
