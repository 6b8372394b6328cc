r"""``sod-laplace``: subset-of-data Laplace with a dense Cholesky (the IterNCGP paper's baseline).

Tatzel et al. (2024), arXiv:2310.20285, §5.2 / §C.3: a random subset of N_sub points (without
replacement; the paper uses N_sub ∈ {250, 500, 1000, 2000}), Newton's method on the subset with
K̂(f_i) = K + W(f_i)⁻¹ formed explicitly (N_sub L × N_sub L) and factorised by Cholesky in every
Newton step (the paper calls ``torch.linalg.cholesky``; here :class:`~gpscale.linalg.solvers.
Cholesky` with jitter escalation), until the outer criterion of IterNCGP holds. Softmax uses W†
(Lemma A.7). Predictive: m + K(·, X_sub) v and k(·, ·) − K(·, X_sub) K̂⁻¹ K(X_sub, ·), the
Laplace predictive at the last W (Eqs. 4–5 with K̂ = K + W⁻¹ of the final iterate's step).

Cost per Newton step O((N_sub L)³), memory O((N_sub L)²): K̂ (3.2 GB for N_sub = 2000, C = 10)
is filled in place — K stays as its L diagonal blocks and W⁻¹ is built from products with a few
identity columns at a time — and its Cholesky factor replaces the last step's, so K̂, its
factor and the factorisation's working copy are the only (N_sub L)² matrices (peak measured at
3.2–3.6 (N_sub L)² floats; ``tests/methods/iterncgp/test_sod_memory.py``).
The diagonal blocks of K̂⁻¹ are kept for prediction (from L triangular solves, not the full inverse),
O(t N_sub² L) for t test points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.likelihoods import Likelihood
from gpscale.linalg.solvers import Cholesky, CholeskyState
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.iterncgp.latent import (
    LAPLACE_PRIOR_OPTIONS,
    PREFIT_OPTIONS,
    TASKS,
    LatentKernel,
    PredictiveOptions,
    latent_predictive,
    prior_setup,
    resolve_options,
)
from gpscale.methods.iterncgp.pipeline import PIPELINE
from gpscale.methods.iterncgp.solver import Stopping
from gpscale.methods.options import Option
from gpscale.methods.registry import MethodSpec, register
from gpscale.validation import check_x, check_xy

__all__ = ["SoDLaplace", "SoDLaplaceState", "build_sod_laplace"]



@dataclass(frozen=True)
class SoDLaplaceState:
    """The Laplace approximation on the subset.

    Attributes:
        x: (m, d) subset inputs.  y: (m,) subset targets.  index: (m,) their rows in the data.
        f: (L, m) final Newton iterate on the subset.  v: (L, m) K̂⁻¹(ŷ − m) of the last step.
        factor: Cholesky of the last K̂ (L m × L m, latent-major).
        precision_blocks: (L, m, m) the diagonal blocks of K̂⁻¹: K(·, X_sub) is block-diagonal
            over the latents, so the predictive variance of latent l needs only block l.
        newton_steps: outer iterations run.  converged: the outer criterion was met.
    """

    x: Tensor
    y: Tensor
    index: Tensor
    f: Tensor
    v: Tensor
    factor: CholeskyState
    precision_blocks: Tensor
    newton_steps: int
    converged: bool


class SoDLaplace(Method):
    """Subset-of-data Laplace approximation with dense Cholesky solves (key ``sod-laplace``).

    Args:
        kernel: GPyTorch kernel (batch shape () shared or (L,)); frozen.
        likelihood: a :class:`~gpscale.likelihoods.Likelihood`.
        num_subset: N_sub; all points when the data has fewer.
        seed: seeds the subset.
        stopping: only ``outer_rtol`` and ``max_newton_steps`` apply (the solves are exact).
        predictive: how probabilities are integrated.
        prior_mean: constant prior mean.
        cholesky: the dense solver (jitter, factor dtype).
        options: resolved factory options.
    """

    key = "sod-laplace"
    minibatch = False
    needs_data_for_prediction = True
    trainable: ClassVar[bool] = False

    def __init__(self, kernel, likelihood: Likelihood, *, num_subset: int = 1000, seed: int = 0,
                 stopping: Stopping | None = None, predictive: PredictiveOptions | None = None,
                 prior_mean: float = 0.0, cholesky: Cholesky | None = None,
                 options: dict[str, Any] | None = None):
        task = likelihood.task
        num_classes = {"classification": max(2, likelihood.num_latents)}.get(task)
        super().__init__(task=task, num_classes=num_classes, options=options)
        if num_subset < 1:
            raise ValueError(f"num_subset must be ≥ 1; got {num_subset}")
        self.kernel = kernel.requires_grad_(False)
        self.likelihood = likelihood
        self.latent_kernel = LatentKernel(kernel, likelihood.num_latents)
        self.num_subset, self.seed = int(num_subset), int(seed)
        self.stopping = stopping or Stopping()
        self.predictive = predictive or PredictiveOptions()
        self.prior_mean = float(prior_mean)
        self.cholesky = cholesky or Cholesky(name="K̂ = K + W⁻¹ (subset)")

    def subset(self, n: int) -> Tensor:
        """The N_sub rows (a seeded random subset without replacement)."""
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        return perm[:self.num_subset]

    def condition(self, x: Tensor, y: Tensor) -> SoDLaplaceState:
        """Dense Newton iterations on the subset (Eqs. 3, 6–7 with an exact solve)."""
        check_x(x, num_dims=getattr(self, "num_dims", None))
        check_xy(x, y, task=self.task, num_classes=self.num_classes)
        index = self.subset(x.shape[0]).to(x.device)
        xs, ys = x[index], y[index]
        lik, L, m = self.likelihood, self.likelihood.num_latents, xs.shape[0]
        K = self.latent_kernel.dense(xs, xs)  # (L, m, m): K is block-diagonal over latents
        mean = xs.new_full((L, m), self.prior_mean)
        f, converged, steps, factor = mean.clone(), False, 0, None
        while not converged and steps < self.stopping.max_newton_steps:
            steps += 1
            b = f + lik.W_inv_matmul(f, lik.gradient(f, ys)) - mean  # ŷ(f) − m, Prop. A.1
            factor = None  # free the last step's factor before the next K̂ exists
            factor = self.cholesky.init(_dense_K_hat(K, lik, f))
            v = self.cholesky.solve(factor, b.reshape(-1)).reshape(b.shape)  # K̂⁻¹ (ŷ − m)
            f_next = mean + torch.einsum("lij,lj->li", K, v)  # f_{i+1} = K v + m
            change = float((f_next - f).norm()) / max(float((f_next - mean).norm()), 1e-300)
            f, converged = f_next, change <= self.stopping.outer_rtol
        blocks = torch.stack([  # [K̂⁻¹]_ll = E_lᵀ K̂⁻¹ E_l, E_l latent l's identity columns
            self.cholesky.inv_congruence(factor, _identity_columns(L * m, l * m, m, f),
                                         dtype=factor.L.dtype)  # float32 blocks cancel below
            for l in range(L)])
        return SoDLaplaceState(xs, ys, index, f, v, factor, blocks, steps, converged)

    def loss(self, state: SoDLaplaceState) -> Tensor:
        """−Ψ(f)/m on the subset up to a constant: ½ vᵀ(f − m)/m − mean log p(y | f)."""
        quad = 0.5 * (state.v * (state.f - self.prior_mean)).sum() / state.f.shape[-1]
        return quad - self.likelihood.log_prob(state.f, state.y).mean()

    def predict(self, state: SoDLaplaceState, x_test: Tensor, chunk_size: int = 4096
                ) -> Predictive:
        """Laplace predictive on the subset at ``x_test`` (t, d), in chunks of test points.

        Mean m + K(x⋄, X_sub) v; variance k(x⋄, x⋄) − k_l(x⋄)ᵀ [K̂⁻¹]_{ll} k_l(x⋄) per latent l.
        """
        check_x(x_test, num_dims=state.x.shape[1], name="x_test")

        def chunk(xc: Tensor) -> Predictive:
            Ks = self.latent_kernel.dense(xc, state.x)  # (L, t, m)
            mean = self.prior_mean + torch.einsum("ltm,lm->lt", Ks, state.v)
            P = state.precision_blocks  # in the factor's dtype: kᵀ P k cancels against k(x, x)
            Kp = Ks.to(P.dtype)
            quad = torch.einsum("ltm,lmk,ltk->lt", Kp, P, Kp)
            var = (self.latent_kernel.diag(xc).to(P.dtype) - quad).to(Ks.dtype)
            return latent_predictive(self.likelihood, mean, var.clamp_min(0), self.predictive)

        return predict_in_chunks(chunk, x_test, chunk_size)


def _identity_columns(N: int, start: int, cols: int, like: Tensor) -> Tensor:
    """(N, cols): columns start … start + cols − 1 of the N × N identity."""
    E = like.new_zeros(N, cols)
    E[start + torch.arange(cols), torch.arange(cols)] = 1.0
    return E


def _dense_K_hat(K: Tensor, lik: Likelihood, f: Tensor, block: int = 512) -> Tensor:
    """K̂ = K + W(f)⁻¹ (or W†) as one dense (L m, L m) matrix, latent-major.

    W⁻¹ is filled from its products with ``block`` identity columns at a time and K's diagonal
    blocks (L, m, m) are added in place, so K̂ is the only (L m)² tensor.
    """
    L, m = f.shape
    N = L * m
    A = f.new_empty(N, N)
    for start in range(0, N, block):
        cols = min(block, N - start)
        E = _identity_columns(N, start, cols, f).reshape(L, m, cols)
        A[:, start:start + cols] = lik.W_inv_matmul(f, E).reshape(N, cols)
    A4 = A.view(L, m, L, m)
    for latent in range(L):
        A4[latent, :, latent, :] += K[latent]
    return A


def build_sod_laplace(num_dims: int, *, task: str = "classification",
                      num_classes: int | None = None, init: tuple[Tensor, Tensor] | None = None,
                      num_subset: int = 1000, max_newton_steps: int = 100,
                      outer_rtol: float = 0.01, kernel: str = "matern32", ard: bool | None = None,
                      lengthscale: Any = None, outputscale: Any = None,
                      shared_kernel: bool = True, prior_mean: float = 0.0,
                      probs: str = "probit", num_samples: int = 1000, seed: int = 0,
                      prefit_steps: int = 100, prefit_num_inducing: int = 64,
                      prefit_lr: float = 0.05, prefit_batch_size: int = 1024) -> SoDLaplace:
    """Factory of ``sod-laplace``; options as :func:`~gpscale.methods.iterncgp.build_iterncgp`
    plus ``num_subset`` (N_sub). The hyperparameter pre-fit uses all of ``init``, so both methods
    get the same values for the same seed.
    """
    prior = prior_setup("sod-laplace", num_dims, task=task, num_classes=num_classes,
                        init=init, kernel=kernel, ard=ard, shared=shared_kernel,
                        lengthscale=lengthscale, outputscale=outputscale, seed=seed,
                        prefit_steps=prefit_steps, prefit_num_inducing=prefit_num_inducing,
                        prefit_lr=prefit_lr, prefit_batch_size=prefit_batch_size)
    options = resolve_options(
        num_subset=num_subset, max_newton_steps=max_newton_steps, outer_rtol=outer_rtol,
        kernel=kernel, ard=prior.ard, lengthscale=prior.lengthscale, outputscale=prior.outputscale,
        shared_kernel=shared_kernel, prior_mean=prior_mean, probs=probs,
        num_samples=num_samples, seed=seed, **prior.prefit_options)
    model = SoDLaplace(prior.kernel, prior.likelihood, num_subset=num_subset, seed=seed,
                       stopping=Stopping(outer_rtol, max_newton_steps),
                       predictive=PredictiveOptions(probs, num_samples, seed),
                       prior_mean=prior_mean, options=options)
    return model if init is None else model.to(device=init[0].device, dtype=init[0].dtype)


register(MethodSpec(
    key="sod-laplace",
    factory=build_sod_laplace,
    tasks=TASKS,
    summary="Subset-of-data Laplace (dense Cholesky on N_sub random points), IterNCGP baseline",
    **PIPELINE["sod-laplace"],
    options=(
        Option("num_subset", "int", 1000, "random training points N_sub of the dense Laplace",
               minimum=1),
        Option("max_newton_steps", "int", 100, "most Newton steps", minimum=1),
        Option("outer_rtol", "float", 0.01, "Newton stops at this relative change (0: run "
               "max_newton_steps)", minimum=0),
        *LAPLACE_PRIOR_OPTIONS,
        *PREFIT_OPTIONS,
    ),
))
