"""The preconditioned m-dimensional solver for K̃ = W K_G Wᵀ + σ²I (gpscale.linalg.whitened)."""

from __future__ import annotations

import math

import pytest
import torch

from gpscale.linalg.factorized import factorized_cg
from gpscale.linalg.interpolation import interpolate, make_grid
from gpscale.linalg.stencil import GramStencil, pair_offsets
from gpscale.linalg.toeplitz import grid_kernel
from gpscale.linalg.whitened import (
    KroneckerPreconditioner,
    WhitenedSystem,
    kron_matmul,
    kron_sqrt_factors,
    marginal_grams,
    whitened_solve,
)

F64 = torch.float64


def _setup(n, sizes, seed=0, noise=0.01, ell=0.2, scale=1.3, density=None):
    d = len(sizes)
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=F64)
    if density == "skewed":
        x = x**2  # not uniform, still a product density
    grid = make_grid([-0.1] * d, [1.1] * d, list(sizes))
    rows = interpolate(grid, x)
    gram = GramStencil.zeros(grid.sizes, grid.support).add_(rows, pair_offsets(4, d))
    K = grid_kernel(grid, "rbf", torch.full((d,), ell, dtype=F64), torch.tensor(scale, dtype=F64))
    W = rows.to_dense()
    Kt = W @ K.to_dense() @ W.T + noise * torch.eye(n, dtype=F64)
    b = torch.randn(n, 3, generator=g, dtype=F64)
    return grid, rows, gram, K, W, Kt, b


def test_kron_matmul_and_square_roots_match_dense_kronecker():
    g = torch.Generator().manual_seed(0)
    F = [torch.randn(m, m, generator=g, dtype=F64) for m in (3, 4, 2)]
    V = torch.randn(24, 5, generator=g, dtype=F64)
    dense = torch.kron(torch.kron(F[0], F[1]), F[2])
    torch.testing.assert_close(kron_matmul(F, V), dense @ V, rtol=1e-12, atol=1e-12)
    _, _, _, K, *_ = _setup(10, (7, 6, 6))
    Ls = kron_sqrt_factors(K)
    Lk = torch.kron(torch.kron(Ls[0], Ls[1]), Ls[2])
    torch.testing.assert_close(float(K.outputscale) * Lk @ Lk, K.to_dense(), rtol=0, atol=1e-10)
    torch.testing.assert_close(Lk, Lk.T)


@pytest.mark.parametrize("sizes", [(12,), (7, 6), (6, 7, 6)])
def test_marginal_grams_sum_wtw_over_the_other_dimensions(sizes):
    _, _, gram, _, W, *_ = _setup(50, sizes)
    Bd = (W.T @ W).reshape(*sizes, *sizes)
    d = len(sizes)
    for j, B_j in enumerate(marginal_grams(gram)):
        others = [a for a in range(d) if a != j] + [d + a for a in range(d) if a != j]
        torch.testing.assert_close(B_j, Bd.sum(dim=others) if others else Bd, rtol=1e-12,
                                   atol=1e-12)


def test_preconditioner_is_exact_in_one_dimension_and_spd_in_three():
    """d = 1: B̄ = WᵀW, so P = Â and CG converges in one iteration; d = 3: P SPD and P⁻¹P^{1/2}…"""
    grid, rows, gram, K, W, Kt, b = _setup(200, (30,))
    res = whitened_solve(K, gram.matmul, marginal_grams(gram), 0.01, 200, W.T @ b,
                         (b * b).sum(0), num_logdet_probes=0, rtol=1e-10, max_iters=50)
    assert res.iterations <= 2
    grid, rows, gram, K, W, Kt, b = _setup(300, (7, 6, 6))
    P = KroneckerPreconditioner.build(kron_sqrt_factors(K), float(K.outputscale),
                                      marginal_grams(gram), 0.01, 300)
    eye = torch.eye(252, dtype=F64)
    Pinv = P.solve(eye)
    torch.testing.assert_close(Pinv, Pinv.T, rtol=0, atol=1e-12)
    assert float(torch.linalg.eigvalsh(Pinv).min()) > 0
    half = P.inv_sqrt_matmul(eye)
    torch.testing.assert_close(half @ half, Pinv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(P.logdet(), -torch.linalg.slogdet(Pinv)[1], rtol=1e-10, atol=0)


@pytest.mark.parametrize("sizes,density", [((25,), None), ((8, 7), "skewed"), ((7, 6, 6), None)])
def test_whitened_solve_equals_dense_k_tilde_solves(sizes, density):
    """a = K_G Wᵀ K̃⁻¹ b, Wᵀ K̃⁻¹ b, bᵀ K̃⁻¹ b against dense float64; log det K̃ by SLQ."""
    n = 400
    grid, rows, gram, K, W, Kt, b = _setup(n, sizes, density=density)
    res = whitened_solve(K, gram.matmul, marginal_grams(gram), 0.01, n, W.T @ b, (b * b).sum(0),
                         num_logdet_probes=64, rtol=1e-11, max_iters=500, seed=3)
    x = torch.linalg.solve(Kt, b)
    torch.testing.assert_close(res.wt_x, W.T @ x, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(res.a, K.to_dense() @ W.T @ x, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(res.b_dot_x, (b * x).sum(0), rtol=1e-8, atol=0)
    logdet = torch.linalg.slogdet(Kt)[1]
    spread = res.logdet_samples.std() / math.sqrt(64)
    assert abs(float(res.logdet_samples.mean() - logdet)) < 4 * float(spread) + 1e-6
    # The preconditioner makes the SLQ samples nearly exact: their spread is tiny vs |log det|.
    assert float(res.logdet_samples.std()) < 0.05 * abs(float(logdet))


@pytest.mark.long
def test_preconditioning_beats_factorized_cg_as_n_grows():
    """At fixed m the factorized CG needs more iterations as n grows; the whitened PCG does not."""
    its = {}
    for n in (2_000, 40_000):
        grid, rows, gram, K, *_ = _setup_large(n)
        y = torch.sin(6 * torch.arange(n, dtype=F64) / n)
        h = rows.rmatmul(y)[:, None]
        rho = (y @ y).reshape(1)
        fcg = factorized_cg(K.matmul, gram.matmul, 0.01, h, rho, rtol=1e-6, max_iters=3000)
        w = whitened_solve(K, gram.matmul, marginal_grams(gram), 0.01, n, h, rho,
                           num_logdet_probes=0, rtol=1e-6, max_iters=3000)
        torch.testing.assert_close(w.b_dot_x, fcg.b_dot_x, rtol=1e-4, atol=0)
        its[n] = (fcg.iterations, w.iterations)
    assert its[40_000][0] > its[2_000][0]
    assert its[40_000][1] < its[40_000][0] / 20
    assert its[40_000][1] <= 2 * its[2_000][1] + 5


def _setup_large(n, sizes=(20, 20, 8)):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, generator=g, dtype=F64)
    grid = make_grid([0.0] * 3, [1.0] * 3, list(sizes))
    rows = interpolate(grid, x)
    gram = GramStencil.zeros(grid.sizes, grid.support).add_(rows, pair_offsets(4, 3))
    K = grid_kernel(grid, "rbf", torch.full((3,), 0.2, dtype=F64), torch.tensor(1.0, dtype=F64))
    return grid, rows, gram, K


def test_posterior_quad_is_the_dense_posterior_covariance_even_with_a_loose_solve():
    """cᵀ(K_G − K_G Wᵀ K̃⁻¹ W K_G)c = σ²(Lc)ᵀÂ⁻¹(Lc): at rtol 1e-3 still within 1e-4 of the
    prior variance (the Woodbury form subtracts nothing large)."""
    n, noise = 3_000, 0.01
    grid, rows, gram, K, W, Kt, b = _setup(n, (8, 7, 6), noise=noise)
    system = WhitenedSystem.build(K, gram.matmul, marginal_grams(gram), noise, n)
    C = torch.randn(K.num_grid, 4, generator=torch.Generator().manual_seed(5), dtype=F64)
    Kd = K.to_dense()
    KWt = Kd @ W.T
    dense = ((C.T @ (Kd - KWt @ torch.linalg.solve(Kt, KWt.T))) * C.T).sum(1)
    prior = ((C.T @ Kd) * C.T).sum(1)
    tight = system.posterior_quad(C, rtol=1e-12, max_iters=500)
    torch.testing.assert_close(tight, dense, rtol=1e-7, atol=1e-10)
    loose = system.posterior_quad(C, rtol=1e-3, max_iters=500)
    assert float(((loose - dense).abs() / prior).max()) < 1e-4
