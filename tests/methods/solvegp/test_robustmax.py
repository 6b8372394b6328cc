"""The robust-max likelihood (notes/004 §2.13): P(argmax f = k) by Gauss–Hermite against
numerical integration and Monte Carlo; its expectations and predictive."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from gpscale.methods.solvegp.likelihoods import (
    RobustMax,
    argmax_probabilities,
    expected_log_lik,
    predictive,
)

MEAN = torch.tensor([[0.3, -1.0], [1.1, 0.0], [-0.4, 0.2]], dtype=torch.float64)  # (C, b)
VAR = torch.tensor([[0.5, 2.0], [0.2, 1.0], [1.5, 0.1]], dtype=torch.float64)


def _integral(mean, var, k):
    """∫ N(u; μ_k, σ_k²) Π_{c≠k} Φ((u − μ_c)/σ_c) du by adaptive quadrature."""
    std = np.sqrt(var)

    def integrand(u):
        others = [stats.norm.cdf((u - mean[c]) / std[c]) for c in range(len(mean)) if c != k]
        return stats.norm.pdf(u, mean[k], std[k]) * np.prod(others)

    return integrate.quad(integrand, -np.inf, np.inf, epsabs=1e-12)[0]


def test_argmax_probabilities_match_numerical_integration():
    """Column 1 mixes variances 2 and 0.1 (a sharp Φ under a wide density): the error falls
    with the nodes, to 10⁻² at 20 and 10⁻⁴ at 80."""
    expected = torch.tensor([[_integral(MEAN[:, j].numpy(), VAR[:, j].numpy(), k)
                              for j in range(2)] for k in range(3)], dtype=torch.float64)
    errors = [float((argmax_probabilities(MEAN, VAR, n) - expected).abs().max())
              for n in (10, 20, 40, 80)]
    assert errors == sorted(errors, reverse=True)
    assert errors[1] < 1e-2 and errors[3] < 1e-4
    torch.testing.assert_close(expected.sum(0), torch.ones(2, dtype=torch.float64), rtol=0,
                               atol=1e-6)


def test_argmax_probabilities_match_monte_carlo():
    g = torch.Generator().manual_seed(0)
    draws = MEAN + VAR.sqrt() * torch.randn(200_000, *MEAN.shape, generator=g,
                                            dtype=torch.float64)
    freq = torch.nn.functional.one_hot(draws.argmax(1), 3).double().mean(0).mT  # (C, b)
    torch.testing.assert_close(argmax_probabilities(MEAN, VAR, 80), freq, rtol=0, atol=5e-3)


def test_the_labels_probability_is_the_matching_row():
    labels = torch.tensor([2, 0])
    every = argmax_probabilities(MEAN, VAR, 20)
    torch.testing.assert_close(argmax_probabilities(MEAN, VAR, 20, labels=labels),
                               every[labels, torch.arange(2)])


def test_expectation_and_predictive():
    lik = RobustMax(3, epsilon=0.01)
    labels = torch.tensor([1, 2])
    p = argmax_probabilities(MEAN, VAR, 20, labels=labels)
    ell = expected_log_lik(lik, MEAN, VAR, labels, noise=None, num_quadrature=20,
                           num_samples=1, generator=None)
    torch.testing.assert_close(ell, p * math.log(0.99) + (1 - p) * math.log(0.005))
    pred = predictive(lik, MEAN, VAR, noise=None, num_quadrature=20, eps=torch.zeros(1, 3, 1))
    assert pred.probs.shape == (2, 3)
    torch.testing.assert_close(pred.probs.sum(1), torch.ones(2, dtype=torch.float64))
    assert (pred.probs >= 0.005 - 1e-9).all()  # ε/(C − 1) at least


def test_gradients_flow_through_the_quadrature():
    mean = MEAN.clone().requires_grad_(True)
    var = VAR.clone().requires_grad_(True)
    torch.autograd.gradcheck(lambda m, v: argmax_probabilities(m, v, 12, labels=torch.tensor(
        [0, 1])), (mean, var))


@pytest.mark.parametrize("bad", [0.0, 1.0])
def test_epsilon_outside_the_unit_interval_is_refused(bad):
    with pytest.raises(ValueError, match="epsilon"):
        RobustMax(3, epsilon=bad)
