"""Bernoulli-logit likelihood: R&W Eq. 3.15 forms."""

from __future__ import annotations

import torch

from gpscale.likelihoods import Bernoulli


def test_formulas(generator):
    """∇ = t − σ(f), W = σ(1 − σ), W⁻¹ = 1 / (σ(1 − σ)), log p = log σ((2t − 1) f)."""
    f = 3 * torch.randn(1, 8, generator=generator)
    t = torch.randint(0, 2, (8,), generator=generator)
    p = torch.sigmoid(f)
    lik = Bernoulli()
    torch.testing.assert_close(lik.gradient(f, t), t - p, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(lik.W_matmul(f, torch.ones_like(f)), p * (1 - p), rtol=1e-13,
                               atol=1e-15)
    torch.testing.assert_close(lik.W_inv_matmul(f, torch.ones_like(f)), 1 / (p * (1 - p)),
                               rtol=1e-12, atol=0)
    torch.testing.assert_close(lik.log_prob(f, t), torch.log(torch.sigmoid((2 * t - 1) * f[0])),
                               rtol=1e-12, atol=1e-14)


def test_W_inv_finite_for_large_logits():
    """2 + 2 cosh f stays finite where 1/(σ(1 − σ)) would divide by an underflowed σ."""
    f = torch.tensor([[-700.0, 700.0]], dtype=torch.float64)
    assert bool(torch.isfinite(Bernoulli().W_inv_matmul(f, torch.ones_like(f))).all())
