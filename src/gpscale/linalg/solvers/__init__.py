"""gpscale.linalg.solvers: the solver protocol, dense Cholesky, conjugate gradients, Lanczos."""

from gpscale.linalg.solvers.base import Solver, SolverStep
from gpscale.linalg.solvers.cg import CGResult, CGState, ConjugateGradient
from gpscale.linalg.solvers.cholesky import Cholesky, CholeskyState
from gpscale.linalg.solvers.lanczos import lanczos, lanczos_quadrature, tridiagonal

__all__ = [
    "CGResult",
    "CGState",
    "Cholesky",
    "CholeskyState",
    "ConjugateGradient",
    "Solver",
    "SolverStep",
    "lanczos",
    "lanczos_quadrature",
    "tridiagonal",
]
