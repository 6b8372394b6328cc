"""Squared distances with large scaled coordinates: exact dimensions instead of the norm expansion.

A lengthscale of 10⁻³ on a standardised feature gives |z| ~ 10³; in float32 the expansion
‖z₁‖² + ‖z₂‖² − 2z₁ᵀz₂ then carries errors of ~0.1 in D² and a kernel matrix built from it is
indefinite (the CaGP-Opt failure on Parkinsons). These tests pin the repair.
"""

from __future__ import annotations

import math

import pytest
import torch

from gpscale.kernels import (
    kernel_block_sparse_matmul,
    kernel_block_sparse_rect_matmul,
    kernel_matmul,
    kernel_matrix,
    make_kernel,
)
from gpscale.linalg import fused
from gpscale.linalg.chunked import chunked_product
from gpscale.linalg.operators.block_sparse import (
    BlockLayout,
    BlockSparseActions,
    symmetric_kernel_product,
)
from gpscale.linalg.operators.block_sparse_rect import rectangular_kernel_product


def _matern32(D2: torch.Tensor) -> torch.Tensor:
    r = math.sqrt(3.0) * D2.clamp_min(0).sqrt()
    return (1 + r) * torch.exp(-r)


def _wide(generator, n, d=4, dtype=torch.float64):
    """Inputs whose last two dimensions are scaled up to |z| ~ 10³."""
    z = torch.randn(n, d, generator=generator, dtype=torch.float64)
    z[:, -2:] *= 1e3
    return z.to(dtype)


def test_exact_dims_picks_the_large_dimensions_only_when_needed(generator):
    """Order-1 inputs need none (either dtype); a ×10³ dimension is moved last in float32 only."""
    z = torch.randn(50, 5, generator=generator)
    assert fused.exact_dims(z.float(), z.float())[1] == 0
    z[:, 1] *= 1e3
    order, exact = fused.exact_dims(z.float(), z.float())
    assert exact == 1 and order[-1] == 1 and sorted(order.tolist()) == list(range(5))
    assert fused.exact_dims(z, z)[1] == 0  # float64: 10⁶ · 2.2e-16 is far below the tolerance


@pytest.mark.parametrize("exact", [0, 1, 2, 3])
def test_inner_products_reproduce_squared_distances(exact, monkeypatch, generator):
    """sq1 + sq2 − 2P = ‖z₁ − z₂‖² for differences (≤ EXACT_DIFF_DIMS) and the float64 path."""
    monkeypatch.setattr(fused, "EXACT_DIFF_DIMS", 2)  # exact = 3 takes the float64 branch
    z1, z2 = torch.randn(1, 6, 4, generator=generator), torch.randn(1, 5, 4, generator=generator)
    P = torch.empty(1, 6, 5)
    fused.inner_products(z1, z2, P, exact)
    sq1, sq2 = fused.sq_norms(z1, exact)[..., :, None], fused.sq_norms(z2, exact)[..., None, :]
    torch.testing.assert_close(sq1 + sq2 - 2 * P, torch.cdist(z1, z2).square(), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("exact", [1, 2])
def test_fused_rule_with_exact_dims_matches_dense_and_gradcheck(exact, generator):
    """Φ V and its hand-written backward are unchanged by the split (float64, gradcheck)."""
    z1 = torch.randn(2, 7, 3, generator=generator, requires_grad=True)
    z2 = torch.randn(2, 6, 3, generator=generator, requires_grad=True)
    rhs = torch.randn(2, 6, 2, generator=generator, requires_grad=True)
    rule = fused.stationary_rule("matern32", compiled=False, exact=exact)
    out = chunked_product(rule, z1, z2, rhs, chunk_size=3)
    expected = _matern32(torch.cdist(z1, z2).square()) @ rhs
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda a, b, v: chunked_product(rule, a, b, v, chunk_size=3), (z1, z2, rhs))


def test_block_sparse_products_with_exact_dims_match_dense_and_gradcheck(generator):
    """Symmetric and rectangular block-sparse products with one exact dimension (float64)."""
    layout = BlockLayout(9, 4)
    z = torch.randn(9, 3, generator=generator, requires_grad=True)
    s = torch.randn(9, generator=generator, requires_grad=True)
    z_rows = torch.randn(5, 3, generator=generator, requires_grad=True)
    S = torch.zeros(9, 4)
    S[torch.arange(9), layout.block_ids()] = s.detach()
    sym = symmetric_kernel_product("matern32", z, s, layout, chunk_size=2, exact=1)
    rect = rectangular_kernel_product("matern32", z_rows, z, s, layout, chunk_size=2, exact=1)
    torch.testing.assert_close(sym, _matern32(torch.cdist(z, z).square()) @ S, rtol=1e-12,
                               atol=1e-12)
    torch.testing.assert_close(rect, _matern32(torch.cdist(z_rows, z).square()) @ S,
                               rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda a, b: symmetric_kernel_product("matern32", a, b, layout, chunk_size=2, exact=1),
        (z, s))
    assert torch.autograd.gradcheck(
        lambda r, a, b: rectangular_kernel_product("matern32", r, a, b, layout, chunk_size=2,
                                                   exact=1), (z_rows, z, s))


def _tiny_lengthscale_kernel():
    """Matérn-3/2 whose first lengthscale separates a near-categorical feature (Parkinsons)."""
    kernel = make_kernel("matern32", 3).double()
    kernel.initialize(**{"outputscale": 0.032,
                         "base_kernel.lengthscale": torch.tensor([[0.0044, 1.0, 0.7]])})
    return kernel


def _categorical_inputs(generator, n):
    x = torch.randn(n, 3, generator=generator, dtype=torch.float64)
    x[:, 0] = torch.randint(0, 3, (n,), generator=generator).double() * 1.3 - 1.0
    return x


@pytest.mark.parametrize("backend", ["fused", "compiled"])
def test_float32_kernel_products_stay_accurate_and_psd_with_tiny_lengthscale(backend,
                                                                             generator):
    """float32 K V within 1e-5 of float64 dense; K's smallest eigenvalue not below −1e-5.

    With the plain norm expansion this case gives errors of 7e-3 and an eigenvalue of −2e-3,
    more negative than a noise variance of 1e-3 can absorb.
    """
    kernel, x = _tiny_lengthscale_kernel(), _categorical_inputs(generator, 600)
    V = torch.randn(600, 4, generator=generator, dtype=torch.float64)
    K_ref = kernel_matrix(kernel, x, x)
    k32, x32 = kernel.float(), x.float()
    out = kernel_matmul(k32, x32, x32, V.float(), backend=backend).double()
    assert (out - K_ref @ V).abs().max() < 1e-5
    K = kernel_matmul(k32, x32, x32, torch.eye(600, dtype=torch.float32),
                      backend=backend).double()
    assert torch.linalg.eigvalsh(0.5 * (K + K.mT)).min() > -1e-5


def test_float32_block_sparse_products_stay_accurate_with_tiny_lengthscale(generator):
    """K S (symmetric training product) and K(x_rows, x) S in float32 against float64 dense."""
    kernel, x = _tiny_lengthscale_kernel(), _categorical_inputs(generator, 500)
    S = BlockSparseActions(torch.randn(500, generator=generator, dtype=torch.float64),
                           torch.randperm(500, generator=generator), num_blocks=25)
    S32 = BlockSparseActions(S.values.float(), S.index, num_blocks=25)
    k32, x32 = kernel.float(), x.float()
    dense = kernel_matrix(kernel, x, x) @ S.to_dense()
    sym = kernel_block_sparse_matmul(k32, x32, S32, backend="fused").double()
    rect = kernel_block_sparse_rect_matmul(k32, x32, S32, x_rows=x32[:100],
                                           backend="fused").double()
    assert (sym - dense).abs().max() < 1e-5
    assert (rect - dense[:100]).abs().max() < 1e-5


def test_wide_inputs_are_no_problem_in_float64(generator):
    """In float64 nothing is split and the expansion is already accurate at |z| ~ 10³."""
    z = _wide(generator, 30)
    assert fused.exact_dims(z, z)[1] == 0
    P = torch.empty(1, 30, 30)
    fused.inner_products(z[None], z[None], P)
    sq = fused.sq_norms(z)
    D2 = sq[:, None] + sq[None, :] - 2 * P[0]
    torch.testing.assert_close(D2, torch.cdist(z, z).square(), rtol=1e-9, atol=1e-6)
