"""Gaussian likelihood: W⁻¹ = Λ and pseudo-targets equal y for every f (Thm. A.2)."""

from __future__ import annotations

import pytest
import torch

from gpscale.likelihoods import Gaussian


def test_pseudo_targets_are_y(generator):
    """Thm. A.2: ŷ(f) = f + W⁻¹∇log p(y | f) = y, independent of f."""
    lik = Gaussian(noise=0.3)
    y = torch.randn(9, generator=generator)
    for _ in range(3):
        f = 5 * torch.randn(1, 9, generator=generator)
        torch.testing.assert_close(f + lik.W_inv_matmul(f, lik.gradient(f, y)), y[None],
                                   rtol=1e-13, atol=1e-13)


def test_log_prob_is_normal_density(generator):
    """log N(y; f, σ²) per point, as torch.distributions computes it."""
    noise = 0.1 + torch.rand(6, generator=generator)
    f, y = torch.randn(1, 6, generator=generator), torch.randn(6, generator=generator)
    expected = torch.distributions.Normal(f[0], noise.sqrt()).log_prob(y)
    torch.testing.assert_close(Gaussian(noise).log_prob(f, y), expected, rtol=1e-13, atol=1e-13)


def test_W_inv_is_noise():
    """W⁻¹ = Λ = σ² I."""
    V = torch.ones(1, 4, 2)
    torch.testing.assert_close(Gaussian(0.25).W_inv_matmul(torch.zeros(1, 4), V), 0.25 * V)


def test_non_positive_noise_raises():
    with pytest.raises(ValueError, match="positive"):
        Gaussian(noise=0.0)
