r"""Lanczos tridiagonalisation and Gauss quadrature from its tridiagonal.

``lanczos`` builds an orthonormal Krylov basis Q with :math:`Q^\top A Q = T` tridiagonal
(Golub & Van Loan, Alg. 10.1.1), optionally with full re-orthogonalisation (classical Gram–Schmidt
applied twice), for one start vector or a batch of them. ``lanczos_quadrature`` evaluates
:math:`e_1^\top f(T) e_1` by an eigendecomposition of T, the Gauss-quadrature estimate of
:math:`\hat v^\top f(A)\, \hat v` for the normalised start vector (Golub & Meurant 2010; Ubaru,
Chen & Saad 2017, stochastic Lanczos quadrature).

Cost: m matmuls with A plus O(n m² k) for re-orthogonalisation; memory O(n m k).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gpscale.linalg.ops import as_matmul, upcast
from gpscale.typing import Float, Tensor

__all__ = ["lanczos", "lanczos_quadrature", "tridiagonal"]


def tridiagonal(alpha: Tensor, beta: Tensor) -> Tensor:
    """Symmetric tridiagonal (..., m, m) from its diagonal (..., m) and off-diagonal (..., m−1)."""
    return torch.diag_embed(alpha) + torch.diag_embed(beta, 1) + torch.diag_embed(beta, -1)


def lanczos(matmul, v0: Float[Tensor, " n"] | Float[Tensor, "n k"], num_iters: int, *,
            reorthogonalize: bool = True,
            breakdown_rtol: float | None = None) -> tuple[Tensor, Tensor]:
    """Lanczos on SPD ``A`` from ``v0``: ``Q`` orthonormal with ``Qᵀ A Q = T`` tridiagonal.

    Stops early at breakdown (an invariant Krylov subspace): when the new off-diagonal
    ``β_j ≤ breakdown_rtol · ‖T‖`` (running estimate). With a batch of start vectors the
    iteration stops when all have broken down; a vector that broke down earlier gets zero columns
    in Q and a decoupled identity block in T, which leaves ``e₁ᵀ f(T) e₁`` unchanged.

    Args:
        matmul: ``V ↦ A V`` for V (n, k), or a tensor / ``LinearOperator`` (n, n).
        v0: start vector (n,) or a batch of start vectors as columns (n, k); need not be unit.
        num_iters: maximal number of steps m (capped at n).
        reorthogonalize: re-orthogonalise each new vector against all previous ones (twice).
        breakdown_rtol: relative breakdown threshold; default ``1000 · eps`` of the dtype.

    Returns:
        ``(Q, T)``: Q (n, m) and T (m, m) for a vector ``v0``; Q (k, n, m) and T (k, m, m) for
        ``v0`` (n, k).
    """
    A = as_matmul(matmul)
    single = v0.dim() == 1
    V0 = v0.unsqueeze(-1) if single else v0  # (n, k)
    n, k = V0.shape
    m_max = min(int(num_iters), n)
    rtol = 1e3 * torch.finfo(V0.dtype).eps if breakdown_rtol is None else breakdown_rtol
    Q = V0.new_zeros(n, k, m_max)
    alpha, beta = V0.new_ones(k, m_max), V0.new_zeros(k, max(m_max - 1, 0))
    q, q_prev = V0 / V0.norm(dim=0), torch.zeros_like(V0)  # (n, k)
    active = torch.ones(k, dtype=torch.bool, device=V0.device)
    b_prev, norm_est, m = V0.new_zeros(k), V0.new_zeros(k), m_max
    for j in range(m_max):
        Q[:, :, j] = q
        w = A(q)  # (n, k)
        a = (q * w).sum(0)  # (k,)
        w = w - a * q - b_prev * q_prev  # Alg. 10.1.1: three-term recurrence
        if reorthogonalize:
            for _ in range(2):
                basis = Q[:, :, : j + 1]  # (n, k, j+1)
                w = w - torch.einsum("nkj,kj->nk", basis, torch.einsum("nkj,nk->kj", basis, w))
        alpha[:, j] = torch.where(active, a, 1.0)
        if j == m_max - 1:
            break
        b = w.norm(dim=0)  # (k,)
        norm_est = torch.maximum(norm_est, a.abs() + b + b_prev)
        active = active & (b > rtol * norm_est)
        if not bool(active.any()):
            m = j + 1
            break
        beta[:, j] = torch.where(active, b, 0.0)
        q_prev, q = q, torch.where(active, w / b, 0.0)
        b_prev = torch.where(active, b, 0.0)
    Q, T = Q[:, :, :m].permute(1, 0, 2), tridiagonal(alpha[:, :m], beta[:, : m - 1])
    return (Q[0], T[0]) if single else (Q, T)


def lanczos_quadrature(T: Float[Tensor, "*b m m"],
                       fn: Callable[[Tensor], Tensor] = torch.log) -> Float[Tensor, "*b"]:
    """Gauss quadrature ``e₁ᵀ f(T) e₁ = Σ_i U_{0i}² f(λ_i)`` for tridiagonal T (..., m, m).

    Computed in float64. With ``T`` from :func:`lanczos` started at ``v``, this approximates
    ``vᵀ f(A) v / ‖v‖²``, exactly when m = n.

    Args:
        T: symmetric tridiagonal (..., m, m), positive definite for ``fn = torch.log``.
        fn: elementwise matrix function on the eigenvalues.

    Returns:
        (...,) in T's dtype.
    """
    evals, evecs = torch.linalg.eigh(upcast(T))
    return (evecs[..., 0, :].square() * fn(evals)).sum(-1).to(T.dtype)
