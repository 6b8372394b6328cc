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

from gpscale.kernels import kernel_matrix
from gpscale.linalg.ops import safe_cholesky, upcast
from gpscale.methods._common import kmeans_points
from gpscale.methods.options import INDUCING_OPTIONS, PRIOR_OPTIONS, Option
from gpscale.validation import check_num_points

__all__ = [
    "JITTER_OPTION", "SAMPLES_OPTION", "InducingFactors", "OBJECTIVES", "ORTHOGONAL_Q",
    "Projections", "SOLVEGP_OPTIONS",
    "SolveGPState", "VARIANCE_FLOOR", "WhitenedQ",
    "batch_eye", "check_choice", "check_sizes", "cholesky_and_inverse", "collapsed_bound",
    "excess", "gauss_hermite", "gram",
    "initial_points", "kernel_matrix_fused", "kl_whitened", "mean_and_quadratic", "optimal_q_u",
    "optimal_q_v", "tri_inverse", "tri_solve",
]

VARIANCE_FLOOR = 1e-10
"""Marginal variances are floored here before a square root (quadrature, sampling) so that a
variance clamped to 0 never meets the infinite derivative of √· at 0."""


@dataclass(frozen=True)
class InducingFactors:
    """Alg. 1 lines 1–2, float64, plus the inverse factors that turn the batch-sized triangular
    solves of lines 4–5 into matrix products.

    Attributes:
        chol_uu: L_u⁰ = chol(K_uu + jitter I) (L, M, M).
        A: L_u⁰ \\ K_uv (L, M, M2).
        chol_vv: L_v⁰ = chol(C_vv + jitter I), C_vv = K_vv − AᵀA (L, M2, M2).
        inv_uu: (L_u⁰)⁻¹ (L, M, M), lower triangular.
        inv_vv: (L_v⁰)⁻¹ (L, M2, M2), lower triangular.
    """

    chol_uu: Tensor
    A: Tensor
    chol_vv: Tensor
    inv_uu: Tensor
    inv_vv: Tensor


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
    """Alg. 1 lines 3–4 at inputs x (in the dtype they were computed in, the data's by default).

    Attributes:
        B: L_u⁰ \\ K_uf (L, M, b).
        D: L_v⁰ \\ (K_vf − AᵀB) = L_v⁰ \\ C_vf (L, M2, b).
        prior_var: k(x, x) (L, b).
    """

    B: Tensor
    D: Tensor
    prior_var: Tensor


# -- the collapsed bound (Gaussian regression, one latent GP) ------------------------------------
@dataclass(frozen=True)
class SolveGPState:
    """A conditioned batch.

    Attributes:
        x: (b, d) inputs; y: (b,) targets (long labels for C > 2 classes).
        factors: the inducing factors (Alg. 1 lines 1–2).
        q: the variational distributions in whitened coordinates: the module's (``elbo``) or
            the optimal ones for (x, y) (``collapsed``).
        bound: Eq. (30) on (x, y) for ``collapsed``, else ``None``.
    """

    x: Tensor
    y: Tensor
    factors: InducingFactors
    q: WhitenedQ
    bound: Tensor | None = None


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


def kernel_matrix_fused(kernel, x1: Tensor, x2: Tensor) -> Tensor:
    """K(x1, x2) (..., n1, n2) by :func:`gpscale.kernels.kernel_matrix`: for ``[ScaleKernel]``
    of a stationary profile one autograd node (the profiles of :mod:`gpscale.linalg.fused`,
    nothing n1 × n2 kept for backward), with distances taken within reach so that a far test
    point in x2 changes no other column; other kernels through GPyTorch."""
    return kernel_matrix(kernel, x1, x2)


def tri_solve(L: Tensor, X: Tensor) -> Tensor:
    """L⁻¹ X for lower-triangular L."""
    return torch.linalg.solve_triangular(L, X, upper=False)


def tri_inverse(L: Tensor) -> Tensor:
    """L⁻¹ (..., k, k) for lower-triangular L (..., k, k): one triangular solve, O(k³)."""
    eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device)
    return torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False)


class _MeanAndQuadratic(torch.autograd.Function):
    """(aᵀX, colsum(X ⊙ S X)) for symmetric S, with the backward that uses the symmetry."""

    @staticmethod
    def forward(ctx, a: Tensor, S: Tensor, X: Tensor) -> tuple[Tensor, Tensor]:
        Y = S @ X
        ctx.save_for_backward(a, X, Y)
        return (a[..., None, :] @ X)[..., 0, :], (X * Y).sum(-2)

    @staticmethod
    def backward(ctx, grad_mean: Tensor | None,
                 grad_quad: Tensor | None) -> tuple[Tensor | None, ...]:
        a, X, Y = ctx.saved_tensors
        grad_a = grad_S = grad_X = None
        if grad_quad is not None:
            g = grad_quad[..., None, :]
            if ctx.needs_input_grad[1]:
                grad_S = (X * g) @ X.mT
            if ctx.needs_input_grad[2]:
                grad_X = Y * (2 * g)
        if grad_mean is not None:
            if ctx.needs_input_grad[0]:
                grad_a = (X @ grad_mean[..., None])[..., 0]
            if ctx.needs_input_grad[2]:
                outer = a[..., :, None] * grad_mean[..., None, :]
                grad_X = outer if grad_X is None else grad_X.add_(outer)
        return grad_a, grad_S, grad_X


def mean_and_quadratic(a: Tensor, S: Tensor, X: Tensor) -> tuple[Tensor, Tensor]:
    """The linear forms aᵀx_j and the quadratic forms x_jᵀ S x_j of the columns of X.

    S must be symmetric: the backward uses ∂/∂X = 2 (S X) ⊙ g + a ḡᵀ and ∂/∂S = X diag(g) Xᵀ,
    so one product S X (O(k² b)) is the whole forward and X diag(g) Xᵀ the only O(k² b)
    product of the backward; an autograd-traced ‖PᵀX‖² − ‖X‖² needs two in each pass.

    Args:
        a: (..., k).
        S: (..., k, k) symmetric.
        X: (..., k, b).

    Returns:
        aᵀX (..., b) and colsum(X ⊙ S X) (..., b).
    """
    return _MeanAndQuadratic.apply(a, S, X)


class _Gram(torch.autograd.Function):
    """X Xᵀ with the one-product backward (G + Gᵀ) X."""

    @staticmethod
    def forward(ctx, X: Tensor) -> Tensor:
        ctx.save_for_backward(X)
        return X @ X.mT

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (X,) = ctx.saved_tensors
        return (grad + grad.mT) @ X


def gram(X: Tensor) -> Tensor:
    """X Xᵀ (..., k, k) for X (..., k, n): one O(k² n) product forward and one backward
    (autograd's matmul would spend two on the backward)."""
    return _Gram.apply(X)


class _CholeskyAndInverse(torch.autograd.Function):
    """(L, L⁻¹) for L = chol(K), differentiated through both outputs with products only."""

    @staticmethod
    def forward(ctx, K: Tensor, name: str) -> tuple[Tensor, Tensor]:
        L = safe_cholesky(K, name=name)
        L_inv = tri_inverse(L)
        ctx.save_for_backward(L, L_inv)
        return L, L_inv

    @staticmethod
    def backward(ctx, grad_L: Tensor | None, grad_inv: Tensor | None) -> tuple[Tensor, None]:
        L, L_inv = ctx.saved_tensors
        # dL⁻¹ = −L⁻¹ dL L⁻¹, so the total L̄ is grad_L − L⁻ᵀ grad_inv L⁻ᵀ, and Lᵀ L̄ (the
        # Cholesky backward's first product) is Lᵀ grad_L − grad_inv L⁻ᵀ.
        P = torch.zeros_like(L)
        if grad_L is not None:
            P = P + L.mT @ grad_L
        if grad_inv is not None:
            P = P - grad_inv @ L_inv.mT
        P = P.tril()
        P = 0.5 * (P + P.tril(-1).mT)  # Φ, symmetrised (as torch's cholesky_backward)
        return L_inv.mT @ P @ L_inv, None


def cholesky_and_inverse(K: Tensor, *, name: str = "matrix") -> tuple[Tensor, Tensor]:
    """L = chol(K) (by :func:`~gpscale.linalg.ops.safe_cholesky`) and L⁻¹, both lower triangular.

    The backward, K̄ = L⁻ᵀ Φ(Lᵀ L̄ − (L⁻¹)̄ L⁻ᵀ) L⁻¹ (Φ: lower triangle, halved diagonal,
    symmetrised), uses the explicit inverse instead of the two triangular solves of
    torch's Cholesky backward and the one of the inverse's. Cost O(k³) each way.

    Args:
        K: (..., k, k) symmetric positive definite (any jitter already added).
        name: what K is, for safe_cholesky's warning and error.
    """
    return _CholeskyAndInverse.apply(K, name)



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


def excess(chol: Tensor, dtype: torch.dtype) -> Tensor:
    """P Pᵀ − I (symmetrised) in ``dtype`` (P is a trained parameter of that dtype, or, for an
    unwhitened q, L⁰⁻¹L; S − I stays O(‖P‖²), no cancellation)."""
    S = gram(chol.to(dtype))
    S = 0.5 * (S + S.mT)
    return (S - torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)).to(dtype)


def check_choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")


def check_sizes(init, *, num_inducing: int, num_orthogonal: int, num_quadrature: int,
                num_likelihood_samples: int, jitter: float | None,
                kmeans_max_points: int) -> None:
    """ValueError for a non-integer or too small size, negative jitter, or too few points."""
    for name, value, low in (("num_inducing", num_inducing, 1),
                             ("num_orthogonal", num_orthogonal, 0),
                             ("num_quadrature", num_quadrature, 1),
                             ("num_likelihood_samples", num_likelihood_samples, 1)):
        if int(value) != value or value < low:
            raise ValueError(f"{name} must be an integer ≥ {low}; got {value}")
    if jitter is not None and jitter < 0:
        raise ValueError(f"jitter must be ≥ 0; got {jitter}")
    total = num_inducing + num_orthogonal
    if kmeans_max_points < total:
        raise ValueError(f"kmeans_max_points ({kmeans_max_points}) must be at least "
                         f"num_inducing + num_orthogonal ({total})")
    if init is not None:
        check_num_points(init[0].shape[0], total, "inducing points (num_inducing + "
                         "num_orthogonal)")


OBJECTIVES = ("elbo", "collapsed")
ORTHOGONAL_Q = ("full", "mean")

JITTER_OPTION = Option("jitter", "float", None, "jitter of the inducing Gram matrices; none: "
                       "by dtype", minimum=0)
SAMPLES_OPTION = Option("num_likelihood_samples", "int", 32, "Monte Carlo samples of the "
                        "softmax likelihood", minimum=1)

SOLVEGP_OPTIONS = (
    Option("num_inducing", "int", None, "standard inducing points M; none: min(256, n/4), "
           "in regression on a GPU min(512, n/4)", minimum=1),
    Option("num_orthogonal", "int", None, "orthogonal inducing points M2; none: "
           "min(256, n/4), in regression on a GPU min(512, n/4)", minimum=1),
    Option("objective", "str", "elbo", "minibatch ELBO or the collapsed bound",
           choices=OBJECTIVES),
    Option("whiten", "bool", True, "whitened parametrisation of q(u)"),
    Option("orthogonal_q", "str", "full", "covariance of the orthogonal q(v)",
           choices=ORTHOGONAL_Q),
    *INDUCING_OPTIONS[1:],
    JITTER_OPTION,
    Option("num_quadrature", "int", 20, "Gauss-Hermite points of non-Gaussian "
           "likelihoods", minimum=1),
    SAMPLES_OPTION,
    *PRIOR_OPTIONS,
    Option("optimal_q", "bool", True, "regression: after training, set q and the noise to "
           "the ELBO's optimum for the trained inducing points and kernel (one pass over the "
           "data; false: keep what the optimiser reached)"),
    Option("num_data", "int", None, "number of training points N", minimum=1, hidden=True),
)
"""The options of ``solvegp`` (declared here to keep :mod:`gpscale.methods.solvegp.model` short)."""
