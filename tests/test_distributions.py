"""Predictive: metrics routing, observed variance, concatenation."""

from __future__ import annotations

import math

import pytest
import torch

from gpscale.distributions import Predictive, concat


def test_regression_metrics_use_noise():
    """nll(y) uses latent variance + noise: N(0, 0.5 + 0.5) at y = 1."""
    p = Predictive(torch.zeros(1), torch.full((1,), 0.5), noise=torch.tensor(0.5))
    assert p.nll(torch.ones(1)) == pytest.approx(0.5 * math.log(2 * math.pi) + 0.5)
    assert p.stddev.item() == pytest.approx(1.0)
    assert set(p.metrics(torch.ones(1))) == {"test_rmse", "test_nll", "test_coverage",
                                             "test_coverage_error", "test_mean_std"}


def test_classification_metrics_use_probs():
    probs = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    p = Predictive(torch.zeros(2), torch.ones(2), probs=probs)
    m = p.metrics(torch.tensor([1, 0]))
    assert m["test_accuracy"] == pytest.approx(1.0)
    assert m["test_nll"] == pytest.approx(-(math.log(0.75) + math.log(0.5)) / 2)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="differ"):
        Predictive(torch.zeros(3), torch.ones(2))


def test_observed_variance_needs_noise():
    with pytest.raises(ValueError, match="Gaussian"):
        _ = Predictive(torch.zeros(2), torch.ones(2)).observed_variance


def test_concat_joins_chunks():
    a = Predictive(torch.zeros(2), torch.ones(2), noise=torch.tensor(0.1))
    b = Predictive(torch.ones(3), 2 * torch.ones(3), noise=torch.tensor(0.1))
    c = concat([a, b])
    torch.testing.assert_close(c.mean, torch.tensor([0.0, 0, 1, 1, 1]))
    torch.testing.assert_close(c.variance, torch.tensor([1.0, 1, 2, 2, 2]))
    assert c.noise.item() == pytest.approx(0.1)
