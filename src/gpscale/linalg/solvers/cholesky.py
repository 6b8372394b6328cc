"""Dense Cholesky solver: ``A = L Lᵀ`` in a chosen factor dtype (float64 by default).

Cost: O(n³/3) to factorise, O(n² k) per solve; memory O(n²). Results come back in ``A``'s dtype
and stay differentiable (``torch.linalg.cholesky`` and triangular solves have autograd).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from linear_operator.operators import LinearOperator
from torch import Tensor

from gpscale.linalg.ops import safe_cholesky, upcast

__all__ = ["Cholesky", "CholeskyState"]


@dataclass(frozen=True)
class CholeskyState:
    """A factorised matrix.

    Attributes:
        L: lower Cholesky factor (n, n) in the factor dtype.
        dtype: the dtype results are returned in (that of ``A``).
    """

    L: Tensor
    dtype: torch.dtype


@dataclass(frozen=True)
class Cholesky:
    """Dense Cholesky solver (options only).

    Args:
        jitter: first jitter for :func:`gpscale.linalg.ops.safe_cholesky` (default relative).
        max_tries: jittered attempts before :class:`gpscale.errors.NumericalError`.
        factor_dtype: dtype of the factorisation (float64 even when ``A`` is float32).
        name: what the matrix is, for warnings and errors.

    Example:
        >>> A = torch.tensor([[4.0, 1.0], [1.0, 3.0]])
        >>> solver = Cholesky()
        >>> state = solver.init(A)
        >>> solver.solve(state, torch.tensor([1.0, 2.0]))
        tensor([0.0909, 0.6364])
    """

    jitter: float | None = None
    max_tries: int = 5
    factor_dtype: torch.dtype = torch.float64
    name: str = "matrix"

    def init(self, A: Tensor | LinearOperator) -> CholeskyState:
        """Factorise ``A`` (n, n) (a ``LinearOperator`` is densified)."""
        A = A.to_dense() if isinstance(A, LinearOperator) else A
        L = safe_cholesky(upcast(A, self.factor_dtype), jitter=self.jitter,
                          max_tries=self.max_tries, name=self.name)
        return CholeskyState(L=L, dtype=A.dtype)

    def _half_solve(self, state: CholeskyState, B: Tensor) -> Tensor:
        """``L⁻¹ B`` (n, k) in the factor dtype."""
        return torch.linalg.solve_triangular(state.L, upcast(B, state.L.dtype), upper=False)

    def solve(self, state: CholeskyState, B: Tensor) -> Tensor:
        """``A⁻¹ B`` for ``B`` (n,) or (n, k)."""
        B2 = B.unsqueeze(-1) if B.dim() == 1 else B
        X = torch.cholesky_solve(upcast(B2, state.L.dtype), state.L)  # (n, k)
        X = X.to(state.dtype)
        return X.squeeze(-1) if B.dim() == 1 else X

    def logdet(self, state: CholeskyState) -> Tensor:
        """``log det A = 2 Σ log L_ii``."""
        return (2.0 * state.L.diagonal(dim1=-2, dim2=-1).log().sum(-1)).to(state.dtype)

    def inv_quad(self, state: CholeskyState, b: Tensor) -> Tensor:
        """``bᵀ A⁻¹ b = ‖L⁻¹ b‖²``; column-wise (k,) for ``b`` (n, k)."""
        b2 = b.unsqueeze(-1) if b.dim() == 1 else b
        quad = self._half_solve(state, b2).square().sum(-2).to(state.dtype)  # (k,)
        return quad.squeeze(-1) if b.dim() == 1 else quad

    def inv_congruence(self, state: CholeskyState, B: Tensor, *,
                       dtype: torch.dtype | None = None) -> Tensor:
        """``Bᵀ A⁻¹ B = (L⁻¹ B)ᵀ (L⁻¹ B)`` (k, k), in ``dtype`` (default: that of ``A``; pass
        the factor's where the result meets a cancellation, as k − kᵀ A⁻¹ k does)."""
        W = self._half_solve(state, B)  # (n, k)
        return (W.mT @ W).to(dtype or state.dtype)
