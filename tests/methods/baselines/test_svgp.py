"""``svgp``: GPyTorch's SVGP against dense float64 formulas (Hensman 2013/2015, Titsias 2009)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpscale.methods import build

from ._dense import (
    kl_to_standard_normal,
    matern32,
    optimal_whitened_q,
    titsias_bound,
    whitened_marginals,
)

LENGTHSCALE, OUTPUTSCALE, NOISE, MEAN = 0.9, 1.3, 0.05, 0.2
HYPERS = {"lengthscale": LENGTHSCALE, "outputscale": OUTPUTSCALE, "mean_constant": MEAN}
JITTER = 1e-10  # GPyTorch adds it to K_zz and k(x, x); the dense side adds it to K_zz


def _regression(x, y, z, num_data=None):
    model = build("svgp", 2, init=(x, y), num_inducing=z.shape[0], noise=NOISE,
                  variational_jitter_double=JITTER, num_data=num_data, **HYPERS)
    with torch.no_grad():
        model.inducing_points.copy_(z)
    return model


def _set_q(model, mu, S):
    """Write whitened q(v) = N(mu, S) into GPyTorch's Cholesky variational distribution."""
    q = model.gp.variational_strategy._variational_distribution
    with torch.no_grad():
        q.variational_mean.copy_(mu)
        q.chol_variational_covar.copy_(torch.linalg.cholesky(S))


def _dense_kernels(x, z):
    K_zz = matern32(z, z, LENGTHSCALE, OUTPUTSCALE) + JITTER * torch.eye(z.shape[0])
    return torch.full((x.shape[0],), OUTPUTSCALE), matern32(x, z, LENGTHSCALE, OUTPUTSCALE), K_zz


@pytest.fixture
def inducing(generator):
    return torch.rand(6, 2, generator=generator, dtype=torch.float64) * 4 - 2


def test_elbo_at_optimal_q_equals_titsias_bound(toy_regression, inducing):
    """Titsias Eq. 10: with q(u) at its optimum, the uncollapsed ELBO equals the collapsed bound."""
    x, y = toy_regression
    model = _regression(x, y, inducing)
    K_diag, K_xz, K_zz = _dense_kernels(x, inducing)
    _set_q(model, *optimal_whitened_q(K_xz, K_zz, y, MEAN, NOISE))
    loss = model.loss(model.condition(x, y))
    expected = -titsias_bound(K_diag, K_xz, K_zz, y, MEAN, NOISE) / x.shape[0]
    torch.testing.assert_close(loss, expected, rtol=1e-7, atol=1e-9)


def test_named_terms_match_dense_formulas(toy_regression, inducing, generator):
    """ell = mean_j E_q[log N(y_j | f_j, σ²)], kl = KL[q(v) ‖ N(0, I)] / N, loss = kl − ell."""
    x, y = toy_regression
    model = _regression(x, y, inducing, num_data=100)
    mu = torch.randn(6, generator=generator)
    R = torch.randn(6, 6, generator=generator).tril() * 0.3 + torch.eye(6)
    S = R @ R.T
    _set_q(model, mu, S)
    state = model.condition(x, y)
    K_diag, K_xz, K_zz = _dense_kernels(x, inducing)
    f_mean, f_var = whitened_marginals(K_diag, K_xz, K_zz, MEAN, mu, S)
    f_var = f_var + JITTER  # GPyTorch's jitter on k(x, x)
    ell = (-0.5 * math.log(2 * math.pi * NOISE) - ((y - f_mean) ** 2 + f_var) / (2 * NOISE)).mean()
    kl = kl_to_standard_normal(mu, S) / 100
    torch.testing.assert_close(model.expected_log_lik(state), ell, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(model.kl(state), kl, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(model.loss(state), kl - ell, rtol=1e-8, atol=1e-10)
    pred = model.predict(state, x)
    torch.testing.assert_close(pred.mean, f_mean, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(pred.variance, f_var, rtol=1e-8, atol=1e-10)


def test_minibatch_losses_average_to_the_full_batch_loss(toy_regression, inducing):
    """The minibatch loss is unbiased: over a partition into equal batches it averages exactly."""
    x, y = toy_regression
    model = _regression(x, y, inducing)
    full = model.loss(model.condition(x, y))
    parts = [model.loss(model.condition(x[i:i + 10], y[i:i + 10])) for i in range(0, 40, 10)]
    torch.testing.assert_close(torch.stack(parts).mean(), full, rtol=1e-10, atol=1e-12)


@pytest.fixture
def binary(toy_regression):
    x, _ = toy_regression
    return x, (x[:, 0] + 0.3 * x[:, 1] > 0).double()


def test_binary_probabilities_are_the_probit_marginal(binary, generator):
    """GPyTorch's Bernoulli uses the probit link: p(y=1) = Φ(μ / √(1 + s²)); shape (t, 2)."""
    x, y = binary
    model = build("svgp", 2, task="classification", init=(x, y), num_inducing=6)
    x_test = torch.rand(9, 2, generator=generator) * 4 - 2
    pred = model.predict(model.condition(x, y), x_test)
    assert pred.probs.shape == (9, 2) and pred.mean.shape == (9,)
    p1 = 0.5 * (1 + torch.erf(pred.mean / torch.sqrt(2 * (1 + pred.variance))))
    torch.testing.assert_close(pred.probs[:, 1], p1, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(pred.probs.sum(1), torch.ones(9), rtol=0, atol=1e-12)


def test_binary_expected_log_lik_matches_quadrature(binary):
    """E_q[log Φ((2y − 1) f)] against 100-node Gauss–Hermite on the q(f) marginals."""
    x, y = binary
    model = build("svgp", 2, task="classification", init=(x, y), num_inducing=6)
    state = model.condition(x, y)
    pred = model.predict(state, x)
    nodes, weights = (torch.as_tensor(a) for a in np.polynomial.hermite.hermgauss(100))
    f = pred.mean[:, None] + math.sqrt(2) * pred.variance.sqrt()[:, None] * nodes  # (n, 100)
    log_phi = torch.special.log_ndtr((2 * y[:, None] - 1) * f)
    expected = (log_phi @ weights / math.sqrt(math.pi)).mean()
    # GPyTorch integrates with 20 nodes and its log_normal_cdf switches to an asymptotic series
    # for z < 0 (error up to ~5e-5 at z = −2, ~3e-4 averaged here): 1e-3.
    torch.testing.assert_close(model.expected_log_lik(state), expected, rtol=0, atol=1e-3)


@pytest.fixture
def three_classes(toy_regression):
    x, _ = toy_regression
    return x, torch.bucketize(x[:, 0].contiguous(), torch.tensor([-0.7, 0.7]))


def _softmax_mc(mean, variance, num_samples=200_000):
    """Reference: softmax averaged over independent Gaussian marginals (own generator)."""
    g = torch.Generator().manual_seed(123)
    eps = torch.randn(num_samples, *mean.shape, generator=g)
    return torch.softmax(mean + variance.sqrt() * eps, -1).mean(0)


def test_multiclass_probabilities(three_classes, generator):
    """C = 3 independent latent GPs: probs (t, C) in [0, 1], rows summing to 1, equal to a large
    Monte Carlo reference; a chunk of exactly C points (GPyTorch's ambiguous layout) too."""
    x, y = three_classes
    model = build("svgp", 2, task="classification", init=(x, y), num_inducing=6,
                  num_likelihood_samples=4000)
    assert model.num_classes == 3 and model.inducing_points.shape == (3, 6, 2)
    state = model.condition(x, y)
    x_test = torch.rand(7, 2, generator=generator) * 4 - 2
    with torch.no_grad():
        model.gp.variational_strategy.base_variational_strategy._variational_distribution \
            .variational_mean.normal_(generator=generator)
    for points in (x_test, x_test[:3]):
        pred = model.predict(state, points)
        assert pred.probs.shape == (points.shape[0], 3) and pred.mean.shape == (points.shape[0], 3)
        assert bool((pred.probs >= 0).all() and (pred.probs <= 1).all())
        torch.testing.assert_close(pred.probs.sum(1), torch.ones(points.shape[0]), rtol=0,
                                   atol=1e-12)
        # 4000 samples: Monte Carlo error of order 1e-2 at most.
        torch.testing.assert_close(pred.probs, _softmax_mc(pred.mean, pred.variance), rtol=0,
                                   atol=2e-2)


def test_multiclass_probabilities_do_not_depend_on_the_other_points(three_classes, generator):
    """The Monte Carlo draws are shared by every point: a point's probabilities are the same
    whatever else is predicted with it, in which order, and in which chunk (bitwise up to the
    GEMM blocking of the latent marginals)."""
    x, y = three_classes
    model = build("svgp", 2, task="classification", init=(x, y), num_inducing=6)
    state = model.condition(x, y)
    with torch.no_grad():
        model.gp.variational_strategy.base_variational_strategy._variational_distribution \
            .variational_mean.normal_(generator=generator)
    x_test = torch.rand(40, 2, generator=generator) * 4 - 2
    whole = model.predict(state, x_test).probs
    order = torch.randperm(40, generator=generator)
    torch.testing.assert_close(model.predict(state, x_test[order]).probs, whole[order])
    torch.testing.assert_close(model.predict(state, x_test[5:9]).probs, whole[5:9])
    torch.testing.assert_close(model.predict(state, x_test, chunk_size=7).probs, whole)
    torch.testing.assert_close(model.predict(state, x_test).probs, whole, rtol=0, atol=0)


def test_multiclass_expected_log_lik_on_a_batch_of_c_points(three_classes):
    """A batch of exactly C points gives E_q[log softmax(f)_y], not a transposed sample."""
    x, y = three_classes
    model = build("svgp", 2, task="classification", init=(x, y), num_inducing=6,
                  num_likelihood_samples=20_000)
    xb, yb = x[[0, 1, 2]], y[[0, 1, 2]]
    pred = model.predict(None, xb)
    g = torch.Generator().manual_seed(1)
    f = pred.mean + pred.variance.sqrt() * torch.randn(200_000, 3, 3, generator=g)
    expected = torch.log_softmax(f, -1).gather(-1, yb.expand(200_000, 3)[..., None]).mean()
    torch.manual_seed(0)
    ell = model.expected_log_lik(model.condition(xb, yb))
    torch.testing.assert_close(ell, expected, rtol=0, atol=2e-2)  # Monte Carlo error ~1e-2


def test_float32_training_step_is_finite(toy_regression):
    """Plumbing: the default float32 setting gives a finite loss and gradient."""
    x, y = (t.float() for t in toy_regression)
    model = build("svgp", 2, init=(x, y), num_inducing=8)
    loss = model.loss(model.condition(x, y))
    loss.backward()
    assert loss.dtype == torch.float32 and bool(torch.isfinite(loss))
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def test_rebuilding_needs_num_data_and_num_classes():
    with pytest.raises(ValueError, match="num_data"):
        build("svgp", 2, init=None, num_inducing=4)
    with pytest.raises(ValueError, match="num_classes"):
        build("svgp", 2, task="classification", init=None, num_inducing=4, num_data=10)


def test_fewer_points_than_inducing_points_raises(toy_regression):
    x, y = toy_regression
    with pytest.raises(ValueError, match="inducing points"):
        build("svgp", 2, init=(x, y), num_inducing=64)


def test_fixed_kernel_keeps_hyperparameters_through_training(three_classes):
    """learn_kernel=False: Adam steps move the variational parameters, never the kernel."""
    from gpscale.kernels import kernel_hyperparameters
    from gpscale.training import FitConfig, fit

    x, y = three_classes
    model = build("svgp", x.shape[1], task="classification", init=(x, y), num_inducing=4,
                  learn_kernel=False, lengthscale=0.05, outputscale=0.05).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fit(model, None, (x, y), FitConfig(epochs=3, lr=0.1))
    after = model.state_dict()
    hypers = kernel_hyperparameters(model.gp.covar_module)
    torch.testing.assert_close(hypers.lengthscale, torch.full_like(hypers.lengthscale, 0.05))
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all("variational" in k or "inducing" in k for k in moved)
    rebuilt = build("svgp", x.shape[1], task="classification", num_classes=3, init=None,
                    **model.options)
    assert not any(p.requires_grad for p in rebuilt.gp.covar_module.parameters())


def test_finalize_sets_q_and_noise_to_the_collapsed_optimum(toy_regression, inducing):
    """After ``finalize`` the ELBO equals Titsias' bound (q at its optimum) at a noise where the
    dense bound is maximal, and a single step from a prior q only raises the ELBO."""
    x, y = toy_regression
    model = _regression(x, y, inducing)
    K_diag, K_xz, K_zz = _dense_kernels(x, inducing)
    before = -model.loss(model.condition(x, y)).item()
    changed = model.finalize(x, y)
    noise = float(model.likelihood.noise.detach())
    assert changed["noise_trained"] == pytest.approx(NOISE)
    assert changed["noise_calibrated"] == pytest.approx(noise)
    elbo = -model.loss(model.condition(x, y)).item() * x.shape[0]
    assert elbo == pytest.approx(titsias_bound(K_diag, K_xz, K_zz, y, MEAN, noise).item(),
                                 rel=1e-6)
    assert elbo / x.shape[0] > before
    for factor in (0.97, 1.03):  # a maximum over σ² of the dense bound
        assert titsias_bound(K_diag, K_xz, K_zz, y, MEAN, noise * factor) < elbo
    mu, S = optimal_whitened_q(K_xz, K_zz, y, MEAN, noise)
    q = model.gp.variational_strategy._variational_distribution
    torch.testing.assert_close(q.variational_mean.detach(), mu, rtol=1e-6, atol=1e-8)
    L = q.chol_variational_covar.detach().tril()
    torch.testing.assert_close(L @ L.mT, S, rtol=1e-6, atol=1e-8)


def test_finalize_sums_over_ranks_and_skips_when_switched_off(toy_regression, inducing):
    """Two shards with a summing ``reduce`` give the one-process result; ``optimal_q=False``
    leaves the model alone."""
    x, y = toy_regression
    half = x.shape[0] // 2
    whole, first, second = (_regression(x, y, inducing) for _ in range(3))
    whole.finalize(x, y)
    sums = []  # the second shard's statistics, in the order a rank would reduce them
    second.finalize(x[half:], y[half:], reduce=lambda t: (sums.append(t), t)[1])
    first.finalize(x[:half], y[:half], reduce=lambda t: t + sums.pop(0))
    assert not sums
    assert float(first.likelihood.noise.detach()) == pytest.approx(
        float(whole.likelihood.noise.detach()), rel=1e-9)
    off = build("svgp", 2, init=(x, y), num_inducing=6, noise=NOISE, optimal_q=False, **HYPERS)
    assert off.finalize(x, y) is None
    assert float(off.likelihood.noise.detach()) == pytest.approx(NOISE)
