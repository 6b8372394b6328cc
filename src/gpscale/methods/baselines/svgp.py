r"""``svgp``: GPyTorch's stochastic variational GP (ApproximateGP + whitened VariationalStrategy).

Hensman, Fusi & Lawrence (2013), "Gaussian Processes for Big Data", arXiv:1309.6835 (regression);
Hensman, Matthews & Ghahramani (2015), "Scalable Variational Gaussian Process Classification",
arXiv:1411.2005 (classification); as implemented by GPyTorch.

=======  =========================  ===================================================
symbol   variable                   meaning
=======  =========================  ===================================================
x, y     ``state.x``, ``state.y``   (b, d) minibatch inputs, (b,) targets
N        ``num_data``               training-set size, scales the KL term
z        ``inducing_points``        (m, d) learned inducing inputs ((C, m, d) for C > 2)
q(v)     GPyTorch                   N(μ, LLᵀ) on whitened inducing values v (u = L_zz v)
C        ``num_classes``            2: one latent GP, probit Bernoulli; C > 2: C latent
                                    GPs, softmax without mixing weights
=======  =========================  ===================================================

Loss (negative ELBO per datum, Hensman 2013 Eq. 4 / 2015 Eq. 4; an unbiased minibatch estimate):
``kl`` − ``expected_log_lik`` with ``expected_log_lik`` :math:`= \tfrac1b\sum_j E_{q(f_j)}[\log
p(y_j \mid f_j)]` (analytic for the Gaussian, Gauss–Hermite for the probit, Monte Carlo with
``num_likelihood_samples`` for the softmax) and ``kl`` :math:`= \mathrm{KL}[q(v)\|N(0, I)]/N`.

Predictive: q(f_*) marginals; Gaussian regression adds ``noise`` σ²; binary probabilities are
GPyTorch's analytic probit marginal Φ(μ/√(1+s²)); softmax probabilities are a Monte Carlo
average over ``num_likelihood_samples`` draws ε (seeded with ``seed``) shared by every test
point, f = μ + σ ⊙ ε: a point's probabilities depend on its own marginals only, not on the
other points in the call, their order or the chunking. A test point beyond the kernel's reach of
every inducing point predicts the prior (mean constant, variance outputscale + jitter).

q(v) starts at the whitened prior N(0, I); inducing inputs at k-means centres of the ``init``
inputs. Cost per step: O(b m² + m³) time (C times for C > 2 classes), O(b m + m²) memory.
GPyTorch settings fixed inside every call: :meth:`SVGPSettings.context`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import gpytorch
import torch
from torch import Tensor

from gpscale.distributions import Predictive, concat
from gpscale.kernels import kernel_hyperparameters
from gpscale.linalg import reach
from gpscale.methods._common import (
    check_task_and_init,
    follow_init,
    gaussian_likelihood,
    gpytorch_mode,
    inducing_options,
    initial_inducing_points,
    prior_modules,
    prior_options,
    resolve_num_classes,
    translate_cholesky_errors,
)
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.baselines.exact import NEVER_CG
from gpscale.methods.baselines.optimal_q import kernel_statistics, optimal_noise, optimal_q
from gpscale.methods.baselines.pipeline import PIPELINE
from gpscale.methods.options import INDUCING_OPTIONS, PRIOR_OPTIONS, Option
from gpscale.methods.registry import MethodSpec, register
from gpscale.validation import check_x, check_xy

__all__ = ["SVGP", "SVGPSettings", "SVGPState", "build_svgp"]

TASKS = ("regression", "classification")


@dataclass(frozen=True)
class SVGPSettings:
    """GPyTorch settings of the SVGP baseline.

    Attributes:
        variational_jitter_float: jitter added to K_zz (and to k(x, x)) in float32.
        variational_jitter_double: the same in float64.
        num_likelihood_samples: Monte Carlo samples of the softmax likelihood (loss and probs).
    """

    variational_jitter_float: float = 1e-4
    variational_jitter_double: float = 1e-6
    num_likelihood_samples: int = 64

    def __post_init__(self):
        if self.variational_jitter_float < 0 or self.variational_jitter_double < 0:
            raise ValueError("variational jitter must be ≥ 0")
        if self.num_likelihood_samples < 1:
            raise ValueError("num_likelihood_samples must be at least 1; got "
                             f"{self.num_likelihood_samples}")

    def context(self) -> contextlib.ExitStack:
        """Cholesky (float64) for K_zz, no CG, explicit jitter and sample counts."""
        s = gpytorch.settings
        stack = contextlib.ExitStack()
        for manager in (
            s.max_cholesky_size(NEVER_CG),
            s.fast_computations(covar_root_decomposition=False, log_prob=True, solves=False),
            s.linalg_dtypes(default=torch.float64, symeig=torch.float64, cholesky=torch.float64),
            s.variational_cholesky_jitter(float_value=self.variational_jitter_float,
                                          double_value=self.variational_jitter_double),
            s.num_likelihood_samples(self.num_likelihood_samples),
            s.skip_posterior_variances(False),
            s.trace_mode(False),
            s.debug(False),
            translate_cholesky_errors(
                "inducing-point kernel matrix K_zz",
                "Increase variational_jitter_float (or _double) or train in float64."),
        ):
            stack.enter_context(manager)
        return stack


@dataclass(frozen=True)
class SVGPState:
    """A minibatch: SVGP's loss needs nothing else, its prediction not even that.

    Attributes:
        x: (b, d) inputs.
        y: (b,) targets (float for regression and binary labels, long for C > 2 classes).
    """

    x: Tensor
    y: Tensor


class _ApproximateGP(gpytorch.models.ApproximateGP):
    """GPyTorch's SVGP model: whitened ``VariationalStrategy`` with learned inducing inputs and a
    Cholesky q(v); ``IndependentMultitaskVariationalStrategy`` over C latent GPs when C > 1."""

    def __init__(self, mean: gpytorch.means.Mean, kernel: gpytorch.kernels.Kernel,
                 inducing_points: Tensor, num_latents: int):
        batch_shape = torch.Size([num_latents]) if num_latents > 1 else torch.Size()
        q_v = gpytorch.variational.CholeskyVariationalDistribution(
            inducing_points.shape[-2], batch_shape=batch_shape)
        strategy = gpytorch.variational.VariationalStrategy(
            self, inducing_points, q_v, learn_inducing_locations=True)
        # q(v) starts at the whitened prior N(0, I) (its constructor values); GPyTorch's lazy
        # initialisation on first call, which would add noise and flip a buffer, is marked done.
        strategy.variational_params_initialized.fill_(1)
        if num_latents > 1:
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
                strategy, num_tasks=num_latents)
        super().__init__(strategy)
        self.mean_module, self.covar_module = mean, kernel

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class SVGP(Method):
    """GPyTorch's SVGP for regression and classification (key ``svgp``).

    Args:
        gp: the GPyTorch ApproximateGP (mean, kernel, inducing points, q(v)).
        likelihood: GPyTorch Gaussian, Bernoulli or Softmax likelihood.
        settings: the GPyTorch settings applied inside every call.
        task: ``"regression"`` or ``"classification"``.
        num_classes: C for classification, else ``None``.
        num_dims: input dimension d.
        num_data: N, the training-set size that scales the KL term.
        seed: seeds the Monte Carlo softmax probabilities.
        options: resolved factory options (stored as ``self.options``).

    Example:
        >>> import torch
        >>> from gpscale.methods import build
        >>> x = torch.randn(60, 2); y = (x[:, 0] > 0).float()
        >>> model = build("svgp", 2, task="classification", init=(x, y), num_inducing=8)
        >>> model.predict(model.condition(x, y), x[:4]).probs.shape
        torch.Size([4, 2])
    """

    key = "svgp"
    minibatch = True
    needs_data_for_prediction = False

    def __init__(self, gp: _ApproximateGP, likelihood: gpytorch.likelihoods.Likelihood,
                 settings: SVGPSettings, *, task: str, num_classes: int | None, num_dims: int,
                 num_data: int, seed: int, options: dict[str, Any] | None = None):
        super().__init__(task=task, num_classes=num_classes, options=options)
        self.gp, self.likelihood, self.settings = gp, likelihood, settings
        self.num_dims, self.num_data, self.seed = num_dims, num_data, seed

    @property
    def inducing_points(self) -> torch.nn.Parameter:
        """(m, d) learned inducing inputs z, or (C, m, d) for C > 2 classes."""
        strategy = self.gp.variational_strategy
        return getattr(strategy, "base_variational_strategy", strategy).inducing_points

    @property
    def _softmax(self) -> bool:
        return isinstance(self.likelihood, gpytorch.likelihoods.SoftmaxLikelihood)

    def condition(self, x: Tensor, y: Tensor) -> SVGPState:
        """The (validated) batch itself; never mutates the module."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y, task=self.task, num_classes=self.num_classes)
        return SVGPState(x, y.long() if self._softmax else y.to(x.dtype))

    def expected_log_lik(self, state: SVGPState) -> Tensor:
        """Batch mean of E_q(f_j)[log p(y_j | f_j)] by the GPyTorch likelihood."""
        def ell(rows: slice) -> Tensor:
            return self.likelihood.expected_log_prob(state.y[rows], self.gp(state.x[rows]))

        with self.settings.context(), gpytorch_mode(self, training=True):
            return self._by_rows(ell, state.x.shape[0]).mean()

    def kl(self, state: SVGPState) -> Tensor:
        """KL[q(v) ‖ p(v)] / N, summed over latent GPs (does not depend on the batch)."""
        with self.settings.context(), gpytorch_mode(self, training=True):
            return self.gp.variational_strategy.kl_divergence() / self.num_data

    def loss(self, state: SVGPState) -> Tensor:
        """Negative ELBO per datum: kl − expected_log_lik."""
        return self.kl(state) - self.expected_log_lik(state)

    def finalize(self, x: Tensor, y: Tensor, reduce: Callable[[Tensor], Tensor] | None = None,
                 held: Any = None, chunk_size: int = 4096) -> dict[str, float] | None:
        """After training a regression model with ``optimal_q`` on: q(v) and σ² set to the
        optimum of the ELBO for the trained inducing inputs and kernel
        (:mod:`~gpscale.methods.baselines.optimal_q`), from one O(n m²) pass over ``(x, y)``;
        ``reduce`` sums the pass's statistics over the ranks of a data-parallel run. Returns
        the noise before and after, for the history."""
        if self.task != "regression" or not self.options.get("optimal_q", True):
            return None
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        with torch.no_grad(), self.settings.context(), gpytorch_mode(self, training=False):
            jitter = (self.settings.variational_jitter_double if x.dtype == torch.float64
                      else self.settings.variational_jitter_float)
            stats = kernel_statistics(self.gp.covar_module, self.gp.mean_module,
                                      self.inducing_points, x, y, jitter=jitter,
                                      chunk_size=chunk_size).reduced(reduce)
            trained = float(self.likelihood.noise.detach())
            floor = float(self.likelihood.noise_covar.raw_noise_constraint.lower_bound)
            noise = optimal_noise(stats, floor=max(floor * 1.01, 1e-8))
            m, chol_S = optimal_q(stats, noise)
            q = self.gp.variational_strategy._variational_distribution
            q.variational_mean.data.copy_(m.to(q.variational_mean))
            q.chol_variational_covar.data.copy_(chol_S.to(q.chol_variational_covar))
            self.likelihood.noise = torch.tensor(noise, dtype=x.dtype, device=x.device)
        return {"noise_trained": trained,
                "noise_calibrated": float(self.likelihood.noise.detach())}

    def predict(self, state: SVGPState | None, x_test: Tensor,
                chunk_size: int = 4096) -> Predictive:
        """Marginal predictive at ``x_test`` (t, d); ``state`` is not needed (may be ``None``)."""
        check_x(x_test, num_dims=self.num_dims, name="x_test")
        eps = None
        if self._softmax:  # one set of draws for every point: a point's probabilities depend
            generator = torch.Generator().manual_seed(self.seed)  # on it only; drawn on the CPU
            eps = torch.randn((self.settings.num_likelihood_samples, 1, self.num_classes),
                              generator=generator, dtype=x_test.dtype).to(x_test.device)

        def chunk(xc: Tensor) -> Predictive:
            return self._by_rows(lambda rows: self._predict_rows(xc[rows], eps), xc.shape[0])

        with self.settings.context(), gpytorch_mode(self, training=False):
            return predict_in_chunks(chunk, x_test, chunk_size)

    def _predict_rows(self, x: Tensor, eps: Tensor | None) -> Predictive:
        hp = kernel_hyperparameters(self.gp.covar_module)
        if hp is not None:  # rows beyond the kernel's reach of every inducing point
            # predict the prior either way, but GPyTorch would form infinite distances there
            # (Matérn: ∞ · 0 = NaN); one finite point beyond reach stands in for them.
            x = reach.park(x, self.inducing_points, hp.lengthscale)
        q_f = self.gp(x)
        mean, variance = q_f.mean, q_f.variance
        if self.task == "regression":
            return Predictive(mean, variance, noise=self.likelihood.noise.reshape(()))
        if not self._softmax:
            p1 = self.likelihood(q_f).probs  # GPyTorch's analytic probit marginal
            return Predictive(mean, variance, probs=torch.stack([1 - p1, p1], -1))
        f = mean + variance.sqrt() * eps  # (S, t, C) draws of the independent marginals
        return Predictive(mean, variance, probs=self.likelihood.forward(f).probs.mean(0))

    def _by_rows(self, fn: Callable[[slice], Any], n: int) -> Any:
        """``fn(slice(None))``, except for a softmax batch of exactly C points.

        GPyTorch's ``SoftmaxLikelihood.forward`` reads a (…, C, C) sample as the deprecated
        (classes × points) layout and transposes it, so such a batch is evaluated in two parts.
        """
        if not self._softmax or n != self.num_classes:
            return fn(slice(None))
        parts = [fn(slice(0, n - 1)), fn(slice(n - 1, n))]
        return concat(parts) if isinstance(parts[0], Predictive) else torch.cat(parts)


def build_svgp(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
               init: tuple[Tensor, Tensor] | None = None, num_inducing: int | None = None,
               seed: int = 0, kmeans_max_points: int = 10_000, num_data: int | None = None,
               variational_jitter_float: float = 1e-4, variational_jitter_double: float = 1e-6,
               num_likelihood_samples: int = 64, learn_kernel: bool = True,
               optimal_q: bool = True, **prior: Any) -> SVGP:
    """Factory of ``svgp`` (see :mod:`gpscale.methods.registry`).

    Args:
        num_dims: input dimension d.
        task: ``"regression"`` or ``"classification"``.
        num_classes: C; inferred from ``init`` labels (max + 1, at least 2) when ``None``.
        init: ``(x, y)``: k-means inducing points, N = len(y), data-dependent prior defaults;
            ``None`` allocates placeholders to be overwritten by ``load_state_dict``.
        num_inducing: m (per latent GP); ``None``: min(512, n/2).
        seed: seeds k-means, its subsample and the Monte Carlo softmax probabilities.
        kmeans_max_points: k-means runs on at most this many (randomly chosen) rows of x.
        num_data: N; required when ``init`` is ``None``.
        variational_jitter_float, variational_jitter_double, num_likelihood_samples: see
            :class:`SVGPSettings`.
        learn_kernel: ``False`` freezes the kernel hyperparameters (lengthscale, output scale)
            and the constant mean at their initial values, as in the IterNCGP paper's
            comparisons where all methods share fixed hyperparameters (notes/000 §11.3).
        optimal_q: regression: :meth:`SVGP.finalize` sets q(v) and σ² to the ELBO's optimum
            after training.
        **prior: ``kernel``, ``ard``, ``lengthscale``, ``outputscale``, ``noise`` (regression),
            ``mean_constant`` (see :func:`~gpscale.methods._common.prior_options`).

    Raises:
        ValueError: unsupported task, invalid ``init``, fewer points than ``num_inducing``,
            missing ``num_data`` or ``num_classes``.
    """
    check_task_and_init("svgp", task, TASKS, num_dims, init, num_classes)
    ind = inducing_options(init, num_inducing=num_inducing, seed=seed,
                           kmeans_max_points=kmeans_max_points)
    num_classes = resolve_num_classes(task, num_classes, init)
    if num_data is None and init is None:
        raise ValueError("svgp needs num_data (the training-set size) when init is None")
    num_data = int(init[0].shape[0] if num_data is None else num_data)
    if num_data < 1:
        raise ValueError(f"num_data must be positive; got {num_data}")
    settings = SVGPSettings(variational_jitter_float, variational_jitter_double,
                            num_likelihood_samples)
    opts = prior_options(init, task, num_dims, **prior)
    num_latents = num_classes if num_classes is not None and num_classes > 2 else 1
    batch_shape = torch.Size([num_latents]) if num_latents > 1 else torch.Size()
    z = initial_inducing_points(init, num_dims, ind)
    z = z.expand(*batch_shape, *z.shape).clone()  # the same start for every latent GP
    mean, kernel = prior_modules(num_dims, opts, batch_shape=batch_shape)
    if task == "regression":
        likelihood = gaussian_likelihood(opts["noise"])
    else:
        del opts["noise"]
        likelihood = (gpytorch.likelihoods.BernoulliLikelihood() if num_latents == 1 else
                      gpytorch.likelihoods.SoftmaxLikelihood(num_classes=num_classes,
                                                              mixing_weights=False))
    if not learn_kernel:
        kernel.requires_grad_(False)
        mean.requires_grad_(False)
    model = SVGP(_ApproximateGP(mean, kernel, z, num_latents), likelihood, settings, task=task,
                 num_classes=num_classes, num_dims=num_dims, num_data=num_data, seed=seed,
                 options={**ind, "num_data": num_data, **opts, **asdict(settings),
                          "learn_kernel": bool(learn_kernel), "optimal_q": bool(optimal_q)})
    return follow_init(model, init)


register(MethodSpec(
    key="svgp",
    **PIPELINE["svgp"],
    factory=build_svgp,
    tasks=TASKS,
    summary="GPyTorch SVGP (whitened, learned inducing points), minibatch ELBO",
    options=(replace(INDUCING_OPTIONS[0], help=INDUCING_OPTIONS[0].help + ", in regression "
                     "on a GPU min(1024, n/2)"),) + INDUCING_OPTIONS[1:] + PRIOR_OPTIONS + (
        Option("learn_kernel", "bool", True, "learn the kernel hyperparameters and the mean "
               "(false: frozen at their initial values)"),
        Option("optimal_q", "bool", True, "regression: after training, set q(v) and the "
               "noise to the ELBO's optimum for the trained inducing points and kernel (one "
               "pass over the data; false: keep what the optimiser reached)"),
        Option("num_likelihood_samples", "int", 64, "Monte Carlo samples of the softmax "
               "likelihood", minimum=1),
        Option("variational_jitter_float", "float", 1e-4, "jitter of K_zz in float32",
               minimum=0),
        Option("variational_jitter_double", "float", 1e-6, "jitter of K_zz in float64",
               minimum=0),
        Option("num_data", "int", None, "number of training points N", minimum=1, hidden=True),
    ),
))
