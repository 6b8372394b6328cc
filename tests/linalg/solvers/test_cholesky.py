"""Cholesky solver on controlled spectra against torch.linalg."""

from __future__ import annotations

import pytest
import torch
from linear_operator.operators import DenseLinearOperator
from tests.linalg._matrices import spd, spd_with_spectrum

from gpscale.errors import NumericalError
from gpscale.linalg.solvers import Cholesky, Solver


@pytest.mark.parametrize("condition_number", [1e1, 1e6], ids=["cond1e1", "cond1e6"])
def test_cholesky_solver_matches_torch_linalg(condition_number, generator):
    """solve, logdet, inv_quad, inv_congruence equal torch.linalg on cond 1e1 and 1e6."""
    A = spd(30, condition_number, generator)
    B = torch.randn(30, 4, generator=generator)
    solver = Cholesky()
    state = solver.init(A)
    X = torch.linalg.solve(A, B)
    # relative accuracy of a backward-stable solve degrades with the condition number
    tol = 1e-13 * condition_number
    torch.testing.assert_close(solver.solve(state, B), X, rtol=tol, atol=tol)
    torch.testing.assert_close(solver.solve(state, B[:, 0]), X[:, 0], rtol=tol, atol=tol)
    torch.testing.assert_close(solver.logdet(state), torch.linalg.slogdet(A).logabsdet,
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(solver.inv_quad(state, B[:, 1]), B[:, 1] @ X[:, 1],
                               rtol=tol, atol=tol)
    torch.testing.assert_close(solver.inv_quad(state, B), (B * X).sum(0), rtol=tol, atol=tol)
    torch.testing.assert_close(solver.inv_congruence(state, B), B.mT @ X, rtol=tol, atol=tol)


def test_cholesky_solver_is_a_solver():
    """Cholesky satisfies the solver protocol."""
    assert isinstance(Cholesky(), Solver)


def test_float32_input_factorised_in_float64(generator):
    """A float32 matrix is factorised in float64; results come back in float32."""
    A = spd(20, 1e3, generator)
    b = torch.randn(20, generator=generator)
    solver = Cholesky()
    state = solver.init(A.float())
    assert state.L.dtype == torch.float64
    x = solver.solve(state, b.float())
    assert x.dtype == torch.float32
    expected = torch.linalg.solve(A.float().double(), b.float().double())
    torch.testing.assert_close(x.double(), expected, rtol=1e-6, atol=1e-6)
    B = torch.randn(20, 3, generator=generator).float()
    want = B.double().mT @ torch.linalg.solve(A.float().double(), B.double())
    assert solver.inv_congruence(state, B).dtype == torch.float32
    kept = solver.inv_congruence(state, B, dtype=torch.float64)  # the factor's, unrounded
    assert kept.dtype == torch.float64
    torch.testing.assert_close(kept, want, rtol=1e-10, atol=1e-10)


def test_linear_operator_input(generator):
    """A LinearOperator is densified and factorised."""
    A = spd(10, 10.0, generator)
    solver = Cholesky()
    torch.testing.assert_close(solver.logdet(solver.init(DenseLinearOperator(A))),
                               torch.logdet(A))


def test_singular_matrix_raises_with_matrix_name(generator):
    """A negative-definite direction fails with a NumericalError naming the matrix."""
    A = spd_with_spectrum(torch.tensor([-1.0, 1.0, 3.0], dtype=torch.float64), generator)
    with pytest.raises(NumericalError, match=r"K \+ noise \(3, 3\)"):
        Cholesky(name="K + noise", max_tries=2).init(A)


def test_gradient_of_logdet_and_inv_quad(generator):
    """d/dA [log det A + bᵀA⁻¹b] = A⁻¹ − A⁻¹bbᵀA⁻¹ (symmetrised) through the factor."""
    A = spd(6, 10.0, generator).requires_grad_()
    b = torch.randn(6, generator=generator)
    solver = Cholesky()
    state = solver.init(A)
    (grad,) = torch.autograd.grad(solver.logdet(state) + solver.inv_quad(state, b), A)
    A_inv = torch.linalg.inv(A.detach())
    expected = A_inv - A_inv @ torch.outer(b, b) @ A_inv
    torch.testing.assert_close(0.5 * (grad + grad.mT), expected, rtol=1e-10, atol=1e-10)
