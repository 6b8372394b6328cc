"""Metrics against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from gpscale import metrics
from gpscale.metrics import poisson_nll

PROBS = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
LABELS = torch.tensor([0, 1, 1])


def test_rmse_hand_case():
    """sqrt((3^2 + 4^2) / 2)."""
    assert metrics.rmse(torch.zeros(2), torch.tensor([3.0, 4.0])) == pytest.approx(math.sqrt(12.5))


def test_gaussian_nll_hand_case():
    """N(0,1) at y=0 and y=1: 0.5 log 2pi and 0.5 log 2pi + 0.5; mean of both."""
    value = metrics.gaussian_nll(torch.zeros(2), torch.ones(2), torch.tensor([0.0, 1.0]))
    assert value == pytest.approx(0.5 * math.log(2 * math.pi) + 0.25)


def test_gaussian_nll_scales_with_variance():
    """N(1, 4) at y=3: 0.5 (log 8pi + 1)."""
    value = metrics.gaussian_nll(torch.ones(1), torch.full((1,), 4.0), torch.full((1,), 3.0))
    assert value == pytest.approx(0.5 * (math.log(8 * math.pi) + 1.0))


def test_gaussian_nll_rejects_non_positive_variance():
    with pytest.raises(ValueError, match="positive"):
        metrics.gaussian_nll(torch.zeros(1), torch.zeros(1), torch.zeros(1))


def test_accuracy_hand_case():
    assert metrics.accuracy(PROBS, LABELS) == pytest.approx(2 / 3)


def test_multiclass_nll_hand_case():
    expected = -(math.log(0.9) + math.log(0.8) + math.log(0.4)) / 3
    assert metrics.multiclass_nll(PROBS, LABELS) == pytest.approx(expected)


def test_ece_one_point_per_bin():
    """Confidences 0.9, 0.8, 0.6 in separate bins, correct/correct/wrong: (0.1+0.2+0.6)/3."""
    assert metrics.ece(PROBS, LABELS) == pytest.approx(0.3)


def test_ece_two_points_in_one_bin():
    """0.95 (right) and 0.97 (wrong) share bin 15: |0.5 - 0.96| with weight 1."""
    probs = torch.tensor([[0.95, 0.05], [0.03, 0.97]])
    assert metrics.ece(probs, torch.tensor([0, 0])) == pytest.approx(0.46)


def test_ece_perfectly_calibrated_is_zero():
    """Confidence 0.5 in a bin whose accuracy is 0.5."""
    probs = torch.full((4, 2), 0.5)
    probs[:, 0] += 1e-9  # argmax is class 0 everywhere
    assert metrics.ece(probs, torch.tensor([0, 1, 0, 1])) == pytest.approx(0.0, abs=1e-8)


def test_coverage_error_hand_case():
    """N(0,1): 0, 1, 1.9 lie inside +-1.96, 2.0 and -3 outside: |3/5 - 0.95|."""
    y = torch.tensor([0.0, 1.0, 1.9, 2.0, -3.0])
    assert metrics.coverage_error(torch.zeros(5), torch.ones(5), y) == pytest.approx(0.35)


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="3 rows but targets have 2"):
        metrics.rmse(torch.zeros(3), torch.zeros(2))


def test_poisson_nll_without_latent_variance_is_the_poisson_pmf():
    """variance 0: -log Poisson(y; e^μ) = e^μ - yμ + log y!; y = (0, 3), μ = (log 2, 0)."""
    mean = torch.tensor([math.log(2.0), 0.0], dtype=torch.float64)
    y = torch.tensor([0.0, 3.0], dtype=torch.float64)
    expected = 0.5 * ((2.0 - 0.0) + (1.0 - 0.0 + math.log(6.0)))
    assert math.isclose(poisson_nll(mean, torch.zeros(2, dtype=torch.float64), y), expected,
                        rel_tol=1e-12)


def test_poisson_nll_integrates_over_the_latent():
    """Quadrature matches a fine trapezoid integral over f, and the predictive is wider."""
    mean = torch.tensor([0.5, 1.5, -1.0], dtype=torch.float64)
    var = torch.tensor([0.3, 0.05, 1.0], dtype=torch.float64)
    y = torch.tensor([4.0, 2.0, 0.0], dtype=torch.float64)
    f = torch.linspace(-12, 12, 200_001, dtype=torch.float64)[:, None]
    density = torch.exp(-(f - mean) ** 2 / (2 * var)) / torch.sqrt(2 * math.pi * var)
    pmf = torch.exp(y * f - torch.exp(f) - torch.lgamma(y + 1))
    reference = float(-torch.log(torch.trapezoid(density * pmf, f[:, 0], dim=0)).mean())
    assert math.isclose(poisson_nll(mean, var, y), reference, rel_tol=1e-8)
    with pytest.raises(ValueError, match="non-negative"):
        poisson_nll(mean, -var, y)
