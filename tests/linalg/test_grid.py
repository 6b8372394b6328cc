"""Grid, interpolation W, K_G, the WᵀW stencil and the factorized solvers (notes/002 §10)."""

from __future__ import annotations

import pytest
import torch

from gpscale.kernels import make_kernel
from gpscale.linalg.factorized import factorized_cg, span_cg, span_lanczos
from gpscale.linalg.interpolation import interpolate, keys_cubic, make_grid
from gpscale.linalg.solvers.lanczos import lanczos
from gpscale.linalg.stencil import GramStencil, cell_blocks, pair_offsets
from gpscale.linalg.toeplitz import grid_kernel

F64 = torch.float64


def _points(n, d, seed=0, low=0.0, high=1.0):
    g = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(n, d, generator=g, dtype=F64)


def _problem(n=120, d=1, sizes=(14,), seed=0, noise=0.05):
    """Small dense SKI problem: grid, W (dense), K_G (dense), K̃, y."""
    grid = make_grid([0.0] * d, [1.0] * d, list(sizes))
    x = _points(n, d, seed)
    rows = interpolate(grid, x)
    K = grid_kernel(grid, "rbf", torch.full((d,), 0.3, dtype=F64), torch.tensor(1.5, dtype=F64))
    W = rows.to_dense()
    Kd = K.to_dense()
    Kt = W @ Kd @ W.T + noise * torch.eye(n, dtype=F64)
    y = torch.sin(6 * x.sum(1)) + 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(1),
                                                     dtype=F64)
    gram = GramStencil.zeros(grid.sizes, grid.support).add_(rows, pair_offsets(4, d))
    return grid, rows, W, K, Kd, Kt, y, gram


@pytest.mark.parametrize("interp", ["cubic", "linear"])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_interpolation_rows_sum_to_one_and_reproduce_polynomials(interp, d):
    """§10.8: rows sum to 1; cubic (Keys) reproduces quadratics, linear reproduces lines."""
    grid = make_grid([-1.0] * d, [2.0] * d, [9] * d, interp)
    x = _points(40, d, low=-1.0, high=2.0)
    W = interpolate(grid, x).to_dense()
    torch.testing.assert_close(W.sum(1), torch.ones(40, dtype=F64), rtol=0, atol=1e-13)
    nodes = grid.points()
    coef = torch.linspace(0.5, 1.5, d, dtype=F64)
    f = (lambda p: 1 + p @ coef + (p**2) @ coef) if interp == "cubic" else (lambda p: 1 + p @ coef)
    torch.testing.assert_close(W @ f(nodes), f(x), rtol=0, atol=1e-12)


def test_keys_kernel_is_interpolating_with_support_four():
    """§10.8: weight 1 at its node, 0 at the other nodes, zero beyond distance 2."""
    t = torch.tensor([0.0, 1.0, 2.0, 2.5, 3.0], dtype=F64)
    torch.testing.assert_close(keys_cubic(t), torch.tensor([1.0, 0, 0, 0, 0], dtype=F64))
    grid = make_grid([0.0], [1.0], [12])
    rows = interpolate(grid, grid.points()[2:-2])  # nodes inside the padded box
    W = rows.to_dense()
    torch.testing.assert_close(W, torch.eye(12, dtype=F64)[2:-2], rtol=0, atol=1e-14)
    assert rows.index.shape[1] == 4


def test_points_outside_the_grid_raise_and_boundary_points_keep_full_rows():
    """Padding: every point of [lower − h, upper + h) has all 4^d neighbours; others raise."""
    grid = make_grid([0.0, 0.0], [1.0, 2.0], [10, 10])
    h0 = grid.spacing[0]
    x = torch.tensor([[0.0, 0.0], [1.0, 2.0], [-0.99 * h0, 1.0], [1 + 0.99 * h0, 1.0]], dtype=F64)
    W = interpolate(grid, x).to_dense()
    torch.testing.assert_close(W.sum(1), torch.ones(4, dtype=F64), rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="outside the interpolation grid in dimension 0"):
        interpolate(grid, torch.tensor([[1 + 1.01 * h0, 1.0]], dtype=F64))
    with pytest.raises(ValueError, match="at least 6 grid points"):
        make_grid([0.0], [1.0], [5])


def test_interpolation_products_match_dense():
    """W v (gather) and Wᵀ u (scatter) equal the dense products."""
    grid = make_grid([0.0, 0.0], [1.0, 1.0], [8, 7])
    rows = interpolate(grid, _points(50, 2))
    W = rows.to_dense()
    v, u = torch.randn(56, 3, dtype=F64), torch.randn(50, 3, dtype=F64)
    torch.testing.assert_close(rows.matmul(v), W @ v)
    torch.testing.assert_close(rows.rmatmul(u), W.T @ u)
    torch.testing.assert_close(rows.rmatmul(u[:, 0]), W.T @ u[:, 0])


@pytest.mark.parametrize("d,interp,bound", [(1, "cubic", 7), (2, "cubic", 49), (3, "cubic", 343),
                                            (2, "linear", 9)])
def test_gram_stencil_equals_dense_and_meets_sparsity_bound(d, interp, bound):
    """Claim 2: nnz/row(W) ≤ (2r)^d, nnz/row(WᵀW) ≤ (4r − 1)^d; stencil and CSR equal dense WᵀW."""
    sizes = {1: [20], 2: [9, 8], 3: [7, 6, 7]}[d]
    grid = make_grid([0.0] * d, [1.0] * d, sizes, interp)
    rows = interpolate(grid, _points(200, d))
    s = grid.support
    W = rows.to_dense()
    assert int((W != 0).sum(1).max()) <= s**d
    gram = GramStencil.zeros(grid.sizes, s).add_(rows, pair_offsets(s, d), block=37)
    dense = W.T @ W
    torch.testing.assert_close(gram.to_dense(), dense, rtol=0, atol=1e-12)
    torch.testing.assert_close(gram.to_csr().to_dense(), dense, rtol=0, atol=1e-12)
    assert int((dense.abs() > 1e-14).sum(1).max()) <= bound
    assert float(torch.linalg.eigvalsh(dense).min()) > -1e-12
    if d == 1:
        j = torch.arange(20)
        assert bool((dense[(j[:, None] - j[None]).abs() > 3] == 0).all())


@pytest.mark.parametrize("profile,d,structure", [
    ("rbf", 1, "kron"), ("rbf", 2, "kron"), ("rbf", 3, "kron"), ("matern32", 1, "kron"),
    ("matern12", 2, "bttb"), ("matern52", 3, "bttb"), ("rbf", 2, "bttb"),
])
def test_grid_kernel_fft_product_equals_dense_kernel(profile, d, structure):
    """§10.9: the FFT (Kronecker-)Toeplitz product equals GPyTorch's dense K_G (scale once)."""
    grid = make_grid([0.0] * d, [1.0] * d, [7, 6, 8][:d])
    kernel = make_kernel(profile, d).to(F64)
    kernel.base_kernel.lengthscale = torch.linspace(0.2, 0.5, d, dtype=F64)
    kernel.outputscale = 2.5
    nodes = grid.points()
    dense = kernel(nodes, nodes).to_dense()
    K = grid_kernel(grid, profile, kernel.base_kernel.lengthscale, kernel.outputscale, structure)
    torch.testing.assert_close(K.to_dense(), dense, rtol=1e-10, atol=1e-12)
    v = torch.randn(grid.num_points, 3, dtype=F64)
    torch.testing.assert_close(K.matmul(v), dense @ v, rtol=1e-10, atol=1e-12)
    rows = interpolate(grid, _points(9, d))
    W = rows.to_dense()
    torch.testing.assert_close(K.interp_quad(rows, pair_offsets(4, d)),
                               (W @ dense @ W.T).diagonal(), rtol=1e-10, atol=1e-12)


def test_grid_kernel_is_symmetric_toeplitz_in_1d_and_rejects_nonproduct_kron():
    """§10.9: 1-D K_G is symmetric Toeplitz; a Matérn with d > 1 is not a product kernel."""
    grid = make_grid([0.0], [1.0], [10])
    K = grid_kernel(grid, "matern52", torch.tensor(0.3), torch.tensor(1.0)).to_dense()
    torch.testing.assert_close(K, K.T)
    torch.testing.assert_close(K[1:, 1:], K[:-1, :-1])
    with pytest.raises(ValueError, match="not a product"):
        grid_kernel(make_grid([0, 0], [1, 1], [6, 6]), "matern32", torch.ones(2),
                    torch.tensor(1.0), "kron")


def test_factorized_cg_equals_cg_on_the_n_system():
    """Prop. 1 / §10.11: EFCG's solution and Lanczos T equal dense CG on K̃ (same b, x_0 = 0)."""
    grid, rows, W, K, Kd, Kt, y, gram = _problem()
    b = torch.stack([y, torch.randn(120, dtype=F64)], 1)
    res = factorized_cg(K.matmul, gram.matmul, 0.05, W.T @ b, (b * b).sum(0), rtol=1e-11,
                        max_iters=500, record_lanczos=True)
    x = W @ res.x_hat + res.c_x * b  # x = W x̂ + c_x r_0
    torch.testing.assert_close(x, torch.linalg.solve(Kt, b), rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(res.wt_x, W.T @ x, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(res.b_dot_x, (b * x).sum(0), rtol=1e-9, atol=0)
    # T from the first 6 CG coefficients equals 6 steps of dense Lanczos from b/‖b‖ (short runs
    # only: CG loses orthogonality, re-orthogonalised Lanczos does not, §9.2).
    short = factorized_cg(K.matmul, gram.matmul, 0.05, W.T @ b[:, :1], (b[:, :1] ** 2).sum(0),
                          rtol=0.0, max_iters=6, record_lanczos=True)
    _, T = lanczos(Kt, b[:, 0], 6)
    torch.testing.assert_close(short.tridiagonal[0].abs(), T.abs(), rtol=1e-7, atol=1e-8)


def test_first_cg_step_matches_textbook_alpha_not_printed_alg3():
    """§10.18: α_0 = r_0ᵀr_0 / r_0ᵀK̃r_0; the printed Alg. 3 (no c^p K_G Wᵀr_0 terms) differs."""
    grid, rows, W, K, Kd, Kt, y, gram = _problem()
    res = factorized_cg(K.matmul, gram.matmul, 0.05, (W.T @ y)[:, None], (y @ y).reshape(1),
                        rtol=0.0, max_iters=1)
    alpha_true = (y @ y) / (y @ Kt @ y)
    torch.testing.assert_close(res.c_x[0], alpha_true)  # x_1 = α_0 r_0: x̂ = 0, c_x = α_0
    # The printed denominator ŝᵀẑ + σ² c^p (...) with ŝ = ẑ = 0 at k = 0 reduces to σ²‖r_0‖²:
    alpha_printed = (y @ y) / (0.05 * (y @ y))
    assert abs(float(alpha_printed - alpha_true)) > 10 * float(alpha_true)


def test_factorized_solvers_use_one_kernel_and_one_gram_product_per_iteration():
    """§10.12: EFCG, Alg. 4 and EFLA do exactly one K_G and one WᵀW product per iteration."""
    grid, rows, W, K, Kd, Kt, y, gram = _problem()
    calls = {"K": 0, "B": 0}

    def Kc(v):
        calls["K"] += 1
        return K.matmul(v)

    def Bc(v):
        calls["B"] += 1
        return gram.matmul(v)

    res = factorized_cg(Kc, Bc, 0.05, (W.T @ y)[:, None], (y @ y).reshape(1), rtol=0.0,
                        max_iters=10)
    assert res.iterations == 10 and calls == {"K": 11, "B": 10}  # + K_G Wᵀr_0 once
    calls.update(K=0, B=0)
    _, it = span_cg(Kc, Bc, 0.05, torch.randn(grid.num_points, 2, dtype=F64), rtol=0.0,
                    max_iters=7)
    assert it == 7 and calls == {"K": 8, "B": 8}  # + ℬ(r̂_0) once
    calls.update(K=0, B=0)
    span_lanczos(Kc, Bc, 0.05, torch.randn(grid.num_points, dtype=F64), 6)
    assert calls == {"K": 6, "B": 6}


def test_alg4_mean_and_covariance_columns():
    """§10.13–14: x̂^d + Wᵀy/σ² = Wᵀ K̃⁻¹ y (x_0 = y/σ²); r̂_0 = K_G w_* gives Wᵀ K̃⁻¹ W K_G w_*."""
    grid, rows, W, K, Kd, Kt, y, gram = _problem()
    s2 = 0.05
    r0 = -(Kd @ (W.T @ y)) / s2
    xd, _ = span_cg(K.matmul, gram.matmul, s2, r0[:, None], rtol=1e-12, max_iters=500)
    torch.testing.assert_close(xd[:, 0] + W.T @ y / s2, W.T @ torch.linalg.solve(Kt, y),
                               rtol=1e-8, atol=1e-8)
    Ws = interpolate(grid, _points(3, 1, seed=5)).to_dense()
    cols = Kd @ Ws.T
    xd, _ = span_cg(K.matmul, gram.matmul, s2, cols, rtol=1e-12, max_iters=500)
    torch.testing.assert_close(xd, W.T @ torch.linalg.solve(Kt, W @ cols), rtol=1e-8, atol=1e-9)


def test_factorized_lanczos_equals_dense_lanczos():
    """§10.15: corrected FLA/EFLA with b = W b̂ gives dense Lanczos' T and Q = W Q̂."""
    grid, rows, W, K, Kd, Kt, y, gram = _problem(d=2, sizes=(7, 8), n=150)
    b_hat = torch.randn(grid.num_points, dtype=F64, generator=torch.Generator().manual_seed(3))
    Q_hat, P_hat, T = span_lanczos(K.matmul, gram.matmul, 0.05, b_hat, 12)
    Q, T_ref = lanczos(Kt, W @ b_hat, 12)
    torch.testing.assert_close(T, T_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(W @ Q_hat, Q, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(P_hat, W.T @ W @ Q_hat, rtol=1e-10, atol=1e-12)


def test_theorem1_identities_dense():
    """Theorem 1 / eqs. 7–9: mean, covariance C̃ = C̄ (symmetric) and log-determinant."""
    grid, rows, W, K, Kd, Kt, y, gram = _problem(d=2, sizes=(8, 7), n=200)
    n, m, s2 = 200, grid.num_points, 0.05
    B = W.T @ W
    A = Kd @ B + s2 * torch.eye(m, dtype=F64)
    zbar = torch.linalg.solve(A, Kd @ W.T @ y)
    torch.testing.assert_close(zbar, Kd @ W.T @ torch.linalg.solve(Kt, y), rtol=1e-9, atol=1e-10)
    C_tilde = Kd - Kd @ W.T @ torch.linalg.solve(Kt, W @ Kd)
    C_bar = s2 * torch.linalg.solve(A, Kd)
    torch.testing.assert_close(C_bar, C_tilde, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(C_bar, C_bar.T, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(y @ torch.linalg.solve(Kt, y), (y @ y - (W.T @ y) @ zbar) / s2)
    logdet_n = torch.linalg.slogdet(Kt)[1]
    logdet_m = torch.linalg.slogdet(A)[1] + (n - m) * torch.log(torch.tensor(s2, dtype=F64))
    torch.testing.assert_close(logdet_m, logdet_n, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("max_group", [1, 3, 64])
def test_cell_blocks_sum_to_the_per_point_outer_products(max_group):
    """Groups sharing a first node: Σ of their blocks per node = Σ_i w_i w_iᵀ of its points."""
    grid = make_grid([0.0] * 3, [1.0] * 3, [7, 6, 8])
    x = 0.1 + 0.4 * _points(300, 3)  # clustered: many points per cell, groups get cut at T
    rows = interpolate(grid, x)
    S = rows.weight.shape[1]
    expected = torch.zeros(grid.num_points, S, S, dtype=F64)
    expected.index_add_(0, rows.index[:, 0], rows.weight[:, :, None] * rows.weight[:, None, :])
    got = torch.zeros_like(expected)
    batches = list(cell_blocks(rows, max_group=max_group, max_entries=2 * S * S))
    assert len(batches) > 1  # several batches of at most 2 groups
    for cells, blocks in batches:
        assert blocks.shape[0] <= 2
        got.index_add_(0, cells, blocks)
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("buffer", [0, None], ids=["direct", "cell-buffer"])
def test_statistics_accumulator_gram_is_dense_WtW(buffer):
    """Per-cell buffer or direct scatter, over several chunks: the stencil equals dense WᵀW."""
    from gpscale.methods.ski.statistics import StatisticsAccumulator

    grid = make_grid([0.0] * 3, [1.0] * 3, [7, 6, 8])
    x = torch.cat([_points(150, 3), 0.4 + 0.05 * _points(150, 3, seed=2)])
    y = x.sum(1)
    acc = StatisticsAccumulator(grid, 0, cell_buffer_bytes=buffer)
    assert (acc.cell_sums is None) == (buffer == 0)
    for part in torch.arange(300).split(70):
        acc.add(x[part], y[part], None)
    W = interpolate(grid, x).to_dense()
    stats = acc.result("empty")
    torch.testing.assert_close(stats.gram.to_dense(), W.T @ W, rtol=0, atol=1e-12)
    torch.testing.assert_close(acc.result("empty").gram.to_dense(), W.T @ W, rtol=0, atol=1e-12)
