"""Shared likelihood properties: log p, gradient and W against autograd; W⁻¹ against W."""

from __future__ import annotations

import pytest
import torch
from tests.likelihoods._cases import NAMES, case

from gpscale.testing import dense_W, dense_W_inv


@pytest.mark.parametrize("name", NAMES)
def test_gradient_matches_autograd(name, generator):
    """∇_f Σ log p(y_n | f_n) by autograd equals ``gradient`` (notes §15.13)."""
    lik, f, y = case(name, generator)
    f_req = f.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(lik.log_prob(f_req, y).sum(), f_req)
    torch.testing.assert_close(lik.gradient(f, y), grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_W_is_negative_hessian(name, generator):
    """W(f) = −∇² log p(y | f) (autograd Hessian, latent-major flattening)."""
    lik, f, y = case(name, generator)
    shape = f.shape
    H = torch.autograd.functional.hessian(
        lambda flat: lik.log_prob(flat.reshape(shape), y).sum(), f.reshape(-1))
    torch.testing.assert_close(dense_W(lik, f), -H, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["gaussian", "bernoulli", "poisson"])
def test_W_inv_inverts_W(name, generator):
    """W⁻¹ W = I for the likelihoods with invertible W."""
    lik, f, _ = case(name, generator)
    eye = torch.eye(f.numel(), dtype=f.dtype)
    torch.testing.assert_close(dense_W_inv(lik, f) @ dense_W(lik, f), eye, rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_products_accept_vectors_and_matrices(name, generator):
    """A (L, n) vector and the columns of a (L, n, k) block give the same products."""
    lik, f, _ = case(name, generator)
    V = torch.randn(*f.shape, 3, generator=generator)
    for matmul in (lik.W_matmul, lik.W_inv_matmul):
        block = matmul(f, V)
        assert block.shape == V.shape
        for k in range(3):
            torch.testing.assert_close(block[..., k], matmul(f, V[..., k]), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_wrong_latent_shape_raises(name, generator):
    """f must be (L, n)."""
    lik, f, y = case(name, generator)
    with pytest.raises(ValueError, match="latent values"):
        lik.log_prob(f.reshape(-1)[None, None], y)
