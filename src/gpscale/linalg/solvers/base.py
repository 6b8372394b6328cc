"""The solver protocol (STYLE §4, after CAGPJax ``solvers/base.py``).

A solver object holds options only. Everything computed from the matrix lives in the state that
``init`` returns::

    state = solver.init(A)
    X = solver.solve(state, B)             # A⁻¹ B
    solver.logdet(state)                   # log det A
    solver.inv_quad(state, b)              # bᵀ A⁻¹ b
    solver.inv_congruence(state, B)        # Bᵀ A⁻¹ B

Iterative solvers also offer ``iterate(...)``, a generator of frozen :class:`SolverStep`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

__all__ = ["Solver", "SolverStep"]


@runtime_checkable
class Solver(Protocol):
    """What every linear solver offers (options on the object, data in the state)."""

    def init(self, A: Any) -> Any:
        """Prepare a state for the SPD operator ``A`` (n, n) (factorise, wrap, precondition)."""

    def solve(self, state: Any, B: Tensor) -> Tensor:
        """``A⁻¹ B`` for ``B`` (n,) or (n, k)."""

    def logdet(self, state: Any) -> Tensor:
        """``log det A`` (a scalar)."""

    def inv_quad(self, state: Any, b: Tensor) -> Tensor:
        """``bᵀ A⁻¹ b`` for ``b`` (n,); (k,) column-wise for ``b`` (n, k)."""

    def inv_congruence(self, state: Any, B: Tensor) -> Tensor:
        """``Bᵀ A⁻¹ B`` (k, k) for ``B`` (n, k)."""


@dataclass(frozen=True)
class SolverStep:
    """One iteration of an iterative solver for ``A X = B`` (columns solved simultaneously).

    Attributes:
        iteration: number of iterations done (0 for the initial guess).
        solution: current iterate X_i (n, k).
        residual: B − A X_i (n, k).
        residual_norm: column norms of the residual (k,).
        action: the search direction the next iteration uses (n, k), e.g. CG's d_i.
        action_product: ``A`` applied to ``action`` (n, k) when the step computed it, else None.
        converged: per column, whether the tolerance is met (k,).
    """

    iteration: int
    solution: Tensor
    residual: Tensor
    residual_norm: Tensor
    action: Tensor
    action_product: Tensor | None
    converged: Tensor
