r"""Pivoted-Cholesky preconditioner :math:`P = L L^\top + \sigma^2 I` for ``K + σ² I`` systems.

The partial pivoted Cholesky factorisation (Harbrecht, Peters & Schneider 2012; used as a CG
preconditioner by Gardner et al. 2018, arXiv:1809.11165) needs only the diagonal of ``K`` and one
row of ``K`` per step, so it never forms ``K``: rank r costs r rows (O(n r) kernel entries) and
O(n r²) flops.

With :math:`C = \sigma^2 I_r + L^\top L` (r × r, factorised in float64), Woodbury gives

.. math::
    P^{-1} R = \sigma^{-2}\,(R - L C^{-1} L^\top R), \qquad
    \log\det P = (n - r)\log\sigma^2 + \log\det C,

and with the thin SVD :math:`L = U S W^\top`, the symmetric square root used by the log-det
estimator is :math:`P^{-1/2} = \sigma^{-1} I + U[(S^2 + \sigma^2)^{-1/2} - \sigma^{-1}]U^\top`.
Samples :math:`L\varepsilon_1 + \sigma\varepsilon_2` have covariance P.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from gpscale.linalg.ops import add_jitter, safe_cholesky, upcast
from gpscale.typing import Float, Tensor

__all__ = ["PivotedCholeskyPreconditioner", "Preconditioner", "pivoted_cholesky"]


class Preconditioner(Protocol):
    """What CG and the log-det estimators use from a preconditioner P ≈ A."""

    def solve(self, R: Tensor) -> Tensor:
        """``P⁻¹ R`` for R (n, k)."""

    def logdet(self) -> Tensor:
        """``log det P``."""

    def inv_sqrt_matmul(self, V: Tensor) -> Tensor:
        """``P^{-1/2} V`` (symmetric square root) for V (n, k)."""

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        """(n, num_samples) draws from N(0, P)."""


def pivoted_cholesky(diag: Float[Tensor, " n"], row: Callable[[int], Tensor], rank: int, *,
                     rtol: float = 0.0) -> Float[Tensor, "n m"]:
    """Partial pivoted Cholesky ``L`` (n, m), m ≤ rank, with ``L Lᵀ ≈ A`` (greedy on the trace).

    Step m picks the pivot i with the largest residual diagonal d_i, then
    ``L[:, m] = (A[i] − L[:, :m] L[i, :m]ᵀ) / √d_i`` and ``d ← d − L[:, m]²``.

    Args:
        diag: diagonal of the SPD matrix A (n,).
        row: ``i ↦ A[i]`` (n,), one row at a time.
        rank: maximal number of columns.
        rtol: stop early when the residual trace ``Σ d`` falls below ``rtol · tr A``.

    Returns:
        L (n, m), not differentiable (computed from detached values).
    """
    d = diag.detach().clone()  # (n,) residual diagonal
    L = d.new_zeros(d.shape[0], rank)
    stop = rtol * float(d.sum())
    for m in range(rank):
        i = int(torch.argmax(d))
        if float(d[i]) <= 0.0 or float(d.clamp_min(0).sum()) <= stop:
            return L[:, :m]
        column = (row(i).detach() - L[:, :m] @ L[i, :m]) / d[i].sqrt()  # (n,)
        L[:, m] = column
        d = d - column.square()
        d[i] = 0.0
    return L


@dataclass(frozen=True)
class PivotedCholeskyPreconditioner:
    """``P = L Lᵀ + σ² I`` with Woodbury solves (see the module docstring).

    Attributes:
        L: low-rank factor (n, r).
        noise: σ² > 0 (0-d tensor).
        C_chol: Cholesky factor of ``σ² I + Lᵀ L`` (r, r), float64.
        U: left singular vectors of L (n, r).
        S: singular values of L (r,).

    Example:
        >>> A = torch.eye(5) * 2.0
        >>> P = PivotedCholeskyPreconditioner.from_matrix(A, noise=0.1, rank=2)
        >>> P.solve(torch.ones(5, 1)).shape
        torch.Size([5, 1])
    """

    L: Tensor
    noise: Tensor
    C_chol: Tensor
    U: Tensor
    S: Tensor

    @classmethod
    def from_factor(cls, L: Tensor, noise: float | Tensor) -> PivotedCholeskyPreconditioner:
        """Build P from a factor L (n, r) and noise σ² > 0."""
        noise = torch.as_tensor(noise, dtype=L.dtype, device=L.device).detach()
        if not float(noise) > 0:
            raise ValueError(f"the preconditioner needs noise > 0; got {float(noise)}")
        L64 = upcast(L.detach())
        C_chol = safe_cholesky(add_jitter(L64.mT @ L64, upcast(noise)), name="σ²I + LᵀL")
        U, S, _ = torch.linalg.svd(L.detach(), full_matrices=False)
        return cls(L=L.detach(), noise=noise, C_chol=C_chol, U=U, S=S)

    @classmethod
    def from_rows(cls, diag: Tensor, row: Callable[[int], Tensor], *, noise: float | Tensor,
                  rank: int, rtol: float = 0.0) -> PivotedCholeskyPreconditioner:
        """P for ``A + σ² I`` from A's diagonal (n,) and rows ``i ↦ A[i]`` (n,)."""
        return cls.from_factor(pivoted_cholesky(diag, row, rank, rtol=rtol), noise)

    @classmethod
    def from_matrix(cls, A: Tensor, *, noise: float | Tensor, rank: int,
                    rtol: float = 0.0) -> PivotedCholeskyPreconditioner:
        """P for ``A + σ² I`` from a dense A (n, n) (rows are read, not factorised)."""
        return cls.from_rows(A.diagonal(), lambda i: A[i], noise=noise, rank=rank, rtol=rtol)

    @property
    def rank(self) -> int:
        return self.L.shape[-1]

    def matmul(self, V: Tensor) -> Tensor:
        """``P V = L (Lᵀ V) + σ² V`` for V (n, k)."""
        return self.L @ (self.L.mT @ V) + self.noise * V

    def solve(self, R: Tensor) -> Tensor:
        """``P⁻¹ R = σ⁻² (R − L C⁻¹ Lᵀ R)`` for R (n, k)."""
        LtR = upcast(self.L.mT @ R)  # (r, k)
        correction = (self.L @ torch.cholesky_solve(LtR, self.C_chol).to(R.dtype))  # (n, k)
        return (R - correction) / self.noise

    def logdet(self) -> Tensor:
        """``log det P = (n − r) log σ² + log det(σ² I + Lᵀ L)``."""
        n, r = self.L.shape
        logdet_C = 2.0 * self.C_chol.diagonal().log().sum()
        return ((n - r) * math.log(float(self.noise)) + logdet_C).to(self.L.dtype)

    def inv_sqrt_matmul(self, V: Tensor) -> Tensor:
        """``P^{-1/2} V`` for V (n, k) (symmetric square root)."""
        sigma = self.noise.sqrt()
        scale = (self.S.square() + self.noise).rsqrt() - 1.0 / sigma  # (r,)
        return V / sigma + self.U @ (scale[:, None] * (self.U.mT @ V))

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        """(n, num_samples) draws ``L ε₁ + σ ε₂`` from N(0, P)."""
        n, r = self.L.shape
        kw = {"dtype": self.L.dtype, "device": self.L.device, "generator": generator}
        eps1, eps2 = torch.randn(r, num_samples, **kw), torch.randn(n, num_samples, **kw)
        return self.L @ eps1 + self.noise.sqrt() * eps2
