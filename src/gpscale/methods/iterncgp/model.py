r"""``iterncgp``: computation-aware Laplace inference for non-conjugate GPs (IterNCGP).

Tatzel, Wenger, Schneider & Hennig (2024), "Accelerating Non-Conjugate Gaussian Processes By
Trading Off Computation For Uncertainty", arXiv:2310.20285. Digest: notes/000_iterncgp.md.

==========  ==========================  =======================================================
symbol      variable                    meaning
==========  ==========================  =======================================================
X, y        ``state.x``, ``state.y``    (n, d) training inputs, (n,) targets
L (= C)     ``likelihood.num_latents``  latent GPs (classes for softmax, else 1)
m           ``prior_mean``              constant prior mean; vectors are (L, n) (NC-ordering)
K           ``LatentKernel``            prior covariance, blockdiag over the L latent GPs
W(f)        ``likelihood``              −∇² log p(y | f); W⁻¹ (softmax: W†, Lemma A.7)
ŷ(f)        ``b + m``                   pseudo-targets f + W⁻¹ ∇log p(y | f) (Prop. A.1)
K̂           ``RegressionProblem``       K + W(f_i)⁻¹
S, T        ``state.S``, ``state.T``    (L, n, B) buffered actions and T = K S (Alg. 3)
v_j, C_j    ``state.v``, ``state.Q``    representer weights, C_j = Q Qᵀ ≈ K̂⁻¹ (Eq. 10)
f_i         ``state.f``                 (L, n) Newton iterate f_{i+1} = K v_j + m (Alg. 1 l. 9)
δ, j_max    ``Stopping``                outer tolerance, inner iterations per Newton step
R           ``Recycling.rank``          compression rank (None: R = ∞)
==========  ==========================  =======================================================

Algorithm 1 (outer loop) runs Newton's method on Ψ(f) = log p(y | f) − ½ (f − m)ᵀK⁻¹(f − m) as
a sequence of GP regressions on pseudo-targets ŷ(f_i) with noise W(f_i)⁻¹ (Prop. A.1, Eqs. 6–7);
each is solved approximately by IterGP (Alg. 2, :mod:`gpscale.methods.iterncgp.solver`) started
from the recycled belief of the previous steps (Alg. 3). The posterior after Newton step i and
inner iteration j is GP(m_{i,j}, K_{i,j}) with (Eqs. 8–9)

    m_{i,j}(·) = m + K(·, X) v_j,    K_{i,j}(·, ·) = K(·, ·) − K(·, X) C_j K(X, ·),

whose variance holds the Laplace (mathematical) and the computational uncertainty (§3.3).

Cost: one K-product per inner iteration, O(n² L) with a dense kernel (matrix-free through
:func:`~gpscale.kernels.kernel_matmul`, a shared kernel serves all L latents in one product);
O(B n L) per iteration for the buffers; Alg. 3 O(B² n L + B³) and no K-product. Memory
O(B n L) for S, T (B ≤ R + j_max with compression, the total iteration count without); the NC × NC
matrices K, K̂, W are never formed. Prediction at t points: O(t n L (1 + B)).

Deviations from the paper, each deliberate:

- K v and f_{i+1} − m = K v are read from the buffers (K v = T a with v = S a), so an inner
  iteration costs one K-product instead of Alg. 2's two and an outer step none instead of
  Alg. 1's one; the arithmetic is the same.
- Actions are normalised to unit length (C_j and v_j do not depend on their scale).
- Alg. 3 drops eigenpairs of M below ``Recycling.eig_rtol`` · λ_max (numerically dependent
  actions, whose Λ^{-1/2} would blow up); the η guard is relative (``Stopping.eta_rtol``); an
  action rejected by it is not buffered.
- Softmax uses W† (Lemma A.7), as the paper does: with a shared kernel the Newton iterates are
  exact Newton on Ψ, but the predictive variance lacks the class-sum direction (notes §7.4),
  which the probit probabilities feel slightly; with one kernel per class the fixed point is not
  the MAP of Ψ (notes §7.4, §14.10).
- A backtracking line search on Ψ (``line_search=True``, default) scales a Newton step that
  would lower Ψ: with truncated inner solves the full steps of Alg. 1 can diverge (seen on
  MNIST, 2,000 points, j ≤ 5); Ψ = log p(y | f) − ½ vᵀ(f − m) costs no K-product. The final
  mean uses the damped v, so m + K(X, X) v = f. When no step size helps, the step is rejected
  and the same regression problem is solved further (j_max more iterations on the same belief,
  no virtual run since W is unchanged). The factory's search starts from a step capped to move
  no latent value by more than ``max_step`` (4: a trust radius). ``line_search=False`` is Alg. 1.
- Unit-vector actions with recycling continue with new data points (the action index counts
  all actions taken), so buffered and new actions stay independent (notes §14.12).
- Poisson rates are the closed-form log-normal mean exp(m + v/2) rather than a Monte Carlo one.
- Kernel hyperparameters are fixed in the paper (§5.2, from a short SVGP fit, §C.4). Beyond
  it, the factory's defaults refine the Laplace posterior to a variational one
  (:mod:`gpscale.methods.iterncgp.variational`; ``inference="laplace"``: the paper) and learn
  the kernel on its ELBO (:mod:`gpscale.training.laplace`; ``learn_kernel=False``: fixed).
  The class itself defaults to the paper (no refinement, fixed kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar

import torch
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.errors import NumericalError
from gpscale.likelihoods import Likelihood, Softmax
from gpscale.linalg.policies.unit_vector import UnitVectorPolicy
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.iterncgp.composed import check_backend
from gpscale.methods.iterncgp.evidence import KERNEL_LEARNING_OPTIONS, KernelLearning
from gpscale.methods.iterncgp.latent import (
    LAPLACE_PRIOR_OPTIONS,
    PREFIT_OPTIONS,
    TASKS,
    LatentKernel,
    PredictiveOptions,
    latent_moments,
    latent_predictive,
    prior_setup,
    resolve_options,
)
from gpscale.methods.iterncgp.learning import KernelLearningMixin
from gpscale.methods.iterncgp.newton import (
    MAX_ITERATIONS,
    MAX_STEP,
    NEWTON_OPTIONS,
    newton_step_size,
    relative_change,
)
from gpscale.methods.iterncgp.pipeline import PIPELINE
from gpscale.methods.iterncgp.sod_laplace import SoDLaplace, SoDLaplaceState, build_sod_laplace
from gpscale.methods.iterncgp.solver import (
    Belief,
    IterativeResidualPolicy,
    IterNCGPState,
    NewtonStep,
    PreconditionedResidualPolicy,
    Recycling,
    RegressionProblem,
    Stopping,
    empty_belief,
    solve,
    virtual_solver_run,
    warn_unconverged,
)
from gpscale.methods.iterncgp.variational import VARIATIONAL_OPTIONS, Variational, refine
from gpscale.methods.options import KERNEL_PRODUCT_OPTIONS, Option
from gpscale.methods.registry import MethodSpec, register
from gpscale.validation import check_x, check_xy

__all__ = [
    "IterNCGP", "IterNCGPState", "NewtonStep", "POLICIES", "PredictiveOptions", "Recycling",
    "IterativeResidualPolicy", "PreconditionedResidualPolicy", "SoDLaplace", "SoDLaplaceState",
    "Stopping", "UnitVectorPolicy", "Variational",
    "build_iterncgp", "build_sod_laplace",
]

POLICIES = {
    "cg": lambda seed: IterativeResidualPolicy(),
    "pcg": lambda seed: PreconditionedResidualPolicy(),
    "chol": lambda seed: UnitVectorPolicy(seed=seed),
    "unit-vector": lambda seed: UnitVectorPolicy(seed=seed),
}
"""Policy names of the factory: ``cg`` (residual actions, IterNCGP-CG), ``pcg`` (residuals
preconditioned by the likelihood's W, beyond the paper: :class:`PreconditionedResidualPolicy`)
and ``chol`` (alias ``unit-vector``: unit vectors in a random order seeded by ``seed``,
IterNCGP-Chol)."""


class IterNCGP(KernelLearningMixin, Method):
    """IterNCGP: Newton/Laplace with IterGP inner solves, recycling and compression.

    Args:
        kernel: GPyTorch kernel; batch shape () shares it across the L latent GPs, (L,) gives one
            per GP. Its hyperparameters are frozen; only kernel learning
            (:mod:`gpscale.training.laplace`) changes them, between conditionings.
        likelihood: a :class:`~gpscale.likelihoods.Likelihood` (Bernoulli, Softmax, Poisson,
            Gaussian).
        policy: maps a :class:`~gpscale.linalg.solvers.SolverStep` to the next action
            (:class:`IterativeResidualPolicy`: IterNCGP-CG; :class:`UnitVectorPolicy`:
            IterNCGP-Chol).
        recycling: :class:`Recycling` (on by default, no compression).
        stopping: :class:`Stopping` (δ = 1 %, δ_abs = δ_rel = 1e-5, j_max = 5).
        predictive: :class:`~gpscale.methods.iterncgp.latent.PredictiveOptions`.
        prior_mean: constant prior mean m.
        line_search: backtrack along each Newton step until Ψ does not decrease (a safeguard
            the paper does not use; ``False`` takes the full steps of Alg. 1).
        max_step: with the line search, the trust radius: a step moves no latent value by more
            than this (:func:`~gpscale.methods.iterncgp.newton.newton_step_size`); ``None``
            (here the default; the factory's is :data:`MAX_STEP`) bounds nothing.
        chunk_size, backend: of the kernel products (:func:`~gpscale.kernels.kernel_matmul`).
        options: resolved factory options (stored as ``self.options``).

    Example:
        >>> import torch
        >>> from gpscale.kernels import make_kernel
        >>> from gpscale.likelihoods import Bernoulli
        >>> x = torch.randn(30, 2, dtype=torch.float64); y = (x[:, 0] > 0).long()
        >>> model = IterNCGP(make_kernel("rbf", 2).double(), Bernoulli())
        >>> model.predict(model.condition(x, y), x[:3]).probs.shape
        torch.Size([3, 2])
    """

    key = "iterncgp"
    minibatch = False
    needs_data_for_prediction = True
    trainable: ClassVar[bool] = False

    def __init__(self, kernel, likelihood: Likelihood, policy=None,
                 recycling: Recycling | None = None, stopping: Stopping | None = None,
                 predictive: PredictiveOptions | None = None, *, prior_mean: float = 0.0,
                 line_search: bool = True, max_step: float | None = None,
                 kernel_learning: KernelLearning | None = None,
                 variational: Variational | None = None, chunk_size: int | None = None,
                 backend: str = "auto", options: dict[str, Any] | None = None):
        task = likelihood.task
        num_classes = {"classification": max(2, likelihood.num_latents)}.get(task)
        super().__init__(task=task, num_classes=num_classes, options=options)
        self.kernel = kernel.requires_grad_(False)
        self.likelihood = likelihood
        self.latent_kernel = LatentKernel(kernel, likelihood.num_latents, chunk_size, backend)
        self.policy = policy if policy is not None else IterativeResidualPolicy()
        self.recycling = recycling or Recycling()
        self.stopping = stopping or Stopping()
        self.predictive = predictive or PredictiveOptions()
        self.prior_mean = float(prior_mean)
        self.line_search = bool(line_search)
        if max_step is not None and not max_step > 0:
            raise ValueError(f"max_step must be > 0 or None; got {max_step}")
        self.max_step = max_step
        self.kernel_learning = kernel_learning or KernelLearning(enabled=False)
        self.variational = variational or Variational(enabled=False)

    @property
    def learns_kernel(self) -> bool:
        """Whether training learns the kernel hyperparameters (:mod:`gpscale.training.laplace`)."""
        return self.kernel_learning.enabled

    # -- conditioning: Algorithm 1 -----------------------------------------------------------
    def condition(self, x: Tensor, y: Tensor, *,
                  on_step: Callable[[IterNCGPState], None] | None = None) -> IterNCGPState:
        """Alg. 1: Newton steps as GP regressions solved by IterGP; never mutates the module.

        Args:
            x: (n, d) training inputs.
            y: (n,) labels 0..C−1 (classification) or counts (Poisson) or targets (Gaussian).
            on_step: called with the state after each Newton step (e.g. a benchmark's test
                metrics against time).

        Returns:
            The state: final iterate f (L, n), representer weights v (L, n), precision root Q
            (L, n, B'), buffers S, T (L, n, B) and the per-Newton-step trace.

        Raises:
            ValueError: NaN/inf, shape mismatch, wrong feature count, labels outside 0..C−1,
                negative or non-integer counts.
        Warns:
            ConvergenceWarning: the steps ran out before the mean's change fell to outer_rtol.
        """
        check_x(x, num_dims=getattr(self, "num_dims", None))
        check_xy(x, y, task=self.task, num_classes=self.num_classes)
        m = x.new_full((self.likelihood.num_latents, x.shape[0]), self.prior_mean)  # line 2
        state = self.refine(self.newton(x, y, m.clone(), torch.zeros_like(m), empty_belief(m),
                                        on_step=on_step))  # f_0 = m = m + K v_0, S, T empty
        warn_unconverged(state, self.stopping.outer_rtol)
        return state

    def refine(self, state: IterNCGPState) -> IterNCGPState:
        """The variational refinement of a Laplace ``state`` (``variational.enabled``; else the
        state itself): :mod:`gpscale.methods.iterncgp.variational`."""
        if not self.variational.enabled:
            return state
        return refine(self, state.x, state.y, state, self.latent_kernel.training_matmul(state.x))

    def warm_start(self, state: IterNCGPState) -> tuple[Tensor, Tensor, Belief]:
        """(f, v, belief) to restart Newton from ``state`` under the current kernel.

        After a change of the kernel hyperparameters the representer weights v and the actions
        S are kept, and f = m + K v and T = K S are recomputed in one product with the new K
        (the buffers of Alg. 3 must hold T = K S for the current K).
        """
        KV = self.latent_kernel.matmul(state.x, state.x,
                                       torch.cat([state.v[..., None], state.S], -1))
        f = self.prior_mean + KV[..., 0]
        belief = replace(empty_belief(f, state.S.shape[-1]), S=state.S, T=KV[..., 1:])
        return f, state.v, belief

    def newton(self, x: Tensor, y: Tensor, f: Tensor, v: Tensor, belief: Belief, *,
               on_step: Callable[[IterNCGPState], None] | None = None) -> IterNCGPState:
        """Alg. 1 from the iterate f = m + K v and the buffered actions of ``belief`` (S, T = K S);
        :meth:`condition` starts from f = m, v = 0 and no actions, :meth:`warm_start` from an
        earlier state. Inputs are not checked here."""
        lik, stop = self.likelihood, self.stopping
        m = x.new_full((lik.num_latents, x.shape[0]), self.prior_mean)
        trace: list[NewtonStep] = []
        converged = False
        step = 1.0
        K_matmul = self.latent_kernel.training_matmul(x)  # dense K held for the call if it fits
        for i in range(stop.max_newton_steps):  # line 5
            if step > 0.0:
                problem = self.regression_problem(x, y, f, K_matmul)  # lines 6–7
                belief = (virtual_solver_run(belief, problem, self.recycling)
                          if self.recycling.enabled else empty_belief(m))  # Alg. 2 lines 2–3
            else:  # rejected step: f and the problem are unchanged, solve on (j_max more)
                belief = replace(belief, iteration=0, stopped=None)
            belief = solve(problem, belief, self.policy, stop)  # Alg. 2 lines 4–16
            # line 9: f_{i+1} = K v_j + m, with K v_j = T a (no K-product)
            step = (self._line_search(y, m, f, v, m + belief.Kv, belief.v) if self.line_search
                    else 1.0)
            f_next, v = f + step * (m + belief.Kv - f), v + step * (belief.v - v)
            change = relative_change(f_next - m, f - m)
            trace.append(NewtonStep(i, belief.iteration, str(belief.stopped),
                                    float(belief.residual.norm()), change, belief.rank, step,
                                    float(self._log_joint(y, m, f_next, v))))
            f = f_next
            if on_step is not None:
                on_step(IterNCGPState(x, y, f, v, belief.Q, belief.S, belief.T,
                                                 tuple(trace), False))
            if not bool(torch.isfinite(f).all()):
                raise NumericalError(
                    f"IterNCGP's Newton iterate {i + 1} is not finite (the full Newton steps "
                    "diverged); use line_search=True, more inner iterations (max_iterations), "
                    "float64, or check the kernel hyperparameters")
            if step == 0.0 and belief.stopped != "max_iterations":
                break  # the solve cannot improve (converged, η floor, no action): stalled
            if step > 0.0 and change <= stop.outer_rtol:
                converged = True
                break
        return IterNCGPState(x, y, f, v, belief.Q, belief.S, belief.T, tuple(trace), converged)

    def _log_joint(self, y: Tensor, m: Tensor, f: Tensor, v: Tensor) -> Tensor:
        """Ψ(f) + const = Σ log p(y | f) − ½ vᵀ(f − m) for f = m + K v (Eq. 2)."""
        return self.likelihood.log_prob(f, y).sum() - 0.5 * (v * (f - m)).sum()

    def _line_search(self, y: Tensor, m: Tensor, f: Tensor, v: Tensor, f_new: Tensor,
                     v_new: Tensor) -> float:
        """The step size along f_new − f (:func:`newton_step_size`; Ψ costs no K-product)."""
        return newton_step_size(
            lambda alpha: self._log_joint(y, m, f + alpha * (f_new - f), v + alpha * (v_new - v)),
            float((f_new - f).abs().max()), self.max_step)

    def regression_problem(self, x: Tensor, y: Tensor, f: Tensor,
                           K_matmul: Callable[[Tensor], Tensor] | None = None
                           ) -> RegressionProblem:
        """The GP regression problem of the Newton step at f (Alg. 1, lines 6–7; Prop. A.1).

        b = ŷ(f) − m, ŷ(f) = f + W(f)⁻¹ ∇log p(y | f); K̂ = K + W(f)⁻¹; K_matmul: V ↦ K(x, x) V."""
        lik = self.likelihood
        y_hat = f + lik.W_inv_matmul(f, lik.gradient(f, y))  # line 7, (L, n)
        K_matmul = K_matmul or partial(self.latent_kernel.matmul, x, x)
        return RegressionProblem(y_hat - self.prior_mean, K_matmul,
                                 partial(lik.W_inv_matmul, f), partial(lik.W_matmul, f))

    # -- loss: negative log joint at the approximate mode ------------------------------------
    def log_lik(self, state: IterNCGPState) -> Tensor:
        """(1/n) Σ log p(y_n | f_n) at the final iterate."""
        return self.likelihood.log_prob(state.f, state.y).mean()

    def prior_term(self, state: IterNCGPState) -> Tensor:
        """(1/2n) (f − m)ᵀ K⁻¹ (f − m) = (1/2n) vᵀ (f − m), since f − m = K v."""
        return 0.5 * (state.v * (state.f - self.prior_mean)).sum() / state.f.shape[-1]

    def loss(self, state: IterNCGPState) -> Tensor:
        """−Ψ(f)/n up to a constant: prior_term − log_lik (nothing here is trainable)."""
        return self.prior_term(state) - self.log_lik(state)

    # -- prediction: Eqs. 8–9 ----------------------------------------------------------------
    def latent_marginals(self, state: IterNCGPState, x_test: Tensor) -> tuple[Tensor, Tensor]:
        """m_{i,j}(x⋄) and diag K_{i,j}(x⋄, x⋄) (Eqs. 8–9), each (L, t)."""
        mean, var, _ = self._latent_moments(state, x_test, joint=False)
        return mean, var

    def latent_covariance(self, state: IterNCGPState, x_test: Tensor) -> Tensor:
        """The L × L latent covariance at each test point (t, L, L): Eq. 9 in full (Q is joint
        over the latents, see :func:`~gpscale.methods.iterncgp.latent.latent_moments`)."""
        return self._latent_moments(state, x_test, joint=True)[2]

    def _latent_moments(self, state: IterNCGPState, x_test: Tensor, *, joint: bool
                        ) -> tuple[Tensor, Tensor, Tensor | None]:
        return latent_moments(self.latent_kernel, state.x, state.v, state.Q, x_test,
                              self.prior_mean, joint=joint)

    def predict(self, state: IterNCGPState, x_test: Tensor, chunk_size: int = 4096
                ) -> Predictive:
        """Marginal predictive at ``x_test`` (t, d), ``chunk_size`` test points at a time.

        Returns:
            Latent mean and variance ((t,), or (t, C) for softmax) from Eqs. 8–9, with class
            probabilities (t, C) (t, 2 for Bernoulli), the Poisson rate (t,), or the Gaussian
            noise.
        """
        check_x(x_test, num_dims=state.x.shape[1], name="x_test")

        joint = isinstance(self.likelihood, Softmax)  # correlated latents (latent_covariance)

        def chunk(xc: Tensor) -> Predictive:
            mean, var, cov = self._latent_moments(state, xc, joint=joint)
            return latent_predictive(self.likelihood, mean, var, self.predictive, cov)

        return predict_in_chunks(chunk, x_test, chunk_size)

    def extra_repr(self) -> str:
        return (f"likelihood={self.likelihood}, policy={self.policy}, "
                f"recycling={self.recycling}, stopping={self.stopping}")


def build_iterncgp(num_dims: int, *, task: str = "classification", num_classes: int | None = None,
                   init: tuple[Tensor, Tensor] | None = None, policy: str = "auto",
                   max_iterations: int = MAX_ITERATIONS, max_newton_steps: int = 100,
                   outer_rtol: float = 0.01, atol: float = 1e-5, rtol: float = 1e-5,
                   recycle: bool = True, compression_rank: int | None = None,
                   kernel: str = "matern32", ard: bool | None = None, lengthscale: Any = None,
                   outputscale: Any = None, shared_kernel: bool = True,
                   prior_mean: float = 0.0, line_search: bool = True,
                   max_step: float | None = MAX_STEP, probs: str = "probit",
                   num_samples: int = 1000, seed: int = 0, chunk_size: int | None = None,
                   backend: str = "auto", learn_kernel: bool = True, kernel_rounds: int = 10,
                   kernel_steps: int = 10, evidence_rank: int | None = None,
                   kernel_rtol: float = 0.01, kernel_objective: str = "auto",
                   learn_points: int | None = None,
                   inference: str = "variational", vi_steps: int = 10, vi_samples: int = 64,
                   prefit_steps: int = 100, prefit_num_inducing: int = 64,
                   prefit_lr: float = 0.05, prefit_batch_size: int = 1024) -> IterNCGP:
    """Factory of ``iterncgp`` (see :mod:`gpscale.methods.registry`).

    Args:
        num_dims: input dimension d.
        task: ``"classification"`` (C = 2: Bernoulli-logit, C > 2: softmax) or ``"counts"``
            (Poisson).
        num_classes: C; inferred from ``init`` labels (max + 1, at least 2) when ``None``.
        init: training data for the hyperparameter pre-fit and label checks, or ``None``.
        policy: ``"cg"``, ``"pcg"`` or ``"chol"`` (:data:`POLICIES`), or ``"auto"``: ``pcg``
            for the softmax likelihood (C > 2), where the residual policy stalls once W⁻¹ of
            saturated points dominates K̂ (MNIST with fitted hyperparameters, BENCHMARKS.md),
            ``cg`` (the paper's IterNCGP-CG) otherwise.
        max_iterations, max_newton_steps, outer_rtol, atol, rtol: :class:`Stopping`.
        recycle, compression_rank: :class:`Recycling` (``enabled``, ``rank``).
        kernel, ard, lengthscale, outputscale: the prior kernel, a name (``ard=None``: one
            lengthscale per input up to :data:`ARD_MAX_DIMS` inputs) or an expression (module
            ``composed``); missing hyperparameters of a name come from an SVGP pre-fit on
            ``init`` (``prefit_*``: Adam steps, rounded up to whole
            epochs; inducing points per class; learning rate; batch size).
        shared_kernel: one kernel for all C latent GPs, else a batch of C kernels (the SVGP
            pre-fit then keeps its per-class values; given values may be per-class lists).
        prior_mean: constant prior mean.
        line_search, max_step: backtracking on Ψ along each Newton step, from a step that moves
            no latent value by more than ``max_step`` (see :class:`IterNCGP`).
        probs, num_samples: class probabilities by ``"probit"`` or ``"mc"``
            (:class:`~gpscale.methods.iterncgp.latent.PredictiveOptions`).
        seed: seeds the ``chol`` order, the pre-fit and Monte Carlo probabilities.
        chunk_size, backend: of the kernel products.
        learn_kernel: with ``kernel_rounds``, ``kernel_steps``, ``evidence_rank``,
            ``kernel_rtol``, ``kernel_objective`` and ``learn_points``, training learns the kernel
            hyperparameters (the default; by ``gpscale fit`` starting from the median distance
            for classification),
            on the evidence lower bound of the variational posterior (:class:`KernelLearning`:
            rounds, L-BFGS iterations per round, actions of the objective, tolerance,
            objective, points); ``learn_kernel=False`` keeps them fixed, as the paper.
        inference, vi_steps, vi_samples: the variational refinement of the Laplace posterior
            (the default) or the paper's Laplace posterior (:class:`Variational`;
            docs/iterncgp_evidence.md §7).

    Raises:
        ValueError: unsupported task or policy, invalid options or ``init`` data.
    """
    if policy not in POLICIES and policy != "auto":
        raise ValueError(f"unknown policy {policy!r}; valid policies: auto, "
                         f"{', '.join(POLICIES)}")
    check_backend(kernel, backend)
    prior = prior_setup("iterncgp", num_dims, task=task, num_classes=num_classes, init=init,
                        kernel=kernel, ard=ard, shared=shared_kernel, lengthscale=lengthscale,
                        outputscale=outputscale, seed=seed, prefit_steps=prefit_steps,
                        prefit_num_inducing=prefit_num_inducing, prefit_lr=prefit_lr,
                        prefit_batch_size=prefit_batch_size)
    if policy == "auto":  # the residual policy stalls on softmax (saturated W⁻¹), see AUTO_POLICY
        policy = "pcg" if isinstance(prior.likelihood, Softmax) else "cg"
    stopping = Stopping(outer_rtol, max_newton_steps, atol, rtol, max_iterations)
    recycling = Recycling(recycle, compression_rank)
    learning = KernelLearning(learn_kernel, kernel_rounds, kernel_steps, evidence_rank,
                              kernel_rtol, kernel_objective, learn_points)
    if inference not in ("variational", "laplace"):
        raise ValueError(f"unknown inference {inference!r}; valid: variational, laplace")
    variational = Variational(inference == "variational", vi_steps, vi_samples, seed)
    predictive = PredictiveOptions(probs, num_samples, seed)
    options = resolve_options(
        policy=policy, max_iterations=max_iterations, max_newton_steps=max_newton_steps,
        outer_rtol=outer_rtol, atol=atol, rtol=rtol, recycle=recycle,
        compression_rank=compression_rank, kernel=kernel, ard=prior.ard,
        lengthscale=prior.lengthscale, outputscale=prior.outputscale,
        shared_kernel=shared_kernel, prior_mean=prior_mean, line_search=line_search,
        max_step=max_step, probs=probs, num_samples=num_samples, seed=seed, chunk_size=chunk_size,
        backend=backend, learn_kernel=learn_kernel, kernel_rounds=kernel_rounds,
        kernel_steps=kernel_steps, evidence_rank=evidence_rank, kernel_rtol=kernel_rtol,
        kernel_objective=kernel_objective, learn_points=learn_points, inference=inference,
        vi_steps=vi_steps, vi_samples=vi_samples, **prior.prefit_options)
    model = IterNCGP(prior.kernel, prior.likelihood, POLICIES[policy](seed), recycling,
                     stopping, predictive, prior_mean=prior_mean, line_search=line_search,
                     max_step=max_step, kernel_learning=learning, variational=variational,
                     chunk_size=chunk_size, backend=backend,
                     options=options)
    return model if init is None else model.to(device=init[0].device, dtype=init[0].dtype)


register(MethodSpec(
    key="iterncgp",
    factory=build_iterncgp,
    tasks=TASKS,
    summary="IterNCGP: computation-aware Laplace (Newton + IterGP), recycling, compression",
    **PIPELINE["iterncgp"],
    options=(
        Option("policy", "str", "auto", "IterGP action policy: residuals (cg), "
               "W-preconditioned residuals (pcg), unit vectors (chol); auto: pcg for more "
               "than two classes, else cg", choices=("auto", *POLICIES)),
        *NEWTON_OPTIONS,
        *LAPLACE_PRIOR_OPTIONS,
        *KERNEL_LEARNING_OPTIONS,
        *VARIATIONAL_OPTIONS,
        *KERNEL_PRODUCT_OPTIONS,
        *PREFIT_OPTIONS,
    ),
))
