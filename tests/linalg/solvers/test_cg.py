"""Preconditioned conjugate gradients against torch.linalg and Krylov-subspace identities."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._matrices import rbf_gram, spd, spd_with_spectrum

from gpscale.linalg.preconditioners import PivotedCholeskyPreconditioner
from gpscale.linalg.solvers import ConjugateGradient, Solver, lanczos


@pytest.mark.parametrize("condition_number", [1e1, 1e3], ids=["cond1e1", "cond1e3"])
def test_cg_matches_solve(condition_number, generator):
    """CG on a closure with 3 right-hand sides equals torch.linalg.solve."""
    A = spd(40, condition_number, generator)
    B = torch.randn(40, 3, generator=generator)
    cg = ConjugateGradient(rtol=1e-12, max_iters=400)
    result = cg.run(cg.init(lambda V: A @ V), B)
    assert bool(result.converged.all())
    torch.testing.assert_close(result.solution, torch.linalg.solve(A, B),
                               rtol=1e-9 * condition_number, atol=1e-9 * condition_number)


def test_preconditioned_cg_matches_solve_in_fewer_iterations(generator):
    """RBF kernel + σ² = 1e-3: pivoted Cholesky (rank 20) cuts CG iterations, same solution."""
    K = rbf_gram(150, generator)
    noise = 1e-3
    A = K + noise * torch.eye(150)
    B = torch.randn(150, 2, generator=generator)
    P = PivotedCholeskyPreconditioner.from_matrix(K, noise=noise, rank=20)
    cg = ConjugateGradient(rtol=1e-8, max_iters=1000)
    plain = cg.run(cg.init(A), B)
    preconditioned = cg.run(cg.init(A, preconditioner=P), B)
    expected = torch.linalg.solve(A, B)
    torch.testing.assert_close(preconditioned.solution, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain.solution, expected, rtol=1e-5, atol=1e-5)
    assert preconditioned.iterations < plain.iterations / 3


def test_stop_on_preconditioned_norm_bounds_the_energy_error(generator):
    """stop_on='preconditioned': stops at ‖r‖_{P⁻¹} ≤ rtol ‖b‖_{P⁻¹}; with P = A that is the
    A-norm error of the iterate; unknown values raise."""
    K = rbf_gram(150, generator)
    noise = 1e-3
    A = (K + noise * torch.eye(150)).double()
    b = torch.randn(150, 1, generator=generator).double()
    P = PivotedCholeskyPreconditioner.from_matrix(K.double(), noise=noise, rank=8)
    exact = torch.linalg.solve(A, b)
    for rtol in (1e-3, 1e-5):
        cg = ConjugateGradient(rtol=rtol, max_iters=1000, stop_on="preconditioned")
        res = cg.run(cg.init(A, preconditioner=P), b)
        r = b - A @ res.solution
        assert float(r.T @ P.solve(r)) <= rtol**2 * float(b.T @ P.solve(b)) * (1 + 1e-9)
        err = res.solution - exact
        # ‖e‖_A² = rᵀA⁻¹r ≤ rᵀP⁻¹r / λ_min(P⁻¹A): bounded by a small multiple of rtol² here.
        assert float(err.T @ A @ err) <= 100 * rtol**2 * float(b.T @ exact)
        assert res.iterations >= 2
        # ...and not one iteration earlier: the criterion, not the cap or the residual, stopped it.
        early = ConjugateGradient(rtol=rtol, max_iters=res.iterations - 1,
                                  stop_on="preconditioned").run(cg.init(A, preconditioner=P), b)
        r = b - A @ early.solution
        assert float(r.T @ P.solve(r)) > rtol**2 * float(b.T @ P.solve(b))
    with pytest.raises(ValueError, match="unknown stop_on"):
        ConjugateGradient(stop_on="energy")


def test_cg_after_n_iterations_equals_solve(generator):
    """With rtol = 0, n iterations reach the exact solution (finite termination)."""
    A = spd(12, 10.0, generator)
    b = torch.randn(12, 1, generator=generator)
    cg = ConjugateGradient(rtol=0.0, max_iters=12)
    result = cg.run(cg.init(A), b)
    assert result.iterations == 12
    torch.testing.assert_close(result.solution, torch.linalg.solve(A, b), rtol=1e-10,
                               atol=1e-10)


def test_cg_iterate_is_krylov_energy_minimiser(generator):
    """Iterate k minimises ‖x − x*‖_A over the Krylov space span{b, Ab, …, A^{k−1}b}."""
    A = spd(15, 50.0, generator)
    b = torch.randn(15, 1, generator=generator)
    cg = ConjugateGradient(rtol=0.0, max_iters=6)
    steps = list(cg.iterate(cg.init(A), b))
    assert [s.iteration for s in steps] == list(range(7))
    for step in steps[1:]:
        k = step.iteration
        krylov = torch.cat([torch.linalg.matrix_power(A, j) @ b for j in range(k)], dim=1)
        basis, _ = torch.linalg.qr(krylov)  # (n, k)
        minimiser = basis @ torch.linalg.solve(basis.mT @ A @ basis, basis.mT @ b)
        torch.testing.assert_close(step.solution, minimiser, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(step.residual, b - A @ step.solution, rtol=1e-10,
                                   atol=1e-10)
        torch.testing.assert_close(step.residual_norm, step.residual.norm(dim=0))


def test_per_column_tolerance_freezes_converged_columns(generator):
    """An eigenvector right-hand side converges in one step and then stays frozen."""
    eigenvalues = torch.linspace(1.0, 20.0, 30, dtype=torch.float64)
    A = spd_with_spectrum(eigenvalues, generator)
    _, vectors = torch.linalg.eigh(A)
    B = torch.stack([vectors[:, 3], torch.randn(30, generator=generator)], dim=1)
    cg = ConjugateGradient(rtol=1e-10, max_iters=200)
    steps = list(cg.iterate(cg.init(A), B))
    assert bool(steps[1].converged[0]) and not bool(steps[1].converged[1])
    torch.testing.assert_close(steps[-1].solution[:, 0], steps[1].solution[:, 0], rtol=0,
                               atol=0)
    torch.testing.assert_close(steps[-1].solution, torch.linalg.solve(A, B), rtol=1e-8,
                               atol=1e-8)


def test_warm_start_at_solution_needs_no_iteration(generator):
    """x0 = A⁻¹b gives a converged iteration 0."""
    A = spd(10, 10.0, generator)
    b = torch.randn(10, generator=generator)
    cg = ConjugateGradient(rtol=1e-8)
    result = cg.run(cg.init(A), b, x0=torch.linalg.solve(A, b))
    assert result.iterations == 0 and result.solution.shape == (10,)


def test_cg_lanczos_coefficients_equal_lanczos(generator):
    """T from CG's α, β equals the Lanczos tridiagonal from the same start vector."""
    A = spd(20, 30.0, generator)
    b = torch.randn(20, 2, generator=generator)
    cg = ConjugateGradient(rtol=0.0, max_iters=8, record_lanczos=True)
    result = cg.run(cg.init(A), b)
    _, T = lanczos(A, b, 8)
    torch.testing.assert_close(result.tridiagonal, T, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(result.lanczos_weights, b.square().sum(0))


def test_cg_protocol_methods(generator):
    """solve, inv_quad, inv_congruence match dense; CG is a Solver."""
    A = spd(25, 100.0, generator)
    B = torch.randn(25, 3, generator=generator)
    cg = ConjugateGradient(rtol=1e-12)
    state = cg.init(A)
    X = torch.linalg.solve(A, B)
    assert isinstance(cg, Solver)
    torch.testing.assert_close(cg.solve(state, B), X, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(cg.inv_quad(state, B), (B * X).sum(0), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(cg.inv_congruence(state, B), B.mT @ X, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("preconditioned", [False, True], ids=["plain", "pivchol"])
def test_cg_logdet_estimate(preconditioned, generator):
    """mBCG log-det (64 probes, n iterations) is within 4 standard errors-ish of the truth."""
    K = rbf_gram(60, generator, lengthscale=0.3)
    A = K + 0.05 * torch.eye(60)
    P = PivotedCholeskyPreconditioner.from_matrix(K, noise=0.05, rank=15) if preconditioned \
        else None
    cg = ConjugateGradient(logdet_probes=64, logdet_iters=60)
    estimate = cg.logdet(cg.init(A, preconditioner=P), torch.Generator().manual_seed(3))
    exact = torch.logdet(A)
    # Rademacher SLQ on A (n = 60) has std error ≈ 1.5 here; the preconditioned one ≈ 0.1
    tol = 0.5 if preconditioned else 6.0
    assert abs(estimate - exact) < tol
