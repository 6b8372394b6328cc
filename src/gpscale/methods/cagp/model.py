r"""``cagp-opt``, ``cagp-cg``: computation-aware GP regression with ELBO model selection.

Wenger, Wu, Hennig, Gardner, Pleiss & Cunningham (2024), "Computation-Aware Gaussian Processes:
Model Selection And Linear-Time Inference", NeurIPS 2024, arXiv:2411.01036 (notes/001_cagp.md).

=========  ===========================  =====================================================
symbol     variable                     meaning
=========  ===========================  =====================================================
X, y       ``x``, ``y``                 (n, d) training inputs, (n,) targets
μ, r       ``mean``, ``residual``       prior mean, r = y − μ(X)
K, σ²      ``kernel``, ``noise``        prior covariance, Gaussian noise variance; K̂ = K + σ²I
S          ``actions``                  (n, i) actions (block-sparse or dense)
Z          ``K_S``                      K S (n, i)
G_K, G     ``gram_K``, ``cholesky``     SᵀKS and L = chol(G), G = SᵀK̂S = G_K + σ² SᵀS
D          ``gram_actions``             SᵀS (diagonal for block-sparse S)
ṽ          ``repr_weights_proj``        G⁻¹ Sᵀ r, projected representer weights
=========  ===========================  =====================================================

Implemented: the posterior Eq. (5) / Alg. S2 (``condition``, ``predict``) and Alg. S1
(:func:`~gpscale.methods.cagp.cg.iterative_posterior`); the ELBO Eq. (10)–(11) as
``kl − expected_log_lik`` (Lemma S3) and the projected-data NLL Eq. (9)
(``objective='projected_nll'``, an ablation only).
μ_i(x) = μ(x) + K(x, X) S ṽ, K_i(x, x) = K(x, x) − ‖L⁻¹ SᵀK(X, x)‖², predictive noise σ².

Numerics: the i × i matrices G_K, SᵀS, G, their Cholesky factor and solves are float64
(:func:`~gpscale.linalg.ops.upcast`) whatever the training dtype; Z and the n-vectors stay in it.
Σ_j K_i(x_j, x_j) = Σ_j K_jj − tr(G⁻¹ ZᵀZ) needs only i × i work after one ZᵀZ, which is
formed in float64 too (O(n i²), :func:`~gpscale.linalg.ops.gram64`, its backward as well): the
difference cancels and is divided by σ², so a float32 ZᵀZ moves the float32 loss by ~1e-4 per
datum on a 200-point problem, float64 by ~1e-6.
When SᵀK̂S from float32 products is not positive definite (σ² near its floor of 1e-4 with a
short lengthscale: K's float32 errors, summed over a block of actions, exceed σ² ‖s_j‖²),
``condition`` warns and recomputes K S from float64 inputs and actions (the state's ``K_S`` is
then float64); the parameters, the loss and the optimiser stay in the training dtype.

Cost per loss: CaGP-Opt about n²/2 kernel evaluations for K S (the symmetric block-sparse
product, each off-diagonal pair once) and as many in its backward (on the CPU the native row
kernels of :mod:`gpscale.linalg.native`, one pass doing all of a pair's work; elsewhere
compiled tiles, which evaluate each backward tile twice), no n × n tensor, + O(n i² + i³);
CaGP-CG i CG products with K̂ plus K S, O(n² i). Memory O(n i), except CaGP-CG's cached
K(X, X) and its actions refreshed every ``refresh_every`` steps (:mod:`gpscale.methods.cagp.cg`).

Deviations and choices (the paper is silent unless stated):

- The loss is divided by n (per datum), as in the authors' code; ``projected_nll`` likewise.
- log det SᵀS = Σ_j log ‖s'_j‖² for block-sparse S, as Eq. (11) states: invariant to rescaling
  an action. The authors' code takes log Σ_j ‖s'_j‖², which is not (notes/001 §8.3).
- i ∤ n: blocks of ⌊n/i⌋ and ⌊n/i⌋ + 1 points cover all n (the code truncates the data).
- Blocks are cells of the inputs by default (``blocks='local'``; the code: random subsets).
- With ``calibrate='heldout'`` a tenth of the rows (at most 2,000) is held out of the actions
  and the ELBO, to calibrate the intervals on (:mod:`gpscale.methods.cagp.calibration`).
- Above 10,000 points the prior starts from an exact GP on 2,000 points (`training.prefit`), and
  the actions from its kernel's block eigenvectors, trained at a share of the capped rate.
- CG actions carry no gradient and are re-orthonormalised (:mod:`gpscale.linalg.policies.residual`).
- The prior mean is GPyTorch's learned constant (the paper: zero mean), like the baselines.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gpytorch
import torch
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.errors import NumericalError
from gpscale.kernels import kernel_diag, kernel_matrix
from gpscale.linalg.operators.block_sparse import BlockLayout
from gpscale.linalg.ops import Matmul, gram64, upcast
from gpscale.linalg.policies.block_sparse import (
    ACTION_INITS,
    BLOCK_ASSIGNMENTS,
    LearnedBlockSparsePolicy,
    initial_values,
    local_assignment,
    resolve_action_init,
)
from gpscale.linalg.policies.residual import ResidualPolicy
from gpscale.methods._common import (
    HeldOutNoise,
    check_task_and_init,
    default_size,
    follow_init,
    gaussian_likelihood,
    pop_prefit_options,
    prior_modules,
    prior_options,
)
from gpscale.methods.base import Method, ShardPlan, as_dtype, predict_in_chunks
from gpscale.methods.cagp import calibration
from gpscale.methods.cagp.actions import action_gram, grown_actions, kernel_times, upcast_actions
from gpscale.methods.cagp.cg import KernelOperator, cg_action_cap, recycling_loss
from gpscale.methods.cagp.pipeline import PIPELINE, default_num_actions
from gpscale.methods.cagp.sharded import sharded_plan
from gpscale.methods.cagp.state import CaGPState, gram_cholesky, trace_solve, warn_float64_fallback
from gpscale.methods.options import KERNEL_PRODUCT_OPTIONS, PREFIT_OPTIONS, PRIOR_OPTIONS, Option
from gpscale.methods.registry import MethodSpec, register
from gpscale.validation import check_num_points, check_x, check_xy

__all__ = ["OBJECTIVES", "CaGP", "build_cagp_cg", "build_cagp_opt", "action_gram", "kernel_times"]

OBJECTIVES = ("elbo", "projected_nll")


def _num_actions(given: int | None, num_train: int) -> int:
    """CaGP-Opt's number of actions on ``num_train`` rows: ``given``, else its default."""
    return default_num_actions(num_train) if given is None else int(given)


PREFIT_ACTION_LR_SCALE = 0.3
"""CaGP-Opt's actions train at this share of the rate from a pre-fitted start: made from the
pre-fitted kernel (``action_init='auto'``), they are part of the start the rate's cap keeps."""

REFRESH_EVERY = 4
"""CaGP-CG's default ``refresh_every`` (see :mod:`gpscale.methods.cagp.cg`)."""


class CaGP(HeldOutNoise, Method):
    """Computation-aware GP regression; the policy object chooses CaGP-Opt or CaGP-CG.

    Args:
        mean: GPyTorch mean μ.
        kernel: GPyTorch kernel K.
        likelihood: GPyTorch Gaussian likelihood (σ²).
        policy: ``policy(matmul, r) -> S``: a learned block-sparse policy (an ``nn.Module``
            whose parameters are the actions) or the CG residual policy.
        objective: ``'elbo'`` (Eq. 11) or ``'projected_nll'`` (Eq. 9, ablation).
        num_dims: input dimension d.
        chunk_size: rows per chunk of the matrix-free kernel products (None: their defaults).
        backend: kernel-product backend (:data:`gpscale.kernels.BACKENDS`).
        options: resolved factory options (stored as ``self.options``).

    Example:
        >>> import torch
        >>> from gpscale.methods import cagp
        >>> x = torch.randn(40, 2, dtype=torch.float64); y = x.sum(1)
        >>> model = cagp.build_cagp_opt(2, init=(x, y), num_actions=8)
        >>> model.predict(model.condition(x, y), x[:3]).mean.shape
        torch.Size([3])
    """

    key = "cagp"
    prefit_lr_scales = {"policy.": PREFIT_ACTION_LR_SCALE}  # CG actions are no parameters

    def __init__(self, mean: gpytorch.means.Mean, kernel: gpytorch.kernels.Kernel,
                 likelihood: gpytorch.likelihoods.GaussianLikelihood,
                 policy: Callable[[Matmul, Tensor], Any], *, objective: str = "elbo",
                 num_dims: int, chunk_size: int | None = None, backend: str = "auto",
                 options: dict[str, Any] | None = None):
        super().__init__(task="regression", options=options)
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
        self.mean, self.kernel, self.likelihood = mean, kernel, likelihood
        self.policy, self.objective, self.num_dims = policy, objective, num_dims
        self.chunk_size, self.backend = chunk_size, backend
        # CaGP-Opt's factors of the predictive's variance, fitted after training (.calibration)
        for name in ("variance_scale", "noise_scale"):
            self.register_buffer(name, torch.ones((), dtype=torch.float64))
        self.register_load_state_dict_pre_hook(calibration.unit_scale_if_absent)

    @property
    def heldout_noise(self) -> bool:
        """CaGP-CG sets σ² on held-out rows after training (its ELBO lets σ² absorb what i
        actions leave unexplained). CaGP-Opt's learned actions belong to the rows they were
        learned on, so it trains on every row and keeps its ELBO's σ²."""
        return not isinstance(self.policy, LearnedBlockSparsePolicy)

    @property
    def finalize_reads_posterior(self) -> bool:  # the calibration only scales the predictive
        return self.rows_in_parameters and self.options.get("calibrate") == "heldout"

    def finalize(self, x: Tensor, y: Tensor, reduce: Callable[[Tensor], Tensor] | None = None,
                 held: Any = None, state: CaGPState | None = None) -> dict[str, Any] | None:
        """CaGP-Opt (``calibrate='heldout'``, one process): the predictive's factors fitted on
        the held-out rows (:mod:`~gpscale.methods.cagp.calibration`; ``state``: if handed)."""
        if not self.finalize_reads_posterior:
            return None
        return calibration.calibrate_scale(self, x, y, int(self.options.get("seed", 0)),
                                           sharded=reduce is not None, state=state)

    @property
    def rows_in_parameters(self) -> bool:
        """CaGP-Opt's learned actions are values on the training rows."""
        return isinstance(self.policy, LearnedBlockSparsePolicy)

    def warm_for_rows(self, trained: dict[str, Tensor], x: Tensor, kept: Tensor, added: Tensor,
                      options: dict[str, Any]) -> dict[str, Tensor] | None:
        """CaGP-Opt: the trained actions grown to every row of ``x``
        (:func:`~gpscale.methods.cagp.actions.grown_actions`), the hyperparameters as trained;
        ``None`` where the model on every row would have another number of actions (its
        default follows n; ``auto``'s race sizes it for every row, ``MethodSpec.row_sized``)."""
        if not self.rows_in_parameters:
            return super().warm_for_rows(trained, x, kept, added, options)
        layout = self.policy.layout
        if _num_actions(options.get("num_actions"), x.shape[0]) != layout.num_blocks:
            return None
        return grown_actions(trained, self.policy, x, kept, added,
                             hold=self.options.get("calibrate") == "heldout",
                             seed=int(self.options.get("seed", 0)))

    def condition(self, x: Tensor, y: Tensor, *, actions: Any = None) -> CaGPState:
        """Actions, K S, the float64 Gram factor and ṽ (Alg. S2 lines 1–5); differentiable.

        ``actions``: S to use instead of the policy's (e.g. CG actions of an earlier step,
        :meth:`training_loss`); the ELBO is a bound for any S.
        """
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        r = y.to(x.dtype) - self.mean(x)  # (n,)
        noise = self.noise
        S = self._policy_actions(x, r, noise) if actions is None else actions
        check_num_points(x.shape[0], S.shape[-1], "actions")
        try:
            Z, G_K, D, logdet_D, L = self._gram(x, S, noise)
        except NumericalError:
            if x.dtype == torch.float64:
                raise
            warn_float64_fallback(x.dtype)
            x, S = upcast(x), upcast_actions(S)
            Z, G_K, D, logdet_D, L = self._gram(x, S, noise)
        y_proj = upcast(S.mT @ r.to(x.dtype))  # line 2, ỹ = Sᵀ r (float64 after a fallback)
        v_proj = torch.cholesky_solve(y_proj[:, None], L)[:, 0]  # line 5
        fitted = self.policy.fitted_rows() if self.rows_in_parameters else None
        diag = upcast(kernel_diag(self.kernel, x))
        return CaGPState(x, S, r, Z, G_K, D, logdet_D, L, y_proj, v_proj, noise,
                         (diag if fitted is None else diag[fitted]).sum(), fitted)

    def _policy_actions(self, x: Tensor, r: Tensor, noise: Tensor):
        return self.policy(KernelOperator(self.kernel, x, noise, chunk_size=self.chunk_size,
                                          backend=self.backend), r)

    def actions_for(self, x: Tensor, y: Tensor):
        """The policy's actions S for (x, y) at the current hyperparameters."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        return self._policy_actions(x, y.to(x.dtype) - self.mean(x), self.noise)

    def training_loss(self, x: Tensor, y: Tensor) -> Callable[..., Tensor] | None:
        """The loss ``training.fit`` minimises on (x, y): CG actions are recycled for the
        policy's ``refresh_every`` steps (:func:`gpscale.methods.cagp.cg.recycling_loss`);
        ``None`` (fit's default loss) for learned actions, which are parameters."""
        every = getattr(self.policy, "refresh_every", None)
        return None if every is None else recycling_loss(self, x, y, every)

    def _gram(self, x: Tensor, S, noise: Tensor):
        """Z = K S (line 3), G_K = SᵀKS, SᵀS, its log det and L = chol(SᵀK̂S) (line 4)."""
        Z = kernel_times(S, self.kernel, x, None, self.chunk_size, self.backend)
        G_K = upcast(S.mT @ Z)  # (i, i) SᵀKS
        G_K = 0.5 * (G_K + G_K.mT)
        D, logdet_D = action_gram(S)
        # Below float64 the product's rounding may not be resolved against the noise (a pre-fitted
        # start with a small σ²: float32 errors in SᵀKS larger than σ²): jitter beyond a tenth
        # of the noise term would hide that, so it fails and condition() goes to float64.
        L = gram_cholesky(G_K, noise, D, x.dtype)
        return Z, G_K, D, logdet_D, L

    def resolves(self, x: Tensor, y: Tensor) -> bool:
        """Whether kernel products in ``x``'s dtype give a positive definite SᵀK̂S (jitter at
        most :data:`JITTER_NOISE_FRACTION` of the noise term) at the current hyperparameters;
        where not, :meth:`condition` recomputes them in float64."""
        with torch.no_grad():
            try:
                self._gram(x, self.actions_for(x, y), self.noise)
            except NumericalError:
                return False
        return True

    def shard_plan(self, x: Tensor, y: Tensor, *, start: int,
                   num_points: int) -> ShardPlan | None:
        """CaGP-Opt trains data-parallel on the ELBO assembled from per-rank pieces
        (:mod:`~gpscale.methods.cagp.sharded`); CaGP-CG has no such path (its CG actions are
        residuals of the whole system)."""
        if not isinstance(self.policy, LearnedBlockSparsePolicy):
            return None
        self.policy.held.zero_()  # several processes do not calibrate: every row trains
        return sharded_plan(self, x, y, start)

    def loss(self, state: CaGPState) -> Tensor:
        """The chosen objective per datum: ``negative_elbo`` or ``projected_nll``."""
        value = self.negative_elbo(state) if self.objective == "elbo" else \
            self.projected_nll(state)
        return as_dtype(value, state.residual)

    def negative_elbo(self, state: CaGPState) -> Tensor:
        """Eq. (11) / n: −E_q[log p(y | f)]/n + KL(q_i ‖ p)/n (Eq. 10, Lemma S3)."""
        return self.kl(state) - self.expected_log_lik(state)

    def expected_log_lik(self, state: CaGPState) -> Tensor:
        """E_q[log p(y | f)] / n = −[(‖y − μ_i(X)‖² + Σ_j K_i(x_j, x_j))/σ² + n log 2πσ²]/(2n)."""
        n = state.num_fitted  # the rows held out to calibrate on are not fitted
        error = state.fitted_only(state.residual - state.K_S @ as_dtype(state.repr_weights_proj,
                                                                        state.K_S))
        # float64 ZᵀZ: Σ K_jj − tr(G⁻¹ZᵀZ) cancels
        var_sum = state.prior_var_sum - trace_solve(state.cholesky,
                                                    gram64(state.K_S, state.fitted_weights))
        noise = upcast(state.noise)
        sq = upcast(error.square().sum())
        return -0.5 * ((sq + var_sum) / noise + n * torch.log(2 * math.pi * noise)) / n

    def kl(self, state: CaGPState) -> Tensor:
        """KL(q_i ‖ p) / n = [ṽᵀG_Kṽ − tr(G⁻¹G_K) + log det G − i log σ² − log det SᵀS]/(2n)."""
        n, i = state.num_fitted, state.num_actions
        v = state.repr_weights_proj
        logdet_G = 2 * state.cholesky.diagonal().log().sum()
        value = (v @ state.gram_K @ v - trace_solve(state.cholesky, state.gram_K) + logdet_G
                 - i * torch.log(upcast(state.noise)) - state.logdet_actions)
        return 0.5 * value / n

    def projected_nll(self, state: CaGPState) -> Tensor:
        """Eq. (9) / n: [ỹᵀG⁻¹ỹ + log det G − log det SᵀS + i log 2π] / (2n)."""
        n, i = state.num_fitted, state.num_actions
        logdet_G = 2 * state.cholesky.diagonal().log().sum()
        value = (state.y_proj @ state.repr_weights_proj + logdet_G - state.logdet_actions
                 + i * math.log(2 * math.pi))
        return 0.5 * value / n

    def predict(self, state: CaGPState, x_test: Tensor, chunk_size: int = 4096) -> Predictive:
        """μ_i, K_i(x, x) and σ² at ``x_test`` (t, d) in chunks (Alg. S2 lines 6–8)."""
        check_x(x_test, num_dims=self.num_dims, name="x_test")

        def chunk(xc: Tensor) -> Predictive:
            xk = xc.to(state.x.dtype)  # float64 when the products were promoted
            K_S = kernel_times(state.actions, self.kernel, state.x, xk, self.chunk_size,
                                self.backend)  # (t, i), line 6
            mean = self.mean(xk) + K_S @ as_dtype(state.repr_weights_proj, K_S)  # line 7
            W = torch.linalg.solve_triangular(state.cholesky, upcast(K_S).mT, upper=False)
            variance = kernel_diag(self.kernel, xk) - as_dtype(W.square().sum(0), K_S)  # line 8
            # Rounding can push K_i(x, x) ≥ 0 slightly below zero when it is nearly 0.
            variance = variance.clamp_min(0.0) * as_dtype(self.variance_scale, variance)
            noise = state.noise * as_dtype(self.noise_scale, state.noise)
            return Predictive(as_dtype(mean, xc), as_dtype(variance, xc), noise=noise)

        return predict_in_chunks(chunk, x_test, chunk_size)


def build_cagp_opt(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
                   init: tuple[Tensor, Tensor] | None = None, num_actions: int | None = None,
                   action_init: str = "auto", blocks: str = "local", calibrate: str = "heldout",
                   num_train: int | None = None, seed: int = 0, objective: str = "elbo",
                   chunk_size: int | None = None, backend: str = "auto", **prior: Any) -> CaGP:
    """Factory of ``cagp-opt``: learned block-sparse actions (see :mod:`gpscale.methods.registry`).

    Args:
        num_dims: input dimension d.
        task: must be ``"regression"``.
        num_classes: unused (regression).
        init: ``(x, y)``: initial hyperparameters and actions from the data; ``None`` allocates
            zero actions for ``num_train`` points, to be overwritten by ``load_state_dict``.
        num_actions: i.
        action_init: ``'auto'`` (``'eigen'`` where ``lengthscale`` is given or pre-fitted,
            else ``'random'``), ``'random'``, ``'targets'`` or ``'eigen'`` (``initial_values``).
        blocks: ``'local'`` (cells of the inputs, :func:`~gpscale.linalg.policies.block_sparse.
            local_assignment` of ``init``) or ``'random'`` (the authors' code: random subsets).
        calibrate: ``'heldout'`` (the predictive's latent variance and noise scaled by factors
            fitted after training on training rows held out of it,
            :mod:`gpscale.methods.cagp.calibration`) or ``'off'``.
        num_train: n; required when ``init`` is None, else taken from ``init``.
        seed: seeds the block assignment and the random action entries.
        objective: ``'elbo'`` or ``'projected_nll'``.
        chunk_size, backend: of the matrix-free kernel products.
        **prior: ``kernel`` (default matern32), ``ard``, ``lengthscale``, ``outputscale``,
            ``noise``, ``mean_constant`` (:func:`~gpscale.methods._common.prior_options`), and
            the ``prefit*`` options, recorded (the harness pre-fits: `training.prefit`).

    Raises:
        ValueError: for a task other than regression, invalid ``init`` data, fewer points than
            ``num_actions``, a ``num_train`` that contradicts ``init``, or unknown options.
    """
    check_task_and_init("cagp-opt", task, ("regression",), num_dims, init)
    for name, value, valid in (("action_init", action_init, ACTION_INITS),
                               ("blocks", blocks, BLOCK_ASSIGNMENTS),
                               ("calibrate", calibrate, calibration.CALIBRATIONS)):
        if value not in valid:
            raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")
    n = _num_train(init, num_train)
    num_actions = _num_actions(num_actions, n)
    check_num_points(n, num_actions, "actions")
    pre = pop_prefit_options(prior)
    how = resolve_action_init(action_init, prior.get("lengthscale") is not None)
    opts = prior_options(init, task, num_dims, **prior)
    mean, kernel = prior_modules(num_dims, opts)
    index = (local_assignment(init[0], BlockLayout(n, num_actions))
             if init is not None and blocks == "local" else None)
    policy = LearnedBlockSparsePolicy(n, num_actions, seed=seed, index=index)
    model = CaGP(mean, kernel, gaussian_likelihood(opts["noise"]), policy, objective=objective,
                 num_dims=num_dims, chunk_size=chunk_size, backend=backend,
                 options={"num_actions": num_actions, "action_init": action_init,
                          "blocks": blocks, "calibrate": calibrate, "num_train": n, "seed": seed,
                          "objective": objective, "chunk_size": chunk_size, "backend": backend,
                          **pre, **opts})
    model = follow_init(model, init)
    if init is not None:
        x, y = init
        with torch.no_grad():
            policy.values.copy_(initial_values(
                how, policy.layout, policy.index, y=y,
                block_kernel=lambda idx: kernel_matrix(model.kernel, x[idx], x[idx]),
                generator=torch.Generator().manual_seed(seed)))
    if calibrate == "heldout":
        calibration.hold_rows(policy, seed)
    return model


def build_cagp_cg(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
                  init: tuple[Tensor, Tensor] | None = None, num_actions: int | None = None,
                  rtol: float = 1e-4, refresh_every: int = REFRESH_EVERY,
                  objective: str = "elbo", chunk_size: int | None = None,
                  backend: str = "auto", **prior: Any) -> CaGP:
    """Factory of ``cagp-cg``: CG-residual actions (see :mod:`gpscale.methods.registry`).

    Args:
        num_dims: input dimension d.
        task: must be ``"regression"``.
        num_classes: unused (regression).
        init: ``(x, y)`` for data-dependent initial hyperparameters, or ``None`` to rebuild.
        num_actions: i, the most CG iterations (actions); default min(512, n/2,
            :func:`~gpscale.methods.cagp.cg.cg_action_cap` (n)).
        rtol: CG's relative residual tolerance (Table S1: 1e-4).
        refresh_every: training steps that share one set of CG actions (1: the paper's, new
            actions every step; see :mod:`gpscale.methods.cagp.cg`).
        objective: ``'elbo'`` or ``'projected_nll'``.
        chunk_size, backend: of the matrix-free kernel products.
        **prior: as for :func:`build_cagp_opt` (the ``prefit*`` options included).

    Raises:
        ValueError: for a task other than regression, invalid ``init`` data or fewer points
            than ``num_actions``.
    """
    check_task_and_init("cagp-cg", task, ("regression",), num_dims, init)
    pre = pop_prefit_options(prior)
    n = None if init is None else init[0].shape[0]
    num_actions = default_size(num_actions, n, cg_action_cap(n), 2, "num_actions")
    if init is not None:
        check_num_points(init[0].shape[0], num_actions, "actions")
    opts = prior_options(init, task, num_dims, **prior)
    mean, kernel = prior_modules(num_dims, opts)
    model = CaGP(mean, kernel, gaussian_likelihood(opts["noise"]),
                 ResidualPolicy(num_actions, rtol, refresh_every), objective=objective,
                 num_dims=num_dims, chunk_size=chunk_size, backend=backend,
                 options={"num_actions": num_actions, "rtol": rtol,
                          "refresh_every": refresh_every, "objective": objective,
                          "chunk_size": chunk_size, "backend": backend, **pre, **opts})
    return follow_init(model, init)


def _num_train(init: tuple[Tensor, Tensor] | None, num_train: int | None) -> int:
    if init is None and num_train is None:
        raise ValueError("cagp-opt needs num_train (the training points the actions belong to) "
                         "when init is None")
    if init is not None and num_train not in (None, init[0].shape[0]):
        raise ValueError(f"num_train={num_train} contradicts the {init[0].shape[0]} init points")
    return int(num_train if init is None else init[0].shape[0])


_NUM_ACTIONS = Option("num_actions", "int", None, "number of actions i (the posterior's rank); "
                      "none: n/2 up to 512, 1,024 from 32,000 rows", minimum=1)
_CG_NUM_ACTIONS = Option("num_actions", "int", None, "most CG actions i (the posterior's "
                         "rank); none: min(512, n/2, 2³⁷/n²)", minimum=1)
_OBJECTIVE = Option("objective", "str", "elbo", "training objective", choices=OBJECTIVES)

register(MethodSpec(
    key="cagp-opt",
    **PIPELINE["cagp-opt"],
    factory=build_cagp_opt,
    tasks=("regression",),
    summary="CaGP-Opt: computation-aware GP, learned block-sparse actions, ELBO (O(n²/2) per step)",
    options=(
        _NUM_ACTIONS,
        Option("action_init", "str", "auto", "initial action entries (auto: eigen where the "
               "hyperparameters are pre-fitted or given, else random)", choices=ACTION_INITS),
        Option("blocks", "str", "local", "an action's block: local (a cell of the inputs) or "
               "random (the paper's code)", choices=BLOCK_ASSIGNMENTS),
        Option("calibrate", "str", "heldout", "intervals: the latent variance and noise scaled "
               "by factors fitted on a tenth of the rows (at most 2,000) held out of training "
               "(heldout), or the ELBO's, as the paper (off)", choices=calibration.CALIBRATIONS),
        Option("seed", "int", 0, "seeds the block assignment and the random action entries"),
        _OBJECTIVE, *KERNEL_PRODUCT_OPTIONS, *PRIOR_OPTIONS, *PREFIT_OPTIONS,
        Option("num_train", "int", None, "number of training points n", minimum=1,
               hidden=True),
    ),
))

register(MethodSpec(
    key="cagp-cg",
    **PIPELINE["cagp-cg"],
    factory=build_cagp_cg,
    tasks=("regression",),
    summary="CaGP-CG: computation-aware GP, CG-residual actions, ELBO (O(n² i) per step)",
    options=(
        _CG_NUM_ACTIONS,
        Option("rtol", "float", 1e-4, "CG relative residual tolerance (Table S1)", minimum=0,
               exclusive=True),
        Option("refresh_every", "int", REFRESH_EVERY, "training steps that share one set of "
               "CG actions (1: new actions every step, as the paper)", minimum=1),
        _OBJECTIVE, *KERNEL_PRODUCT_OPTIONS, *PRIOR_OPTIONS, *PREFIT_OPTIONS,
    ),
))
