r"""A computation-aware Laplace evidence for IterNCGP's kernel hyperparameters.

Derivation and checks: ``docs/iterncgp_evidence.md``. In short: at a Newton iterate f̂ with
W = W(f̂), ∇ = ∇log p(y | f̂) and the pseudo-target right-hand side b = f̂ − m + W†∇ (Prop. A.1),
the Laplace approximation to the log marginal likelihood is, up to terms without θ,

    log Z(θ) = log p(y | f̂) + ½ ∇ᵀW†∇ + log N(z; 0, B_θ) + (N/2) log 2π,
    B_θ = I + W^{1/2} K_θ W^{1/2},   z = W^{1/2} b,

i.e. the log marginal likelihood of a GP regression in whitened coordinates (kernel matrix
K' = W^{1/2} K W^{1/2}, unit noise). Its value equals the Laplace evidence when f̂ is the mode;
its gradient with f̂, W, b held fixed is the *explicit* part of the Laplace gradient
(½ ∇ᵀ ∂K ∇ − ½ tr((K + W⁻¹)⁻¹ ∂K)); the implicit part through ∂f̂/∂θ (third derivatives of
log p) is what it misses.

log N(z; 0, B_θ) is replaced by CaGP's ELBO (paper 001, Eq. 11) with unit noise and whitened
actions S' = W^{1/2†} S from IterNCGP's buffered actions S: a lower bound for any actions,
equal when they span range(W). Every whitened quantity maps back to products with K, W and W†,
so no square root of W (a C × C block per point for softmax) is formed: with H = W W† S
(S projected on range(W)), orthonormalised so that S'ᵀS' = Hᵀ W† H = I, and Z = K_θ H,

    G_K = Hᵀ Z,  G = I + G_K,  ṽ = G⁻¹ Hᵀ b,  e = b − Z ṽ,
    −ELBO = ½ [eᵀ W e + tr(W K) − tr(G⁻¹ Zᵀ W Z) + N log 2π]
            + ½ [ṽᵀ G_K ṽ − tr(G⁻¹ G_K) + log det G].

Cost per evaluation: one product K_θ H with B columns per latent (matrix-free, differentiable),
O(B n L) for the W products and O(B² n L + B³) for the B × B algebra; memory O(B n L).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.likelihoods import Likelihood
from gpscale.linalg.ops import safe_cholesky, upcast
from gpscale.methods.options import Option

__all__ = ["KERNEL_LEARNING_OPTIONS", "Evidence", "EvidenceProblem", "KernelLearning",
           "W_diagonal", "evidence_problem", "laplace_evidence", "variational_evidence"]


OBJECTIVES = ("auto", "variational", "elbo", "projected")
"""Objectives of kernel learning: the evidence lower bound of the variational posterior
(``variational``, :func:`variational_evidence`), the computation-aware Laplace evidence
(``elbo``) or the likelihood of the projected whitened pseudo-targets (``projected``);
``auto``: ``variational`` with the variational refinement, else ``elbo``."""


LEARNING_ENTRIES = 1.6e8
"""By default the kernel rounds see at most n points with n²·L ≤ this (4,000 points with ten
latent functions, 12,649 with one): a round costs n²·L·B per evaluation of the objective (B
buffered actions). On a many-class set of several thousand points, rounds on all points leave
only a few rounds in the default budget; on a subset of this size each costs a fraction as much,
and with the stop on the evidence's noise the run reaches the same accuracy well within the
budget (BENCHMARKS "IterNCGP's MNIST run in 3 minutes")."""


def learning_points(points: int | None, n: int, num_latents: int) -> int:
    """How many of n training points the kernel rounds see: ``points``, at most n; 0: all n;
    ``None``: as many as keep n²·L ≤ :data:`LEARNING_ENTRIES` (each round's objective costs
    n²·L·B)."""
    if points is None:
        points = math.isqrt(int(LEARNING_ENTRIES // max(num_latents, 1)))
    return n if points == 0 else min(points, n)


@dataclass(frozen=True)
class KernelLearning:
    """How IterNCGP learns its kernel: rounds of Newton steps and hyperparameter steps.

    One round: L-BFGS (``steps`` iterations, strong Wolfe line search) maximises the
    computation-aware Laplace evidence with the iterate f̂, W(f̂) and the actions fixed; then
    Newton restarts from the previous representer weights and actions under the new kernel
    (:meth:`~gpscale.methods.iterncgp.IterNCGP.warm_start`). Rounds stop when no raw
    hyperparameter moved by more than ``rtol`` (relative, at least ``rtol`` absolute) in a
    round, when a round's starting evidence gained less than its noise on the last one
    (:data:`~gpscale.training.schedules.LOSS_SD` / √n per datum over the rounds' n points),
    after ``rounds`` rounds, or at the training time budget; the last round conditions
    from scratch, so the state is what :meth:`condition` gives for the learned kernel.

    Attributes:
        enabled: learn the kernel (``False``: the paper's fixed kernel).
        rounds: most rounds.
        steps: L-BFGS iterations per round.
        rank: actions used by the evidence (:func:`evidence_problem`); ``None``: all.
        rtol: the convergence tolerance on the raw hyperparameters.
        objective: what the rounds maximise (``OBJECTIVES``).
        points: training points the rounds see (a seeded random subset; the final
            conditioning uses all); ``None``: a cost bound (:data:`LEARNING_ENTRIES`); 0: all.
    """

    enabled: bool = True
    rounds: int = 10
    steps: int = 10
    rank: int | None = None
    rtol: float = 0.01
    objective: str = "auto"
    points: int | None = None

    def __post_init__(self):
        for name in ("rounds", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"kernel learning needs {name} ≥ 1; got {getattr(self, name)}")
        if self.rank is not None and self.rank < 1:
            raise ValueError(f"the evidence rank must be ≥ 1 or None; got {self.rank}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown kernel learning objective {self.objective!r}; valid: "
                             f"{', '.join(OBJECTIVES)}")
        if self.points is not None and self.points < 0:
            raise ValueError(f"kernel learning needs points ≥ 0 (0: all); got {self.points}")
        if self.rtol < 0:
            raise ValueError(f"the kernel learning tolerance must be ≥ 0; got {self.rtol}")

    def points_for(self, n: int, num_latents: int) -> int:
        """How many of n training points the rounds see (:func:`learning_points`)."""
        return learning_points(self.points, n, num_latents)


KERNEL_LEARNING_OPTIONS = (
        Option("learn_kernel", "bool", True, "learn the kernel hyperparameters (on the "
               "kernel_objective), starting from the given ones, else (classification) from "
               "the median distance or (counts) an SVGP pre-fit (false: keep the given or "
               "pre-fitted ones fixed, the paper)"),
        Option("kernel_rounds", "int", 10, "most rounds of hyperparameter steps and Newton "
               "restarts", minimum=1),
        Option("kernel_steps", "int", 10, "L-BFGS iterations per round", minimum=1),
        Option("evidence_rank", "int", None, "actions the evidence uses (the largest Ritz "
               "directions); none: all buffered actions (fewer bias the variational "
               "objective towards smaller outputscales)", minimum=1),
        Option("kernel_rtol", "float", 0.01, "rounds stop when no raw hyperparameter moves "
               "more than this", minimum=0),
        Option("kernel_objective", "str", "auto", "what kernel learning maximises: the "
               "evidence lower bound of the variational posterior (variational), the "
               "computation-aware Laplace evidence (elbo) or the likelihood of the projected "
               "pseudo-targets (projected); auto: variational with inference=variational, "
               "else elbo", choices=OBJECTIVES),
        Option("learn_points", "int", None, "training points the kernel rounds use (a seeded "
               "random subset; the final conditioning uses all); none: at most n with "
               "n²·L ≤ 1.6e8 (4,000 with 10 classes); 0: all", minimum=0),
)
"""Registry options of :class:`KernelLearning` (``iterncgp``)."""


@dataclass(frozen=True)
class EvidenceProblem:
    """What stays fixed while θ moves: the iterate, W there, the pseudo-targets and actions.

    Attributes:
        x: (n, d) training inputs.
        f: (L, n) the Newton iterate f̂ (W and ∇ are evaluated there).
        b: (L, n) pseudo-target right-hand side f̂ − m + W†∇.
        H: (L, n, B) actions in range(W) with Hᵀ W† H = I (whitened-orthonormal).
        W_diag: (L, n) the diagonal of W (for tr(W K)).
        constant: log p(y | f̂) + ½ ∇ᵀW†∇ (float64; no θ).
        likelihood: gives the products with W.
        y: the targets (for the variational evidence's expectations).
        kernel_matmul: V ↦ K_θ(x, x) V, differentiable in θ, for the round's evaluations
            (e.g. :meth:`~gpscale.methods.iterncgp.latent.LatentKernel.learning_matmul`);
            ``None``: the caller's.
        reference: the objective of the posterior the problem was built from, per datum, where
            the objective's own value at the start differs from it (the variational ELBO with
            all actions, while the objective keeps ``rank`` of them); rounds compare this.
    """

    x: Tensor
    f: Tensor
    b: Tensor
    H: Tensor
    W_diag: Tensor
    constant: Tensor
    likelihood: Likelihood
    y: Tensor | None = None
    kernel_matmul: Callable[[Tensor], Tensor] | None = None
    reference: float | None = None

    @property
    def num_actions(self) -> int:
        return self.H.shape[-1]


@dataclass(frozen=True)
class Evidence:
    """The evidence and its parts (all float64, divided by the number of data points n).

    Attributes:
        log_evidence: the Laplace log marginal likelihood estimate log Ẑ / n (an ELBO for
            log N(z; 0, B) plus the θ-free terms): differentiable in the kernel parameters.
        elbo: the whitened-regression ELBO / n (its N log 2π included).
        kl: KL(q ‖ p) / n of the whitened regression (≥ 0).
        projected: log N(S'ᵀz; 0, S'ᵀB S') / n, the log likelihood of the projected
            (whitened) pseudo-targets (CaGP's Eq. 9 with unit noise): differentiable in the
            kernel parameters, no computational-uncertainty term.
    """

    log_evidence: Tensor
    elbo: Tensor
    kl: Tensor
    projected: Tensor


def W_diagonal(likelihood: Likelihood, f: Tensor) -> Tensor:
    """The diagonal of W(f) as (L, n): L products with W on the per-latent unit vectors."""
    L = f.shape[0]
    if L == 1:
        return likelihood.W_matmul(f, torch.ones_like(f))
    E = torch.eye(L, dtype=f.dtype, device=f.device)[:, :, None].expand(L, L, f.shape[1])
    return torch.stack([likelihood.W_matmul(f, E[l])[l] for l in range(L)])


def _inner(A: Tensor, B: Tensor) -> Tensor:
    """Aᵀ B over the (L, n) axes in float64: A (L, n, p), B (L, n, q) or (L, n) → (p, q)/(p,)."""
    return upcast(torch.einsum("lnp,ln...->p...", A, B))


def evidence_problem(likelihood: Likelihood, x: Tensor, y: Tensor, f: Tensor, S: Tensor, *,
                     prior_mean: float, kernel_matmul=None, rank: int | None = None,
                     eig_rtol: float | None = None) -> EvidenceProblem:
    """Fix f̂ = ``f`` and the actions ``S`` (L, n, B) for :func:`laplace_evidence` (no gradient).

    The actions are projected on range(W) (H = W W† S) and orthonormalised in the W† inner
    product through the eigendecomposition of Hᵀ W† H; eigenvalues at or below ``eig_rtol`` ·
    λ_max (default 100 · eps of the dtype) are numerically dependent directions and dropped.
    The ELBO depends on the span of the whitened actions only (CaGP's column-space invariance),
    so this changes nothing but the round-off.

    With ``rank`` (and ``kernel_matmul``: V ↦ K V at the current θ) only the ``rank``
    directions of the largest Ritz values of the whitened prior K' = W^{1/2} K W^{1/2} are
    kept (eigenvectors of Hᵀ K H in the orthonormal basis): the span that holds most of the
    prior variance the data see, as a Nyström approximation would choose. This bounds the cost
    of each evidence evaluation by ``rank`` columns per latent whatever the number of buffered
    actions; the ELBO stays a lower bound.
    """
    with torch.no_grad():
        grad = likelihood.gradient(f, y)
        W_inv_grad = likelihood.W_inv_matmul(f, grad)
        b = f - prior_mean + W_inv_grad
        constant = upcast(likelihood.log_prob(f, y).sum()) + 0.5 * _inner(
            grad[..., None], W_inv_grad)[0]
        H = likelihood.W_matmul(f, likelihood.W_inv_matmul(f, S))  # on range(W)
        M = _inner(H, likelihood.W_inv_matmul(f, H))
        eigvals, U = torch.linalg.eigh(0.5 * (M + M.mT))
        rtol = eig_rtol if eig_rtol is not None else 100 * float(torch.finfo(S.dtype).eps)
        keep = eigvals > rtol * eigvals[-1].clamp_min(0)
        H = _span(H, U[:, keep] * eigvals[keep].rsqrt())
        if rank is not None and H.shape[-1] > rank:
            if kernel_matmul is None:
                raise ValueError("a rank for the evidence's actions needs kernel_matmul")
            G_K = _inner(H, kernel_matmul(H))
            _, V = torch.linalg.eigh(0.5 * (G_K + G_K.mT))  # ascending Ritz values
            H = _span(H, V[:, -rank:])  # orthonormal rotation: Hᵀ W† H = I still
        return EvidenceProblem(x, f, b, H, W_diagonal(likelihood, f), constant, likelihood, y)


def _span(H: Tensor, coef: Tensor) -> Tensor:
    """H c for H (L, n, B) and c (B, k)."""
    return torch.einsum("lnb,bk->lnk", H, coef.to(H.dtype))


def laplace_evidence(kernel_matmul, kernel_diag: Tensor, problem: EvidenceProblem) -> Evidence:
    """log Ẑ(θ) / n at the fixed :class:`EvidenceProblem` (see the module docstring).

    Args:
        kernel_matmul: V ↦ K_θ V for V (L, n, k), differentiable in θ (e.g.
            ``partial(latent_kernel.matmul, x, x)``).
        kernel_diag: (L, n) prior variances k_l(x_j, x_j), differentiable in θ.
        problem: f̂, b, the whitened-orthonormal actions H and the θ-free terms.

    Returns:
        An :class:`Evidence`; ``log_evidence`` is what a hyperparameter step maximises.
    """
    lik, f, b, H = problem.likelihood, problem.f, problem.b, problem.H
    L, n = b.shape
    tr_WK = (upcast(problem.W_diag) * upcast(kernel_diag)).sum()
    log_2pi = torch.log(torch.tensor(2 * torch.pi, dtype=torch.float64, device=b.device))
    zero = torch.zeros((), dtype=torch.float64, device=b.device)
    if H.shape[-1] == 0:  # no action: q = p, the ELBO of the prior (tr(W K) its only θ term)
        quad = _inner(b[..., None], lik.W_matmul(f, b))[0]
        elbo = -0.5 * (quad + tr_WK + L * n * log_2pi)
        return Evidence((elbo + 0.5 * L * n * log_2pi + problem.constant) / n, elbo / n, zero,
                        zero)
    Z, G_K, chol, c, v, kl = _whitened_posterior(kernel_matmul, problem)
    e = b - torch.einsum("lnb,b->ln", Z, v.to(Z.dtype))
    quad = _inner(e[..., None], lik.W_matmul(f, e))[0]
    ZWZ = _inner(Z, lik.W_matmul(f, Z))
    trace = tr_WK - torch.cholesky_solve(ZWZ, chol).diagonal().sum()
    elbo = -0.5 * (quad + trace + L * n * log_2pi) - kl
    log_evidence = elbo + 0.5 * L * n * log_2pi + problem.constant
    logdet_G = 2 * chol.diagonal().log().sum()
    projected = -0.5 * (c @ v + logdet_G + G_K.shape[0] * log_2pi)
    return Evidence(log_evidence / n, elbo / n, kl / n, projected / n)


def _whitened_posterior(kernel_matmul, problem: EvidenceProblem):
    """(Z = K H, G_K = HᵀZ, chol(I + G_K), c = Hᵀb, ṽ = G⁻¹c, KL(q ‖ p)) of the site regression
    posterior q = N(m + Z ṽ, K − Z G⁻¹ Zᵀ) that the actions H give (float64 algebra)."""
    H, b = problem.H, problem.b
    Z = kernel_matmul(H)  # (L, n, B), the one K-product
    G_K = _inner(H, Z)
    G_K = 0.5 * (G_K + G_K.mT)
    eye = torch.eye(G_K.shape[0], dtype=G_K.dtype, device=G_K.device)
    chol = safe_cholesky(eye + G_K, name="whitened Gram matrix I + HᵀKH")
    c = _inner(H, b)  # S'ᵀz
    v = torch.cholesky_solve(c[:, None], chol)[:, 0]
    kl = 0.5 * (v @ G_K @ v - torch.cholesky_solve(G_K, chol).diagonal().sum()
                + 2 * chol.diagonal().log().sum())
    return Z, G_K, chol, c, v, kl


def variational_evidence(kernel_matmul, kernel_diag: Tensor, problem: EvidenceProblem,
                         likelihood: Likelihood, y: Tensor, prior_mean: float,
                         expectation) -> Tensor:
    """The evidence lower bound / n of the site posterior under θ (differentiable in θ):

        ELBO(θ) = Σ_i E_{q_i}[log p(y_i | f_i)] − KL(q ‖ p),
        q = N(m + Z ṽ, K − Z G⁻¹ Zᵀ),  Z = K_θ H,  G = I + HᵀZ,  ṽ = G⁻¹ Hᵀ b,

    with the sites (``problem.likelihood``: Λ, b = Λ†η − m) and the actions H held fixed. q is
    a Gaussian for every θ, so this is a lower bound on log p(y | θ) whatever the sites and
    actions (no Laplace approximation in it). ``expectation(mean, cov, root)`` returns
    Σ_i E[log p(y_i | f_i)] for q_i = N(mean_i, cov_i) (the refinement's quadrature or draws,
    :func:`~gpscale.methods.iterncgp.variational.expected_terms`), ``root`` a differentiable
    Cholesky factor of each block.
    """
    L, n = problem.b.shape
    Z, _, chol, _, v, kl = _whitened_posterior(kernel_matmul, problem)
    mean = prior_mean + torch.einsum("lnb,b->ln", Z, v.to(Z.dtype))
    R = torch.linalg.solve_triangular(chol, upcast(Z).reshape(L * n, -1).mT,
                                      upper=False).mT.reshape(L, n, -1).to(Z.dtype)
    cov = torch.diag_embed(kernel_diag.mT) - torch.einsum("lnb,mnb->nlm", R, R)
    jitter = 1e-8 * kernel_diag.detach().mean()
    eye = torch.eye(L, dtype=cov.dtype, device=cov.device)
    root = torch.linalg.cholesky(cov + jitter * eye)
    return (expectation(mean, cov, root) - kl) / n
