"""Lanczos: orthonormal Q with QᵀAQ = T, breakdown, batched start vectors, quadrature."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._matrices import spd, spd_with_spectrum

from gpscale.linalg.solvers import lanczos, lanczos_quadrature


@pytest.mark.parametrize("reorthogonalize", [True, False], ids=["reorth", "plain"])
def test_lanczos_tridiagonalises(reorthogonalize, generator):
    """Q has orthonormal columns, QᵀAQ = T, and Q[:, 0] is the normalised start vector."""
    A = spd(30, 10.0, generator)
    v = torch.randn(30, generator=generator)
    Q, T = lanczos(A, v, 10, reorthogonalize=reorthogonalize)
    assert Q.shape == (30, 10) and T.shape == (10, 10)
    torch.testing.assert_close(Q.mT @ Q, torch.eye(10), rtol=0, atol=1e-10)
    torch.testing.assert_close(Q.mT @ A @ Q, T, rtol=0, atol=1e-10)
    torch.testing.assert_close(Q[:, 0], v / v.norm())
    assert torch.count_nonzero(torch.triu(T, 2)) == 0


def test_lanczos_full_run_diagonalises(generator):
    """With m = n and re-orthogonalisation, T has A's eigenvalues."""
    A = spd(25, 1e4, generator)
    Q, T = lanczos(A, torch.randn(25, generator=generator), 25)
    torch.testing.assert_close(torch.linalg.eigvalsh(T), torch.linalg.eigvalsh(A), rtol=1e-9,
                               atol=1e-9)
    torch.testing.assert_close(Q @ T @ Q.mT, A, rtol=1e-9, atol=1e-9)


def test_lanczos_stops_at_breakdown(generator):
    """A matrix with 4 distinct eigenvalues gives an invariant subspace after 4 steps."""
    eigenvalues = torch.tensor([1.0, 2.0, 5.0, 9.0], dtype=torch.float64).repeat_interleave(5)
    A = spd_with_spectrum(eigenvalues, generator)
    Q, T = lanczos(A, torch.randn(20, generator=generator), 15)
    assert T.shape == (4, 4)
    torch.testing.assert_close(torch.linalg.eigvalsh(T), eigenvalues.unique(), rtol=1e-10,
                               atol=1e-10)


def test_lanczos_batched_equals_one_by_one(generator):
    """Start vectors as columns (n, k) give the k single-vector results."""
    A = spd(20, 100.0, generator)
    V = torch.randn(20, 3, generator=generator)
    Q, T = lanczos(lambda X: A @ X, V, 7)
    assert Q.shape == (3, 20, 7) and T.shape == (3, 7, 7)
    for j in range(3):
        Qj, Tj = lanczos(A, V[:, j], 7)
        torch.testing.assert_close(Q[j], Qj, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(T[j], Tj, rtol=1e-10, atol=1e-10)


def test_batched_breakdown_pads_without_changing_quadrature(generator):
    """A vector in a 2-dim invariant subspace breaks down early; its quadrature stays exact."""
    eigenvalues = torch.linspace(1.0, 10.0, 12, dtype=torch.float64)
    A = spd_with_spectrum(eigenvalues, generator)
    _, vectors = torch.linalg.eigh(A)
    V = torch.stack([vectors[:, 0] + vectors[:, 5], torch.randn(12, generator=generator)], 1)
    Q, T = lanczos(A, V, 12)
    torch.testing.assert_close(Q[0, :, 2:], torch.zeros(12, 10))
    evals, evecs = torch.linalg.eigh(A)
    for j in range(2):
        v = V[:, j] / V[:, j].norm()
        expected = v @ (evecs * evals.log()) @ evecs.mT @ v
        torch.testing.assert_close(lanczos_quadrature(T[j]), expected, rtol=1e-10, atol=1e-10)


def test_quadrature_with_m_equal_n_is_exact(generator):
    """e₁ᵀ f(T) e₁ ‖v‖² = vᵀ f(A) v for m = n (f = log and f = sqrt)."""
    A = spd(16, 1e3, generator)
    v = torch.randn(16, generator=generator)
    _, T = lanczos(A, v, 16)
    evals, evecs = torch.linalg.eigh(A)
    for fn in (torch.log, torch.sqrt):
        expected = v @ (evecs * fn(evals)) @ evecs.mT @ v
        torch.testing.assert_close(v.square().sum() * lanczos_quadrature(T, fn), expected,
                                   rtol=1e-9, atol=1e-9)
