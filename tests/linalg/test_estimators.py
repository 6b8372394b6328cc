"""Hutchinson trace and stochastic Lanczos quadrature log-det against exact values."""

from __future__ import annotations

import torch
from tests.linalg._matrices import rbf_gram, spd

from gpscale.linalg.estimators import hutchinson_trace, stochastic_logdet
from gpscale.linalg.ops import rademacher
from gpscale.linalg.preconditioners import PivotedCholeskyPreconditioner


def test_hutchinson_samples_are_quadratic_forms(generator):
    """Each sample is zᵀAz for the probe drawn from the same generator state."""
    A = spd(20, 10.0, generator)
    result = hutchinson_trace(A, 20, 5, torch.Generator().manual_seed(7))
    Z = rademacher(20, 5, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(result.samples, torch.einsum("np,nm,mp->p", Z, A, Z))
    torch.testing.assert_close(result.estimate, result.samples.mean())


def test_hutchinson_is_unbiased(generator):
    """E[zᵀAz] = tr A: averaging 20,000 probes lands within 4 standard errors."""
    A = spd(30, 100.0, generator)
    result = hutchinson_trace(lambda V: A @ V, 30, 20_000, torch.Generator().manual_seed(1))
    # Var[zᵀAz] = 2 Σ_{i≠j} A_ij² for Rademacher z
    off = A - torch.diag(A.diagonal())
    std_error = (2 * off.square().sum() / 20_000).sqrt()
    torch.testing.assert_close(result.std_error, std_error, rtol=0.05, atol=0)
    assert abs(result.estimate - torch.trace(A)) < 4 * std_error


def test_slq_with_n_steps_is_exact_per_probe(generator):
    """num_iters = n: each sample equals zᵀ log(A) z for its Rademacher probe z."""
    A = spd(18, 1e3, generator)
    result = stochastic_logdet(A, 18, num_probes=4, num_iters=18,
                               generator=torch.Generator().manual_seed(2))
    Z = rademacher(18, 4, generator=torch.Generator().manual_seed(2))
    evals, evecs = torch.linalg.eigh(A)
    log_A = (evecs * evals.log()) @ evecs.mT
    torch.testing.assert_close(result.samples, torch.einsum("np,nm,mp->p", Z, log_A, Z),
                               rtol=1e-9, atol=1e-9)


def test_preconditioned_slq_with_n_steps_is_exact_per_probe(generator):
    """With P: sample = log det P + zᵀ log(P^{-1/2} A P^{-1/2}) z, exactly for m = n."""
    K = rbf_gram(20, generator)
    A = K + 0.01 * torch.eye(20)
    P = PivotedCholeskyPreconditioner.from_matrix(K, noise=0.01, rank=4)
    result = stochastic_logdet(A, 20, num_probes=3, num_iters=20, preconditioner=P,
                               generator=torch.Generator().manual_seed(4))
    Z = rademacher(20, 3, generator=torch.Generator().manual_seed(4))
    M = P.inv_sqrt_matmul(P.inv_sqrt_matmul(A).mT)  # P^{-1/2} A P^{-1/2}
    evals, evecs = torch.linalg.eigh(M)
    expected = torch.logdet(P.matmul(torch.eye(20))) + torch.einsum(
        "np,nm,mp->p", Z, (evecs * evals.log()) @ evecs.mT, Z)
    torch.testing.assert_close(result.samples, expected, rtol=1e-8, atol=1e-8)


def test_slq_estimate_within_standard_errors(generator):
    """200 probes, 25 Lanczos steps: |estimate − log det A| ≤ 4 standard errors."""
    A = spd(80, 1e2, generator)
    result = stochastic_logdet(lambda V: A @ V, 80, num_probes=200, num_iters=25,
                               generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert abs(result.estimate - torch.logdet(A)) <= 4 * result.std_error
    # Var[zᵀ log(A) z] = 2 Σ_{i≠j} log(A)_ij²; 200 probes estimate its root to ≈ 5 %
    evals, evecs = torch.linalg.eigh(A)
    log_A = (evecs * evals.log()) @ evecs.mT
    off = log_A - torch.diag(log_A.diagonal())
    torch.testing.assert_close(result.std_error, (2 * off.square().sum() / 200).sqrt(),
                               rtol=0.2, atol=0)


def test_preconditioner_reduces_variance(generator):
    """On RBF + σ² = 1e-2, pivoted Cholesky (rank 10) shrinks the standard error."""
    K = rbf_gram(100, generator)
    A = K + 0.01 * torch.eye(100)
    P = PivotedCholeskyPreconditioner.from_matrix(K, noise=0.01, rank=10)
    kw = {"num_probes": 30, "num_iters": 30, "generator": torch.Generator().manual_seed(6)}
    plain = stochastic_logdet(A, 100, **kw)
    preconditioned = stochastic_logdet(A, 100, preconditioner=P, **kw)
    assert preconditioned.std_error < 0.2 * plain.std_error
    assert abs(preconditioned.estimate - torch.logdet(A)) <= 4 * preconditioned.std_error
