r"""``exact``: GPyTorch's ``ExactGP`` with Cholesky linear algebra, the dense baseline.

Rasmussen & Williams (2006), *Gaussian Processes for Machine Learning*, Alg. 2.1, as implemented by
GPyTorch (Gardner et al. 2018, arXiv:1809.11165) with its CG/Lanczos path switched off.

=============  =======================  ============================================
symbol         variable                 meaning
=============  =======================  ============================================
x, y           ``x``, ``y``             (n, d) training inputs, (n,) targets
x_*            ``x_test``               (t, d) test inputs
m, K           ``mean``, ``kernel``     GPyTorch constant mean, scaled kernel
σ²             ``likelihood.noise``     Gaussian noise variance
=============  =======================  ============================================

Loss (R&W Eq. 2.30, per datum):
:math:`-\tfrac1n\log p(y) = \tfrac1{2n}[(y-m)^\top(K+σ^2I)^{-1}(y-m) + \log|K+σ^2I| + n\log 2π]`.
Predictive (R&W Eqs. 2.25–2.26): mean :math:`m_* + K_{*x}(K+σ^2I)^{-1}(y-m)`, latent variance
:math:`k_{**} - K_{*x}(K+σ^2I)^{-1}K_{x*}`, plus ``noise`` σ².

Cost: O(n³) time and O(n²) memory per loss (the loss's backward pass is hand-written:
:mod:`~gpscale.methods.baselines._cholesky_nll`); each ``predict`` call refactorises K + σ²I
(GPyTorch's variance path) and costs O(n³ + n²t).

GPyTorch settings fixed inside every call (:meth:`CholeskySettings.context`):
``max_cholesky_size`` larger than any n (never CG), ``fast_computations`` with Cholesky root
decompositions and solves (log_prob through linear_operator's ``inv_quad_logdet``, which is a
Cholesky below ``max_cholesky_size`` and Woodbury for SGPR's low-rank operator),
``fast_pred_var`` off (no LOVE), ``skip_posterior_variances`` off, ``detach_test_caches`` off
(predictions stay differentiable), ``debug`` off, and the Cholesky jitter schedule below.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any

import gpytorch
import torch
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.kernels import (
    dense_kernel_matrix,
    kernel_diag,
    kernel_hyperparameters,
    kernel_matrix,
)
from gpscale.linalg.ops import cholesky_in_place
from gpscale.methods._common import (
    check_task_and_init,
    follow_init,
    gaussian_likelihood,
    prior_modules,
    prior_options,
    translate_cholesky_errors,
)
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.baselines._cholesky_nll import cholesky_nll
from gpscale.methods.baselines._exactgp import (
    ConditionedExactGP,
    ExactGPState,
    gaussian_predictive,
    negative_mll,
)
from gpscale.methods.baselines.pipeline import PIPELINE
from gpscale.methods.options import PRIOR_OPTIONS, Option
from gpscale.methods.registry import MethodSpec, register
from gpscale.validation import check_x, check_xy

__all__ = ["CholeskySettings", "ExactGPyTorch", "build_exact"]

# max_cholesky_size: larger than any n, so linear_operator never switches to CG/Lanczos.
NEVER_CG = 2**62


@dataclass(frozen=True)
class CholeskySettings:
    """GPyTorch settings for Cholesky-only linear algebra.

    Attributes:
        cholesky_jitter_float: jitter first added to a float32 matrix whose Cholesky failed;
            GPyTorch multiplies it by 10 on each further try.
        cholesky_jitter_double: the same for float64.
        cholesky_max_tries: jittered retries before :class:`~gpscale.errors.NumericalError`.
    """

    cholesky_jitter_float: float = 1e-6
    cholesky_jitter_double: float = 1e-8
    cholesky_max_tries: int = 3

    def __post_init__(self):
        if self.cholesky_jitter_float <= 0 or self.cholesky_jitter_double <= 0:
            raise ValueError("cholesky jitter must be positive; got "
                             f"{self.cholesky_jitter_float}, {self.cholesky_jitter_double}")
        if self.cholesky_max_tries < 0:
            raise ValueError(f"cholesky_max_tries must be ≥ 0; got {self.cholesky_max_tries}")

    def context(self) -> contextlib.ExitStack:
        """Enter every GPyTorch setting this baseline depends on (see the module docstring)."""
        s = gpytorch.settings
        stack = contextlib.ExitStack()
        for manager in (
            s.max_cholesky_size(NEVER_CG),
            s.fast_computations(covar_root_decomposition=False, log_prob=True, solves=False),
            s.cholesky_jitter(float_value=self.cholesky_jitter_float,
                              double_value=self.cholesky_jitter_double),
            s.cholesky_max_tries(self.cholesky_max_tries),
            s.fast_pred_var(False),
            s.skip_posterior_variances(False),
            s.detach_test_caches(False),
            s.debug(False),
            translate_cholesky_errors(
                "kernel matrix", "Increase cholesky_jitter_double (or _float), train in float64, "
                "or start from a larger noise."),
        ):
            stack.enter_context(manager)
        return stack


class ExactGPyTorch(Method):
    """GPyTorch's exact GP regression; ``settings`` choose the linear algebra.

    :class:`CholeskySettings` give the dense baseline (key ``exact``);
    :class:`~gpscale.methods.baselines.cggp.CGSettings` give GPyTorch's CG/Lanczos path (key
    ``cggp``), whose loss is then a stochastic estimate.

    Args:
        mean: GPyTorch mean module.
        kernel: GPyTorch kernel.
        likelihood: GPyTorch Gaussian likelihood.
        settings: the GPyTorch settings applied inside every call.
        num_dims: input dimension d.
        options: resolved factory options (stored as ``self.options``).

    Example:
        >>> import torch
        >>> from gpscale.methods import build
        >>> x = torch.randn(20, 2, dtype=torch.float64); y = x.sum(1)
        >>> model = build("exact", 2, init=(x, y))
        >>> model.predict(model.condition(x, y), x[:3]).mean.shape
        torch.Size([3])
    """

    def __init__(self, mean: gpytorch.means.Mean, kernel: gpytorch.kernels.Kernel,
                 likelihood: gpytorch.likelihoods.GaussianLikelihood,
                 settings: Any, *, num_dims: int,
                 options: dict[str, Any] | None = None):
        super().__init__(task="regression", options=options)
        self.mean, self.kernel, self.likelihood = mean, kernel, likelihood
        self.settings = settings
        self.num_dims = num_dims

    def condition(self, x: Tensor, y: Tensor) -> ExactGPState:
        """An ExactGP on (x, y) sharing this module's parameters; never mutates the module."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        y = y.to(x.dtype)
        return ExactGPState(x, y, ConditionedExactGP(x, y, self.mean, self.kernel,
                                                      self.likelihood))

    def loss(self, state: ExactGPState) -> Tensor:
        """−log p(y)/n (R&W Eq. 2.30).

        Under Cholesky settings: the dense kernel matrix (:func:`gpscale.kernels.kernel_matrix`,
        equal to GPyTorch's to rounding) and GPyTorch's mean, then one Cholesky with
        the textbook gradient (:func:`~gpscale.methods.baselines._cholesky_nll.cholesky_nll`;
        the same value as GPyTorch's ExactMarginalLogLikelihood, whose autograd through the
        factorisation makes an epoch ~3× slower). Under CG settings GPyTorch's
        ExactMarginalLogLikelihood: the quadratic term a CG solve and the log-determinant a
        stochastic Lanczos estimate.
        """
        if not isinstance(self.settings, CholeskySettings):
            with self.settings.context():
                return negative_mll(state)
        s = self.settings
        double = state.x.dtype == torch.float64
        jitter = s.cholesky_jitter_double if double else s.cholesky_jitter_float
        # one autograd node that keeps only the inputs (GPyTorch's kernel keeps its n × n
        # intermediates for the backward: 9 n × n matrices at the peak instead of ~4)
        prior = kernel_matrix(self.kernel, state.x, state.x)
        residual = state.y - self.mean(state.x)
        return cholesky_nll(prior, self.likelihood.noise, residual, jitter=jitter,
                            max_tries=s.cholesky_max_tries)

    def predict(self, state: ExactGPState, x_test: Tensor, chunk_size: int = 4096) -> Predictive:
        """Marginal predictive (R&W Eqs. 2.25–2.26) in chunks of ``chunk_size`` test points.

        Without gradients, under Cholesky settings and for a kernel
        :func:`~gpscale.kernels.kernel_hyperparameters` recognises: one Cholesky factor of
        K + σ²I written over the matrix (:func:`~gpscale.linalg.ops.cholesky_in_place`), kept
        on the state for later calls, then per chunk K(x_*, x) α and the triangular solve of
        the variances. One n × n array at the peak, where GPyTorch's prediction holds several
        (so a larger exact GP fits in a GPU's memory). Otherwise GPyTorch's prediction.
        """
        check_x(x_test, num_dims=self.num_dims, name="x_test")
        if (isinstance(self.settings, CholeskySettings) and not torch.is_grad_enabled()
                and kernel_hyperparameters(self.kernel) is not None):
            factor, alpha = self._cholesky_cache(state)
            return predict_in_chunks(lambda xc: self._lean_predictive(state, factor, alpha, xc),
                                     x_test, chunk_size)
        with self.settings.context():
            return predict_in_chunks(lambda xc: gaussian_predictive(state, xc), x_test,
                                     chunk_size)

    def _cholesky_cache(self, state: ExactGPState) -> tuple[Tensor, Tensor]:
        """(L, α): the factor of K + σ²I and (K + σ²I)⁻¹(y − m), made at the first prediction
        from a state and kept on it (with the hyperparameters of that call, as GPyTorch's
        prediction caches)."""
        cache = getattr(state.gp, "_gpscale_cholesky", None)
        if cache is not None:
            return cache
        s = self.settings
        double = state.x.dtype == torch.float64
        noise = self.likelihood.noise.reshape(())

        def build() -> Tensor:
            K = dense_kernel_matrix(self.kernel, state.x)
            K.diagonal().add_(noise)
            return K

        factor = cholesky_in_place(
            build, jitter=s.cholesky_jitter_double if double else s.cholesky_jitter_float,
            max_tries=s.cholesky_max_tries, name="exact GP kernel matrix K + σ²I")
        residual = (state.y - self.mean(state.x))[:, None]
        alpha = torch.cholesky_solve(residual, factor, upper=False)[:, 0]
        state.gp._gpscale_cholesky = (factor, alpha)
        return factor, alpha

    def _lean_predictive(self, state: ExactGPState, factor: Tensor, alpha: Tensor,
                         x_test: Tensor) -> Predictive:
        cross = kernel_matrix(self.kernel, x_test, state.x)  # (t, n); 0 beyond the kernel's reach
        mean = self.mean(x_test) + cross @ alpha
        v = torch.linalg.solve_triangular(factor, cross.mT, upper=False)  # (n, t)
        floor = gpytorch.settings.min_variance.value(x_test.dtype)
        variance = (kernel_diag(self.kernel, x_test) - v.square().sum(0)).clamp_min(floor)
        return Predictive(mean=mean, variance=variance, noise=self.likelihood.noise.reshape(()))


def build_exact(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
                init: tuple[Tensor, Tensor] | None = None,
                cholesky_jitter_float: float = 1e-6, cholesky_jitter_double: float = 1e-8,
                cholesky_max_tries: int = 3, **prior: Any) -> ExactGPyTorch:
    """Factory of ``exact`` (see :mod:`gpscale.methods.registry`).

    Args:
        num_dims: input dimension d.
        task: must be ``"regression"``.
        num_classes: unused (regression).
        init: ``(x, y)`` for data-dependent initial hyperparameters, or ``None`` to rebuild.
        cholesky_jitter_float, cholesky_jitter_double, cholesky_max_tries: see
            :class:`CholeskySettings`.
        **prior: ``kernel``, ``ard``, ``lengthscale``, ``outputscale``, ``noise``,
            ``mean_constant`` (see :func:`~gpscale.methods._common.prior_options`).

    Raises:
        ValueError: for a task other than regression or invalid ``init`` data.
    """
    check_task_and_init("exact", task, ("regression",), num_dims, init)
    settings = CholeskySettings(cholesky_jitter_float, cholesky_jitter_double, cholesky_max_tries)
    opts = prior_options(init, task, num_dims, **prior)
    mean, kernel = prior_modules(num_dims, opts)
    model = ExactGPyTorch(mean, kernel, gaussian_likelihood(opts["noise"]), settings,
                          num_dims=num_dims, options={**opts, **asdict(settings)})
    return follow_init(model, init)


CHOLESKY_OPTIONS = (
    # jitter 0 would retry the same failed factorisation: cholesky_max_tries=0 means no retry
    Option("cholesky_jitter_float", "float", 1e-6, "first diagonal jitter of a float32 Cholesky",
           minimum=0, exclusive=True),
    Option("cholesky_jitter_double", "float", 1e-8, "first diagonal jitter of a float64 Cholesky",
           minimum=0, exclusive=True),
    Option("cholesky_max_tries", "int", 3, "Cholesky retries with a 10x larger jitter", minimum=0),
)

register(MethodSpec(
    key="exact",
    **PIPELINE["exact"],
    factory=build_exact,
    tasks=("regression",),
    summary="GPyTorch ExactGP, Cholesky in float64 (O(n³); the dense baseline)",
    options=PRIOR_OPTIONS + CHOLESKY_OPTIONS,
))
