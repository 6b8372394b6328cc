"""chunked_product: values, gradients (gradcheck with parameters), argument checks."""

from __future__ import annotations

import pytest
import torch

from gpscale.linalg.chunked import autograd_rule, chunked_product, default_chunk_size


def _block(x1: torch.Tensor, x2: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """A non-stationary block F_ij = exp(−θ₀‖x1ᵢ − x2ⱼ‖²) · (1 + θ₁ x1ᵢᵀx2ⱼ)."""
    return torch.exp(-theta[0] * torch.cdist(x1, x2).square()) * (1 + theta[1] * x1 @ x2.mT)


def _product(x1, x2, rhs, theta, chunk_size):
    rule = autograd_rule(lambda a, b, v: _block(a, b, theta) @ v, (theta,))
    return chunked_product(rule, x1, x2, rhs, chunk_size=chunk_size)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 50])
def test_chunked_product_equals_dense(chunk_size, generator):
    """Any chunk size (dividing n1 or not, larger than n1) gives the dense product."""
    x1, x2 = torch.randn(7, 2, generator=generator), torch.randn(5, 2, generator=generator)
    rhs, theta = torch.randn(5, 3, generator=generator), torch.tensor([0.7, 0.3])
    torch.testing.assert_close(_product(x1, x2, rhs, theta, chunk_size),
                               _block(x1, x2, theta) @ rhs, rtol=1e-13, atol=1e-13)


def test_chunked_product_gradcheck(generator):
    """gradcheck in x1, x2, rhs and the block's parameter θ (float64, n ≤ 10)."""
    inputs = (torch.randn(7, 2, generator=generator), torch.randn(5, 2, generator=generator),
              torch.randn(5, 2, generator=generator), torch.tensor([0.7, 0.3]))
    inputs = tuple(t.requires_grad_() for t in inputs)
    assert torch.autograd.gradcheck(lambda a, b, v, t: _product(a, b, v, t, 3), inputs)


def test_only_requested_gradients_are_computed(generator):
    """With only rhs requiring grad, the gradient is Fᵀ W and the others stay None."""
    x1, x2 = torch.randn(6, 2, generator=generator), torch.randn(4, 2, generator=generator)
    rhs = torch.randn(4, 2, generator=generator).requires_grad_()
    theta = torch.tensor([0.5, 0.1])
    weights = torch.randn(6, 2, generator=generator)
    (grad,) = torch.autograd.grad((_product(x1, x2, rhs, theta, 4) * weights).sum(), [rhs])
    torch.testing.assert_close(grad, _block(x1, x2, theta).mT @ weights)


def test_invalid_chunk_size():
    """chunk_size must be positive."""
    rule = autograd_rule(lambda a, b, v: a @ b.mT @ v)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer; got 0"):
        chunked_product(rule, torch.ones(2, 1), torch.ones(2, 1), torch.ones(2, 1), chunk_size=0)


def test_default_chunk_size_budget():
    """rows × n2 stays within the entry budget, at least one row."""
    assert default_chunk_size(1000, max_entries=10_000) == 10
    assert default_chunk_size(10**9, max_entries=10_000) == 1
