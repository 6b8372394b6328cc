r"""``sgpr``: GPyTorch's SGPR, an ``ExactGP`` with ``InducingPointKernel`` (Titsias' bound).

Titsias (2009), "Variational Learning of Inducing Variables in Sparse Gaussian Processes",
AISTATS (collapsed bound, Eq. 9), as computed by GPyTorch's ``InducingPointKernel``.

=============  ===========================  ============================================
symbol         variable                     meaning
=============  ===========================  ============================================
x, y           ``x``, ``y``                 (n, d) training inputs, (n,) targets
x_*            ``x_test``                   (t, d) test inputs
z              ``inducing_points``          (m, d) inducing inputs, learned
K, K_xz, K_zz  (GPyTorch)                   kernel matrices of the scaled base kernel
Q              (GPyTorch)                   K_xz K_zz⁻¹ K_zx, the Nyström approximation
σ²             ``likelihood.noise``         Gaussian noise variance
=============  ===========================  ============================================

Loss (Titsias Eq. 9, per datum):
:math:`-\tfrac1n[\log N(y \mid m, Q + σ^2 I) - \tfrac1{2σ^2}\operatorname{tr}(K - Q)]`;
GPyTorch evaluates the first term by Woodbury / the matrix determinant lemma on the rank-m
operator and adds the trace term as the kernel's added loss term (train mode only).
Predictive (the bound's optimal q(u), so VFE's and not FITC's; GPyTorch's
``sgpr_diagonal_correction`` only restores k(x_*, x_*) in the test prior):
mean :math:`m_* + Q_{*x}(Q + σ^2I)^{-1}(y - m)`, latent variance
:math:`k_{**} - Q_{*x}(Q + σ^2I)^{-1}Q_{x*}`, plus ``noise`` σ².

Inducing points start at k-means centres of (a seeded subsample of) the ``init`` inputs.
Cost: O(n m² + m³) time and O(n m) memory per loss and per prediction.
GPyTorch settings: :class:`~gpscale.methods.baselines.exact.CholeskySettings` (no CG anywhere).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import gpytorch
import torch
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.methods._common import (
    HeldOutNoise,
    check_task_and_init,
    follow_init,
    gaussian_likelihood,
    gpytorch_mode,
    inducing_options,
    initial_inducing_points,
    prior_modules,
    prior_options,
)
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.baselines._exactgp import (
    ConditionedExactGP,
    ExactGPState,
    gaussian_predictive,
    negative_mll,
)
from gpscale.methods.baselines.exact import CHOLESKY_OPTIONS, CholeskySettings
from gpscale.methods.baselines.optimal_q import kernel_statistics, optimal_noise
from gpscale.methods.baselines.pipeline import PIPELINE
from gpscale.methods.options import INDUCING_OPTIONS, PRIOR_OPTIONS
from gpscale.methods.registry import MethodSpec, register
from gpscale.validation import check_x, check_xy

__all__ = ["SGPR", "build_sgpr"]


class SGPR(HeldOutNoise, Method):
    """GPyTorch's sparse GP regression with Titsias' collapsed bound (key ``sgpr``).

    Args:
        mean: GPyTorch mean module.
        kernel: GPyTorch ``InducingPointKernel`` (its base kernel, inducing points, likelihood).
        likelihood: the Gaussian likelihood, the same object the kernel holds.
        settings: the GPyTorch settings applied inside every call.
        num_dims: input dimension d.
        options: resolved factory options (stored as ``self.options``).

    Example:
        >>> import torch
        >>> from gpscale.methods import build
        >>> x = torch.randn(50, 2, dtype=torch.float64); y = x.sum(1)
        >>> model = build("sgpr", 2, init=(x, y), num_inducing=8)
        >>> model.inducing_points.shape
        torch.Size([8, 2])
    """

    key = "sgpr"

    def __init__(self, mean: gpytorch.means.Mean, kernel: gpytorch.kernels.InducingPointKernel,
                 likelihood: gpytorch.likelihoods.GaussianLikelihood,
                 settings: CholeskySettings, *, num_dims: int,
                 options: dict[str, Any] | None = None):
        super().__init__(task="regression", options=options)
        self.mean, self.kernel, self.likelihood = mean, kernel, likelihood
        self.settings = settings
        self.num_dims = num_dims

    @property
    def inducing_points(self) -> torch.nn.Parameter:
        """(m, d) learned inducing inputs z."""
        return self.kernel.inducing_points

    def condition(self, x: Tensor, y: Tensor) -> ExactGPState:
        """An ExactGP on (x, y) sharing this module's parameters; never mutates the module."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        y = y.to(x.dtype)
        return ExactGPState(x, y, ConditionedExactGP(x, y, self.mean, self.kernel,
                                                      self.likelihood))

    def loss(self, state: ExactGPState) -> Tensor:
        """Negative Titsias bound per datum (Eq. 9), with the kernel in GPyTorch's train mode."""
        with (self.settings.context(), gpytorch.settings.sgpr_diagonal_correction(False),
              gpytorch_mode(self, training=True)):
            return negative_mll(state)

    def finalize(self, x: Tensor, y: Tensor, reduce: Callable[[Tensor], Tensor] | None = None,
                 held: Any = None, chunk_size: int = 4096) -> dict[str, float] | None:
        """After training: σ² set to the maximum of the bound for the trained inducing inputs
        and kernel (:func:`~gpscale.methods.baselines.optimal_q.optimal_noise`, one O(n m²)
        pass), so that a run its budget stopped still predicts with the noise its bound asks
        for. Returns the noise before and after, for the history."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        with torch.no_grad(), self.settings.context(), gpytorch_mode(self, training=False):
            stats = kernel_statistics(self.kernel.base_kernel, self.mean, self.inducing_points,
                                      x, y, jitter=0.0, chunk_size=chunk_size).reduced(reduce)
            trained = float(self.likelihood.noise.detach())
            floor = float(self.likelihood.noise_covar.raw_noise_constraint.lower_bound)
            self.likelihood.noise = torch.tensor(optimal_noise(stats, floor=1.01 * floor),
                                                 dtype=x.dtype, device=x.device)
        return {"noise_trained": trained,
                "noise_calibrated": float(self.likelihood.noise.detach())}

    def predict(self, state: ExactGPState, x_test: Tensor, chunk_size: int = 4096) -> Predictive:
        """Titsias' predictive in chunks of ``chunk_size`` test points."""
        check_x(x_test, num_dims=self.num_dims, name="x_test")
        # The test covariances come from ConditionedExactGP's hook: Q(x_*, x) as the factors
        # K_*z K_zz^{-1/2}, and the prior variance k(x_*, x_*) from the base kernel (what
        # GPyTorch's diagonal correction restored; cornellius-gp/gpytorch#2749), so neither the
        # correction nor a split of x_* == x (InducingPointKernel's training case) is needed.
        with self.settings.context(), gpytorch_mode(self, training=False):
            return predict_in_chunks(lambda xc: gaussian_predictive(state, xc), x_test,
                                     chunk_size)


def build_sgpr(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
               init: tuple[Tensor, Tensor] | None = None, num_inducing: int | None = None,
               seed: int = 0, kmeans_max_points: int = 10_000,
               cholesky_jitter_float: float = 1e-6, cholesky_jitter_double: float = 1e-8,
               cholesky_max_tries: int = 3, **prior: Any) -> SGPR:
    """Factory of ``sgpr`` (see :mod:`gpscale.methods.registry`).

    Args:
        num_dims: input dimension d.
        task: must be ``"regression"``.
        num_classes: unused (regression).
        init: ``(x, y)``: inducing points start at k-means centres of x; ``None`` allocates
            placeholders to be overwritten by ``load_state_dict``.
        num_inducing: m; ``None``: min(512, n/2).
        seed: seeds the k-means subsample and k-means itself.
        kmeans_max_points: k-means runs on at most this many (randomly chosen) rows of x.
        cholesky_jitter_float, cholesky_jitter_double, cholesky_max_tries: see
            :class:`~gpscale.methods.baselines.exact.CholeskySettings`.
        **prior: ``kernel``, ``ard``, ``lengthscale``, ``outputscale``, ``noise``,
            ``mean_constant`` (see :func:`~gpscale.methods._common.prior_options`).

    Raises:
        ValueError: for a task other than regression, invalid ``init`` data, or fewer
            ``init`` points than ``num_inducing``.
    """
    check_task_and_init("sgpr", task, ("regression",), num_dims, init)
    ind = inducing_options(init, num_inducing=num_inducing, seed=seed,
                           kmeans_max_points=kmeans_max_points)
    settings = CholeskySettings(cholesky_jitter_float, cholesky_jitter_double, cholesky_max_tries)
    opts = prior_options(init, task, num_dims, **prior)
    z = initial_inducing_points(init, num_dims, ind)
    mean, base_kernel = prior_modules(num_dims, opts)
    likelihood = gaussian_likelihood(opts["noise"])
    kernel = gpytorch.kernels.InducingPointKernel(base_kernel, inducing_points=z,
                                                  likelihood=likelihood)
    model = SGPR(mean, kernel, likelihood, settings, num_dims=num_dims,
                 options={**ind, **opts, **asdict(settings)})
    return follow_init(model, init)


register(MethodSpec(
    key="sgpr",
    **PIPELINE["sgpr"],
    factory=build_sgpr,
    tasks=("regression",),
    summary="GPyTorch SGPR (InducingPointKernel, Titsias bound), k-means inducing points",
    options=INDUCING_OPTIONS + PRIOR_OPTIONS + CHOLESKY_OPTIONS,
))
