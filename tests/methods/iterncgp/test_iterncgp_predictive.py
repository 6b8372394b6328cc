"""IterNCGP (notes/000 §15): the predictive per likelihood (probit and Monte Carlo
probabilities, Poisson rates), float32 against float64, and bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from gpscale.methods.iterncgp import (
    IterNCGP,
    PredictiveOptions,
    Stopping,
)
from gpscale.methods.iterncgp.latent import (
    probit_softmax_probs,
    softmax_probs_joint,
)

from ._cases import (
    EXACT,
    make_problem,
    problem_kernel,
    small_model,
)


def test_probit_softmax_probabilities():
    """§15.16: probit probabilities sum to 1 and equal softmax(m) at zero variance."""
    g = torch.Generator().manual_seed(0)
    mean, var = torch.randn(6, 4, generator=g), torch.rand(6, 4, generator=g)
    torch.testing.assert_close(probit_softmax_probs(mean, var).sum(-1), torch.ones(6))
    torch.testing.assert_close(probit_softmax_probs(mean, 0 * var), torch.softmax(mean, -1))
    expected = torch.softmax(mean / torch.sqrt(1 + math.pi / 8 * var), -1)
    torch.testing.assert_close(probit_softmax_probs(mean, var), expected, **EXACT)


@pytest.mark.parametrize("probs", ["probit", "mc"])
@pytest.mark.parametrize("name", ["bernoulli", "softmax"])
def test_predictive_probabilities(name, probs, generator):
    """Class probabilities sum to 1; Monte Carlo ≈ probit (same latent moments)."""
    lik, x, y, x_test = make_problem(name, generator)
    model = IterNCGP(problem_kernel(x, lik), lik, predictive=PredictiveOptions(probs, 20_000))
    pred = model.predict(model.condition(x, y), x_test)
    torch.testing.assert_close(pred.probs.sum(-1), torch.ones(x_test.shape[0]))
    probit = IterNCGP(problem_kernel(x, lik), lik).predict(model.condition(x, y), x_test)
    # loose: MC noise (~0.005) plus the probit approximation's own error (a few percent)
    torch.testing.assert_close(pred.probs, probit.probs, rtol=0, atol=0.06)


@pytest.mark.parametrize("probs", ["probit", "mc"])
def test_softmax_probabilities_use_the_joint_latent_covariance(probs, generator):
    """Softmax probabilities from the L × L latent covariance at each point: Monte Carlo equals
    an independent sampler of N(m, Σ); probit is the per-class approximation on the centred
    latents P f ~ N(P m, P Σ P); neither moves when the latents share a common shift (mean
    + a·1, covariance + b·11ᵀ), which the softmax cannot see."""
    lik, x, y, x_test = make_problem("softmax", generator)
    model = IterNCGP(problem_kernel(x, lik), lik, predictive=PredictiveOptions(probs, 20_000))
    state = model.condition(x, y)
    mean, _ = model.latent_marginals(state, x_test)
    cov = model.latent_covariance(state, x_test)  # (t, C, C)
    assert bool((cov - cov.mT).abs().max() < 1e-12)
    assert bool((torch.linalg.eigvalsh(cov) > -1e-10).all())
    got = model.predict(state, x_test).probs
    m = mean.mT  # (t, C)
    C = m.shape[-1]
    if probs == "mc":
        jitter = 1e-9 * torch.eye(C, dtype=cov.dtype)
        draws = torch.distributions.MultivariateNormal(m, cov + jitter).sample((50_000,))
        expected = torch.softmax(draws, -1).mean(0)
        torch.testing.assert_close(got, expected, rtol=0, atol=0.01)  # MC error ~0.003
    else:
        P = torch.eye(C, dtype=m.dtype) - 1.0 / C
        centred_var = (P @ cov @ P).diagonal(dim1=-2, dim2=-1)
        expected = probit_softmax_probs(m @ P, centred_var)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    options = PredictiveOptions(probs, 20_000)
    shifted = softmax_probs_joint(m + 3.0, cov + 2.0, options)
    torch.testing.assert_close(shifted, softmax_probs_joint(m, cov, options), rtol=0,
                               atol=1e-10 if probs == "probit" else 0.01)
    torch.testing.assert_close(softmax_probs_joint(m, 0 * cov, options), torch.softmax(m, -1),
                               rtol=1e-10, atol=1e-12)


def test_poisson_rate_is_lognormal_mean(generator):
    """Predictive.rate = E[exp f] = exp(m + v/2) under the latent marginal."""
    lik, x, y, x_test = make_problem("poisson", generator)
    model = small_model(lik, x)
    pred = model.predict(model.condition(x, y), x_test)
    torch.testing.assert_close(pred.rate, torch.exp(pred.mean + pred.variance / 2), **EXACT)


@pytest.mark.parametrize("name", ["bernoulli", "softmax"])
def test_float32_stays_close_to_float64(name, generator):
    """A float32 run is finite and within 1e-3 of float64 (loose: float32 round-off in K̂ and
    the η/eigenvalue floors scale with eps(float32))."""
    lik, x, y, x_test = make_problem(name, generator)
    stopping = Stopping(max_iterations=5)
    results = []
    for dtype in (torch.float64, torch.float32):
        model = small_model(lik, x, stopping=stopping).to(dtype)
        pred = model.predict(model.condition(x.to(dtype), y), x_test.to(dtype))
        assert bool(torch.isfinite(pred.probs).all())
        results.append(pred.probs.double())
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-3)


# -- inputs, factory, registry, SoD ----------------------------------------------------------------
@pytest.mark.parametrize("case", ["label-too-large", "negative-count", "fractional-count"])
def test_bad_targets_raise(case, generator):
    """Labels outside 0..C−1, negative or non-integer counts: ValueError (validation.check_xy)."""
    name = "softmax" if case == "label-too-large" else "poisson"
    lik, x, y, _ = make_problem(name, generator)
    y = y.clone()
    y[0] = {"label-too-large": 3, "negative-count": -1, "fractional-count": 1.5}[case]
    with pytest.raises(ValueError, match="labels|count"):
        small_model(lik, x).condition(x, y)


def test_wrong_test_features_raise(generator):
    lik, x, y, _ = make_problem("poisson", generator)
    model = small_model(lik, x)
    with pytest.raises(ValueError, match="features"):
        model.predict(model.condition(x, y), torch.zeros(3, 2))
