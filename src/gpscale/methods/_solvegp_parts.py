r"""Pieces of SOLVE-GP (:mod:`gpscale.methods.solvegp`) that need no module: the Alg. 1
quantities as dataclasses, the whitened KL (Alg. 1 line 9), Gauss–Hermite expectations, the
collapsed bound for Gaussian regression with its optimal q(v⊥) and q(u), and the k-means
initialisation of both inducing sets.

Shi, Titsias & Mnih (2020), arXiv:1910.10596 (notes/004_solvegp.md §2.6–2.7, §2.14). Whitened
coordinates throughout: q(L_u⁰⁻¹u) = N(a_u, P_u P_uᵀ), q(L_v⁰⁻¹v⊥) = N(a_v, P_v P_vᵀ);
B = L_u⁰ \\ K_uf, D = L_v⁰ \\ C_vf, so Q_ff = BᵀB and C_fv C_vv⁻¹ C_vf = DᵀD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gpscale.linalg.ops import safe_cholesky, upcast
from gpscale.methods._common import kmeans_points

__all__ = [
    "InducingFactors", "Projections", "VARIANCE_FLOOR", "WhitenedQ", "collapsed_bound",
    "batch_eye", "gauss_hermite", "initial_points", "kl_whitened", "optimal_q_u", "optimal_q_v",
    "tri_solve",
]

VARIANCE_FLOOR = 1e-10
"""Marginal variances are floored here before a square root (quadrature, sampling) so that a
variance clamped to 0 never meets the infinite derivative of √· at 0."""


@dataclass(frozen=True)
class InducingFactors:
    """Alg. 1 lines 1–2, float64.

    Attributes:
        chol_uu: L_u⁰ = chol(K_uu + jitter I) (L, M, M).
        A: L_u⁰ \\ K_uv (L, M, M2).
        chol_vv: L_v⁰ = chol(C_vv + jitter I), C_vv = K_vv − AᵀA (L, M2, M2).
    """

    chol_uu: Tensor
    A: Tensor
    chol_vv: Tensor


@dataclass(frozen=True)
class WhitenedQ:
    """q(u), q(v⊥) in whitened coordinates: q(L_u⁰⁻¹u) = N(mean_u, chol_u chol_uᵀ), likewise v⊥.

    Attributes:
        mean_u: (L, M); chol_u: (L, M, M) lower triangular.
        mean_v: (L, M2); chol_v: (L, M2, M2) lower triangular.
    """

    mean_u: Tensor
    chol_u: Tensor
    mean_v: Tensor
    chol_v: Tensor


@dataclass(frozen=True)
class Projections:
    """Alg. 1 lines 3–4 at inputs x (data dtype).

    Attributes:
        BD: [B; D] (L, M + M2, b) with B = L_u⁰ \\ K_uf and D = L_v⁰ \\ (K_vf − AᵀB) = L_v⁰ \\ C_vf.
        prior_var: k(x, x) (L, b).
        num_inducing: M.
    """

    BD: Tensor
    prior_var: Tensor
    num_inducing: int

    @property
    def B(self) -> Tensor:
        """L_u⁰ \\ K_uf (L, M, b)."""
        return self.BD[:, :self.num_inducing]

    @property
    def D(self) -> Tensor:
        """L_v⁰ \\ C_vf (L, M2, b)."""
        return self.BD[:, self.num_inducing:]


# -- the collapsed bound (Gaussian regression, one latent GP) ------------------------------------
def collapsed_bound(proj: Projections, r: Tensor, noise: Tensor, mean_v: Tensor,
                    chol_v: Tensor) -> Tensor:
    r"""Eq. (9): log N(r | Dᵀa_v, BᵀB + σ²I) − tr(S_f⊥)/(2σ²) − KL[q(v⊥) ‖ p⊥(v⊥)], float64.

    With whitened q(v⊥) = N(a_v, P_v P_vᵀ): C_fv C_vv⁻¹ m_v = Dᵀa_v, Q_ff = BᵀB and
    tr(S_f⊥) = Σ k(x_n, x_n) − ‖B‖² − ‖D‖² + ‖P_vᵀD‖². The log-density uses Woodbury with
    Λ = I + BBᵀ/σ² (M × M). Cost O(n (M² + M2²) + M³).

    Args:
        proj: projections of the n training inputs (one latent GP: L = 1).
        r: y − μ₀ (n,).
        noise: σ².
        mean_v: a_v (1, M2); chol_v: P_v (1, M2, M2).
    """
    B, D = upcast(proj.B[0]), upcast(proj.D[0])  # (M, n), (M2, n)
    r, s2, n = upcast(r), upcast(noise), r.shape[0]
    chol_lam = _chol_lambda(B, s2)
    e = r - D.mT @ upcast(mean_v[0])  # y − μ₀ − C_fv C_vv⁻¹ m_v
    c = tri_solve(chol_lam, (B @ e)[:, None])[:, 0] / s2
    quad = e @ e / s2 - c @ c  # eᵀ(BᵀB + σ²I)⁻¹e
    logdet = n * torch.log(s2) + 2 * chol_lam.diagonal().log().sum()
    log_lik = -0.5 * (n * math.log(2 * math.pi) + logdet + quad)
    PD = upcast(chol_v[0]).mT @ D
    trace = (upcast(proj.prior_var[0]).sum() - B.square().sum() - D.square().sum()
             + PD.square().sum())
    return log_lik - 0.5 * trace / s2 - kl_whitened(upcast(mean_v), upcast(chol_v)).sum()


def optimal_q_v(proj: Projections, r: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """The q(v⊥) maximising Eq. (9), Eqs. (28)–(29) in whitened coordinates, float64:
    a_v = (I + D A⁻¹ Dᵀ)⁻¹ D A⁻¹ r and P_v P_vᵀ = (I + DDᵀ/σ²)⁻¹, A = BᵀB + σ²I.

    Returns:
        a_v (1, M2), P_v (1, M2, M2) lower triangular.
    """
    B, D = upcast(proj.B[0]), upcast(proj.D[0])
    r, s2 = upcast(r), upcast(noise)
    chol_lam = _chol_lambda(B, s2)
    rhs = torch.cat([D.mT, r[:, None]], 1)  # (n, M2 + 1)
    A_inv_rhs = (rhs - B.mT @ torch.cholesky_solve(B @ rhs, chol_lam) / s2) / s2  # Woodbury
    DAD, DAr = (D @ A_inv_rhs).split([D.shape[0], 1], 1)
    eye = torch.eye(D.shape[0], dtype=D.dtype, device=D.device)
    mean_v = torch.cholesky_solve(DAr, safe_cholesky(eye + 0.5 * (DAD + DAD.mT)))[:, 0]
    chol_p = safe_cholesky(eye + D @ D.mT / s2, name="I + DDᵀ/σ²")
    chol_v = torch.linalg.cholesky(torch.cholesky_inverse(chol_p))
    return mean_v[None], chol_v[None]


def optimal_q_u(proj: Projections, r: Tensor, noise: Tensor,
                mean_v: Tensor) -> tuple[Tensor, Tensor]:
    """The q(u) maximising Eq. (8) for a given q(v⊥) (Gaussian likelihood; notes §2.7),
    whitened, float64: P_u P_uᵀ = Λ⁻¹, a_u = Λ⁻¹ B (r − Dᵀa_v)/σ², Λ = I + BBᵀ/σ².

    Returns:
        a_u (1, M), P_u (1, M, M) lower triangular.
    """
    B, D = upcast(proj.B[0]), upcast(proj.D[0])
    s2 = upcast(noise)
    chol_lam = _chol_lambda(B, s2)
    e = upcast(r) - D.mT @ upcast(mean_v[0])
    mean_u = torch.cholesky_solve((B @ e)[:, None] / s2, chol_lam)[:, 0]
    chol_u = torch.linalg.cholesky(torch.cholesky_inverse(chol_lam))
    return mean_u[None], chol_u[None]


def kl_whitened(mean: Tensor, chol: Tensor) -> Tensor:
    """KL[N(a, PPᵀ) ‖ N(0, I)] = ½(‖P‖²_F + ‖a‖² − dim) − Σ log|diag P|, per leading index.

    This is Alg. 1's Compute_KL(m, L, L⁰) with a = L⁰⁻¹m, P = L⁰⁻¹L (Eqs. 35–36).

    Args:
        mean: (..., k); chol: (..., k, k) lower triangular.
    """
    k = mean.shape[-1]
    log_diag = chol.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)
    return 0.5 * (chol.square().sum((-2, -1)) + mean.square().sum(-1) - k) - log_diag


def gauss_hermite(fn, mean: Tensor, var: Tensor, num_points: int) -> Tensor:
    """E_{N(mean, var)}[fn(f)] ≈ Σ_k w_k/√π fn(mean + √(2 var) t_k), Gauss–Hermite nodes t_k.

    Exact for polynomials of degree < 2 ``num_points``. ``fn`` maps (..., K) to (..., K).
    """
    t, w = np.polynomial.hermite.hermgauss(num_points)
    t = torch.as_tensor(t, dtype=mean.dtype, device=mean.device)
    w = torch.as_tensor(w / math.sqrt(math.pi), dtype=mean.dtype, device=mean.device)
    f = mean[..., None] + (2 * var.clamp_min(VARIANCE_FLOOR)).sqrt()[..., None] * t
    return (fn(f) * w).sum(-1)


def _chol_lambda(B: Tensor, noise: Tensor) -> Tensor:
    """chol(Λ), Λ = I + BBᵀ/σ² (M × M)."""
    eye = torch.eye(B.shape[0], dtype=B.dtype, device=B.device)
    return safe_cholesky(eye + B @ B.mT / noise, name="I + BBᵀ/σ²")


def tri_solve(L: Tensor, X: Tensor) -> Tensor:
    """L⁻¹ X for lower-triangular L."""
    return torch.linalg.solve_triangular(L, X, upper=False)


def batch_eye(batch: int, k: int, like: Tensor) -> Tensor:
    return torch.eye(k, dtype=like.dtype, device=like.device).expand(batch, k, k).clone()


def initial_points(x: Tensor, num_inducing: int, num_orthogonal: int, *, seed: int,
                   max_points: int) -> tuple[Tensor, Tensor]:
    """Z (M, d) and O (M2, d): k-means with M + M2 centres on (a subsample of) ``x``, split at
    random (seeded) so that the two sets interleave and never coincide."""
    centres = kmeans_points(x, num_inducing + num_orthogonal, seed=seed, max_points=max_points)
    order = torch.randperm(centres.shape[0], generator=torch.Generator().manual_seed(seed))
    centres = centres[order.to(centres.device)]
    return centres[:num_inducing], centres[num_inducing:]
