"""Pivoted Cholesky and the P = LLᵀ + σ²I preconditioner against dense float64 algebra."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._matrices import rbf_gram, spd, spd_with_spectrum

from gpscale.linalg.preconditioners import PivotedCholeskyPreconditioner, pivoted_cholesky


def test_full_rank_pivoted_cholesky_is_exact(generator):
    """Rank n reproduces A exactly."""
    A = spd(12, 100.0, generator)
    L = pivoted_cholesky(A.diagonal(), lambda i: A[i], 12)
    torch.testing.assert_close(L @ L.mT, A, rtol=1e-10, atol=1e-10)


def test_low_rank_matrix_stops_at_its_rank(generator):
    """A rank-3 PSD matrix is recovered by 3 columns; rtol stops the factorisation there."""
    A = spd_with_spectrum(torch.tensor([3.0, 2.0, 1.0] + [0.0] * 9, dtype=torch.float64),
                          generator)
    L = pivoted_cholesky(A.diagonal(), lambda i: A[i], 8, rtol=1e-10)
    assert L.shape == (12, 3)
    torch.testing.assert_close(L @ L.mT, A, rtol=1e-10, atol=1e-10)


def test_reads_one_row_per_rank_and_pivots_greedily(generator):
    """Exactly r rows are read; the first pivot is the largest diagonal entry."""
    A = rbf_gram(40, generator) + torch.diag(torch.linspace(0, 1, 40, dtype=torch.float64))
    rows: list[int] = []
    pivoted_cholesky(A.diagonal(), lambda i: (rows.append(i), A[i])[1], 5)
    assert len(rows) == 5 and rows[0] == 39 and len(set(rows)) == 5


def test_trace_error_decreases_with_rank(generator):
    """tr(A − LLᵀ) decreases as the rank grows (fast-decaying RBF spectrum)."""
    A = rbf_gram(60, generator)
    errors = [torch.trace(A - L @ L.mT).item() for L in
              (pivoted_cholesky(A.diagonal(), lambda i: A[i], r) for r in (2, 5, 10, 20))]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3 * errors[0]


@pytest.fixture
def preconditioner(generator):
    K = rbf_gram(30, generator)
    return K, PivotedCholeskyPreconditioner.from_matrix(K, noise=0.1, rank=6)


def _dense(P: PivotedCholeskyPreconditioner) -> torch.Tensor:
    return P.L @ P.L.mT + P.noise * torch.eye(P.L.shape[0], dtype=P.L.dtype)


def test_woodbury_solve_logdet_and_matmul(preconditioner, generator):
    """P⁻¹R, log det P and P V equal the dense matrix's."""
    _, P = preconditioner
    R = torch.randn(30, 4, generator=generator)
    dense = _dense(P)
    torch.testing.assert_close(P.solve(R), torch.linalg.solve(dense, R), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(P.logdet(), torch.logdet(dense), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(P.matmul(R), dense @ R, rtol=1e-12, atol=1e-12)


def test_inverse_square_root(preconditioner, generator):
    """P^{-1/2} is the symmetric inverse square root from the eigendecomposition."""
    _, P = preconditioner
    evals, evecs = torch.linalg.eigh(_dense(P))
    expected = (evecs * evals.rsqrt()) @ evecs.mT
    torch.testing.assert_close(P.inv_sqrt_matmul(torch.eye(30)), expected, rtol=1e-10,
                               atol=1e-10)


def test_samples_have_covariance_p(preconditioner):
    """Empirical covariance of 40,000 samples is within 0.03 of P (entries ≤ 1.1)."""
    _, P = preconditioner
    Z = P.sample(40_000, torch.Generator().manual_seed(5))
    torch.testing.assert_close(Z @ Z.mT / 40_000, _dense(P), rtol=0, atol=0.03)


def test_nonpositive_noise_raises(generator):
    """σ² must be positive: the Woodbury form divides by it."""
    with pytest.raises(ValueError, match="noise > 0"):
        PivotedCholeskyPreconditioner.from_matrix(spd(4, 2.0, generator), noise=0.0, rank=2)
