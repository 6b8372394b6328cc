"""Poisson likelihood with log link (paper §A.5, notes §7.2)."""

from __future__ import annotations

import torch

from gpscale.likelihoods import Poisson


def test_formulas(generator):
    """∇ = y − e^f, W⁻¹ = diag(e^{−f}), pseudo-targets f + y e^{−f} − 1 (notes §15.13)."""
    f = torch.randn(1, 10, generator=generator)
    y = torch.randint(0, 8, (10,), generator=generator).double()
    lik = Poisson()
    torch.testing.assert_close(lik.gradient(f, y), y - f.exp(), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(lik.W_inv_matmul(f, torch.ones_like(f)), (-f).exp(), rtol=0,
                               atol=0)
    y_hat = f + lik.W_inv_matmul(f, lik.gradient(f, y))
    torch.testing.assert_close(y_hat, f + y * (-f).exp() - 1, rtol=1e-13, atol=1e-13)


def test_log_prob_is_poisson_pmf(generator):
    """log p(y | f) equals torch.distributions.Poisson(e^f).log_prob(y)."""
    f = torch.randn(1, 10, generator=generator)
    y = torch.randint(0, 8, (10,), generator=generator).double()
    expected = torch.distributions.Poisson(f[0].exp()).log_prob(y)
    torch.testing.assert_close(Poisson().log_prob(f, y), expected, rtol=1e-13, atol=1e-13)
