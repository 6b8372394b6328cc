r"""Variational refinement of IterNCGP's Laplace posterior (beyond paper 000).

The Laplace approximation centres q(f) at the mode f̂ and takes its precision from the curvature
W(f̂) there. The class probabilities then integrate the likelihood over q, which the mode never
accounted for: with many classes the probabilities come out underconfident (a mean confidence
well below the accuracy). The Gaussian q that maximises the evidence lower bound

    ELBO(q) = Σ_i E_q[log p(y_i | f_i)] − KL(q ‖ p)

is stationary where (Opper & Archambeau, 2009; Bonnet's and Price's theorems)

    μ − m = K ḡ,   Σ⁻¹ = K⁻¹ + W̄,   ḡ = E_q[∇ log p(y | f)],   W̄ = −E_q[∇² log p(y | f)],

i.e. q is the posterior of a GP regression with Gaussian *sites*: precision blocks Λ = W̄ (one
L × L block per data point) and natural location η = W̄ μ + ḡ, pseudo-targets ỹ = Λ†η. A step
from q takes these expectations under the current q and solves that regression, which is one
Newton step of Alg. 1 with the expected derivatives in place of those at a point (natural-gradient
variational inference with unit step). IterNCGP's machinery is reused unchanged: the regression is
solved by IterGP with the recycled actions, and q is its posterior (Eqs. 8–9), so the
computational uncertainty stays in the variance and the expectations see it.

Expectations: Gauss–Hermite quadrature for one latent function (Bernoulli, Poisson), Monte Carlo
with fixed antithetic draws for the softmax (common random numbers across steps, so the fixed
point is deterministic). The ELBO of every q is computed from the buffers without a kernel
product (KL below); a step that lowers it is undone and the refinement stops.

With C = Q Qᵀ the precision root and f = m + K v, q = N(m + K v, K − K Q Qᵀ K) and

    KL(q ‖ p) = ½ [vᵀ K v − tr(QᵀKQ) − log det(I − QᵀKQ)].
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from gpscale.errors import NumericalError
from gpscale.likelihoods import Likelihood
from gpscale.linalg.ops import psd_sqrt, upcast
from gpscale.methods.iterncgp.solver import (
    Belief,
    IterNCGPState,
    NewtonStep,
    RegressionProblem,
    solve,
    virtual_solver_run,
)
from gpscale.methods.options import Option

__all__ = ["INFERENCE", "VARIATIONAL_OPTIONS", "Sites", "Variational", "expected_terms",
           "kl_divergence", "refine", "state_sites", "training_covariance"]

log = logging.getLogger("gpscale.methods")

INFERENCE = ("variational", "laplace")
ELBO_RTOL = 1e-6
"""A refinement step whose ELBO (per datum) falls by more than this (relative) is undone."""
DAMPING_HALVINGS = 4
"""An undone step is retried with the site step ρ halved, at most this many times."""


@dataclass(frozen=True)
class Variational:
    """How IterNCGP refines its Laplace posterior towards the variational optimum.

    Attributes:
        enabled: refine (``False``: the Laplace posterior of the paper).
        max_steps: most refinement steps (each: expectations, then one IterGP solve of
            ``max_iterations`` on the site regression with recycled actions).
        num_samples: Gauss–Hermite nodes (one latent) or Monte Carlo draws (softmax, rounded up
            to an even number: antithetic pairs).
        seed: of the Monte Carlo draws.
    """

    enabled: bool = True
    max_steps: int = 10
    num_samples: int = 64
    seed: int = 0

    def __post_init__(self):
        for name in ("max_steps", "num_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"variational refinement needs {name} ≥ 1; got "
                                 f"{getattr(self, name)}")


VARIATIONAL_OPTIONS = (
    Option("inference", "str", "variational", "the posterior: the Laplace approximation "
           "(laplace, the paper), refined towards the Gaussian that maximises the evidence "
           "lower bound (variational)", choices=INFERENCE),
    Option("vi_steps", "int", 10, "most variational refinement steps", minimum=1),
    Option("vi_samples", "int", 64, "quadrature nodes (one latent) or Monte Carlo draws "
           "(softmax) of the expectations under q", minimum=1),
)
"""Registry options of :class:`Variational` (``iterncgp``)."""


class Sites(Likelihood):
    """Gaussian sites: a likelihood with f-independent block precision Λ and location η.

    log p̃(f) = ηᵀf − ½ fᵀΛf per data point (up to a constant), so ∇ = η − Λ f and W = Λ. Its
    Newton step is exact: the site regression with pseudo-targets Λ†η and noise Λ†.

    Args:
        precision: (n, L, L) symmetric positive semi-definite blocks Λ_i.
        location: (L, n) η.
        rtol: eigenvalues of a block at or below ``rtol`` times its largest are null
            directions of the pseudo-inverse (the softmax's 1).
    """

    def __init__(self, precision: Tensor, location: Tensor, rtol: float = 1e-10):
        self.precision, self.location = precision, location
        evals, evecs = torch.linalg.eigh(0.5 * (precision + precision.mT))
        keep = evals > rtol * evals[..., -1:].clamp_min(0)
        inv = torch.where(keep, 1 / torch.where(keep, evals, torch.ones_like(evals)), 0.0)
        self.pseudo_inverse = (evecs * inv[..., None, :]) @ evecs.mT
        self.num_latents = precision.shape[-1]

    @staticmethod
    def _blocks(B: Tensor, V: Tensor) -> Tensor:
        return torch.einsum("nlm,mn...->ln...", B, V)

    def log_prob(self, f: Tensor, y: Tensor) -> Tensor:
        return (self.location * f).sum(0) - 0.5 * (f * self._blocks(self.precision, f)).sum(0)

    def gradient(self, f: Tensor, y: Tensor) -> Tensor:
        return self.location - self._blocks(self.precision, f)

    def W_matmul(self, f: Tensor, V: Tensor) -> Tensor:
        return self._blocks(self.precision, V)

    def W_inv_matmul(self, f: Tensor, V: Tensor) -> Tensor:
        return self._blocks(self.pseudo_inverse, V)

    def blend(self, other: Sites, rho: float) -> Sites:
        """(1 − ρ) self + ρ other in the natural parameters (precision and location)."""
        return Sites((1 - rho) * self.precision + rho * other.precision,
                     (1 - rho) * self.location + rho * other.location)

    @property
    def targets(self) -> Tensor:
        """(L, n) pseudo-targets ỹ = Λ†η."""
        return self._blocks(self.pseudo_inverse, self.location)


def training_covariance(prior_diag: Tensor, KQ: Tensor) -> Tensor:
    """q's L × L covariance at each training point (n, L, L): diag k(x_i, x_i) − (KQ)_i (KQ)_iᵀ
    from the prior variances (L, n) and K Q (L, n, B')."""
    return torch.diag_embed(prior_diag.mT) - torch.einsum("lnb,mnb->nlm", KQ, KQ)


def _draws(lik: Likelihood, n: int, variational: Variational, like: Tensor):
    """Yields (ε, weight): standard-normal points (n or 1, L) with weights summing to 1,
    Gauss–Hermite nodes for one latent, else antithetic Monte Carlo pairs drawn one at a time
    (memory O(n L) whatever the number of draws; the same draws at every call)."""
    L = lik.num_latents
    if L == 1:
        nodes, weights = np.polynomial.hermite_e.hermegauss(variational.num_samples)
        for node, weight in zip(nodes, weights / weights.sum(), strict=True):
            yield like.new_full((1, 1), float(node)), float(weight)
        return
    pairs = (variational.num_samples + 1) // 2
    generator = torch.Generator().manual_seed(variational.seed)  # equal on any device
    for _ in range(pairs):
        eps = torch.randn((n, L), generator=generator, dtype=like.dtype).to(like.device)
        yield eps, 0.5 / pairs
        yield -eps, 0.5 / pairs


def _root(cov: Tensor) -> Tensor:
    """R with R Rᵀ = cov for (n, L, L) blocks: the symmetric root (eigenvalues clamped at 0;
    no gradient)."""
    if cov.shape[-1] == 1:
        return cov.clamp_min(0).sqrt()
    return psd_sqrt(cov)  # unique: the same draws on any device


def expected_terms(lik: Likelihood, y: Tensor, mean: Tensor, cov: Tensor,
                   variational: Variational, *, derivatives: bool = True, root: Tensor | None = None
                   ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """E_q[log p(y | f)] summed over the data, and with ``derivatives`` the expected gradient
    ḡ (L, n) and the expected negative Hessian blocks W̄ (n, L, L), for q_i = N(mean_i, cov_i)
    (mean (L, n), cov (n, L, L)). ``root`` (n, L, L) replaces the eigenvalue root of ``cov``
    (a differentiable Cholesky factor for kernel learning)."""
    L, n = mean.shape
    R = _root(cov) if root is None else root
    total = mean.new_zeros(())
    g = mean.new_zeros(L, n) if derivatives else None
    W = mean.new_zeros(n, L, L) if derivatives else None
    for e, w in _draws(lik, n, variational, mean):
        f = mean + torch.einsum("nlm,nm->ln", R, e.expand(n, L))
        total = total + w * upcast(lik.log_prob(f, y).sum())
        if derivatives:
            g = g + w * lik.gradient(f, y)
            W = W + w * _W_blocks(lik, f)
    return total, g, W


def kl_divergence(v: Tensor, Kv: Tensor, Q: Tensor, KQ: Tensor) -> Tensor:
    """KL(q ‖ p) for q = N(m + K v, K − K Q Qᵀ K) from v, K v (L, n), Q, K Q (L, n, B')
    (float64; see the module docstring)."""
    quad = upcast((v * Kv).sum())
    if Q.shape[-1] == 0:
        return 0.5 * quad
    QKQ = upcast(torch.einsum("lnb,lnc->bc", Q, KQ))
    QKQ = 0.5 * (QKQ + QKQ.mT)
    eye = torch.eye(QKQ.shape[0], dtype=QKQ.dtype, device=QKQ.device)
    sign, logdet = torch.linalg.slogdet(eye - QKQ)
    if sign <= 0:
        return QKQ.new_tensor(float("inf"))
    return 0.5 * (quad - QKQ.diagonal().sum() - logdet)


def _elbo(lik, y, f, v, Kv, Q, KQ, prior_diag, variational) -> tuple[float, Tensor, Tensor]:
    """(ELBO / n, ḡ, W̄) of q = N(f, K − K Q Qᵀ K)."""
    cov = training_covariance(prior_diag, KQ)
    expected, g, W = expected_terms(lik, y, f, cov, variational)
    elbo = float((expected - kl_divergence(v, Kv, Q, KQ)).detach()) / f.shape[-1]
    return elbo, g, W


@dataclass(frozen=True)
class _OnRange:
    """A policy whose actions are projected on range(W) (W W† s; the softmax: centred)."""

    policy: object

    def bind(self, problem: RegressionProblem):
        inner = self.policy.bind(problem) if hasattr(self.policy, "bind") else self.policy
        return lambda step: problem.W_matmul(problem.W_inv_matmul(inner(step)))


def refine(model, x: Tensor, y: Tensor, state: IterNCGPState, K_matmul,
           sites: Sites | None = None) -> IterNCGPState:
    """Variational steps from ``state`` (a Laplace posterior) until the relative change of the
    mean is at most the outer tolerance δ, a step raises the ELBO / n by at most δ² (relative),
    ``max_steps`` ran (the caller warns), or no step size raises the ELBO.

    Each step moves the sites from those of the current q towards the target sites of its
    expectations, by ρ = 1 at first (the fixed-point step); a step that lowers the ELBO is undone
    and retried with ρ halved (the sites are blended: precision and location), up to
    ``DAMPING_HALVINGS`` times, and the smaller ρ is kept.

    Args:
        model: the IterNCGP (its likelihood, policy, stopping, recycling, prior mean and
            ``variational`` settings).
        x, y: training data.
        state: where to start; its Q, S, T and f = m + K v.
        K_matmul: V ↦ K(x, x) V.
        sites: the first step's sites instead of those of ``state``'s q (a warm start after a
            kernel change: the sites of the previous kernel's q; ``state`` then needs no Q).

    Returns:
        The refined state; its trace gains one :class:`NewtonStep` per accepted step
        (``log_joint`` holds the ELBO / n there, ``step_size`` ρ).
    """
    lik, plan, stop = model.likelihood, model.variational, model.stopping
    m = model.prior_mean
    prior_diag = model.latent_kernel.diag(x)
    start = sites
    if start is None:
        KQ = K_matmul(state.Q)
        # −inf where the Laplace q is degenerate: actions outside range(W) observe the
        # softmax's class sum without noise (W† there is 0); any refined q is better.
        elbo, g, W = _elbo(lik, y, state.f, state.v, state.f - m, state.Q, KQ, prior_diag, plan)
        sites = _point_sites(lik, y, state.f)  # the Laplace sites: W(f̂), W(f̂) f̂ + ∇
    else:
        elbo = -math.inf  # the given sites' step is taken
    current, trace = state, list(state.trace)
    S_range = sites.W_matmul(None, sites.W_inv_matmul(None, state.S))
    S, T = state.S, state.T
    scale = float(S.abs().amax()) if S.numel() else 0.0
    if not torch.allclose(S_range, S, rtol=1e-6, atol=1e-8 * scale):
        S, T = S_range, K_matmul(S_range)  # actions on range(W): null directions unobserved
    accepted = Belief(S, T, S.new_zeros(0, 0, dtype=torch.float64),
                      S.new_zeros(0, dtype=torch.float64), num_actions=S.shape[-1])
    rho = 1.0
    for i in range(plan.max_steps):
        f = current.f
        target = start if i == 0 and start is not None else Sites(
            W, torch.einsum("nlm,mn->ln", W, f) + g)
        for _ in range(DAMPING_HALVINGS + 1):
            trial = target if rho == 1.0 else sites.blend(target, rho)
            problem = RegressionProblem(trial.targets - m, K_matmul,
                                        lambda V, s=trial: s.W_inv_matmul(None, V),
                                        lambda V, s=trial: s.W_matmul(None, V))
            belief = virtual_solver_run(accepted, problem, model.recycling)
            belief = solve(problem, belief, _OnRange(model.policy), stop)
            f_next = m + belief.Kv
            KQ_next = torch.einsum("lnb,bk->lnk", belief.T, belief.A.to(belief.T.dtype))
            elbo_next, g_next, W_next = (
                _elbo(lik, y, f_next, belief.v, f_next - m, belief.Q, KQ_next, prior_diag, plan)
                if bool(torch.isfinite(f_next).all()) else (-math.inf, None, None))
            if math.isinf(elbo) or elbo_next >= elbo - ELBO_RTOL * max(1.0, abs(elbo)):
                break
            rho /= 2
        else:
            log.info("IterNCGP variational refinement: no step size raised the ELBO/n from "
                     "%.6g; stopped", elbo)
            break
        if not math.isfinite(elbo_next):
            if start is not None and i == 0:  # ``state`` is no posterior yet: nothing to keep
                raise NumericalError("IterNCGP's variational step from the given sites is not "
                                     "finite; condition from scratch")
            break
        change = float((f_next - f).norm() / f_next.norm().clamp_min(1e-300))
        trace.append(NewtonStep(len(trace), belief.iteration, str(belief.stopped),
                                float(belief.residual.norm()), change, belief.rank, rho,
                                elbo_next))
        # near the optimum the ELBO is quadratic in the step: a gain of δ² for a change δ (a
        # step accepted within ELBO_RTOL without a gain is Monte Carlo noise: no evidence)
        gain = (elbo_next - elbo) / max(1.0, abs(elbo_next))
        converged = change <= stop.outer_rtol or 0 < gain <= stop.outer_rtol**2
        current = replace(current, f=f_next, v=belief.v, Q=belief.Q, S=belief.S, T=belief.T,
                          trace=tuple(trace), converged=converged)
        accepted, sites = belief, trial
        elbo, g, W = elbo_next, g_next, W_next
        if converged:
            break
    return current


def state_sites(model, state: IterNCGPState, K_matmul) -> tuple[Sites, float]:
    """The target sites of ``state``'s q (W̄, W̄ μ + ḡ under q) — at a fixed point of the
    refinement, the sites that give q — and the ELBO / n of q. One product K Q."""
    KQ = K_matmul(state.Q)
    elbo, g, W = _elbo(model.likelihood, state.y, state.f, state.v, state.f - model.prior_mean,
                       state.Q, KQ, model.latent_kernel.diag(state.x), model.variational)
    return Sites(W, torch.einsum("nlm,mn->ln", W, state.f) + g), elbo


def _point_sites(lik: Likelihood, y: Tensor, f: Tensor) -> Sites:
    """The Laplace sites at f: precision W(f) (n, L, L) and location W(f) f + ∇log p(y | f)."""
    W = _W_blocks(lik, f)
    return Sites(W, torch.einsum("nlm,mn->ln", W, f) + lik.gradient(f, y))


def _W_blocks(lik: Likelihood, f: Tensor) -> Tensor:
    """W(f) as (n, L, L) blocks: products with the per-point unit vectors."""
    L, n = f.shape
    eye = torch.eye(L, dtype=f.dtype, device=f.device)
    return lik.W_matmul(f, eye[:, None, :].expand(L, n, L)).transpose(0, 1)
