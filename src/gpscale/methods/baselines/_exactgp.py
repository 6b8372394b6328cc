"""GPyTorch's ``ExactGP`` conditioned on data, shared by the exact, cggp and sgpr baselines.

A baseline module owns the mean, kernel and likelihood. Its ``condition(x, y)`` builds a light
:class:`ConditionedExactGP` whose submodules are those same objects (parameters are shared, not
copied) and returns it inside an :class:`ExactGPState`; nothing is stored on the baseline module.

GPyTorch memoises its prediction caches (representer weights, and for SGPR the m×m covariance
cache) on the ExactGP at the first prediction, so one state serves any number of ``predict``
calls; those caches hold the hyperparameters current at that first call. Which linear algebra
GPyTorch uses (Cholesky, CG/Lanczos, Woodbury) is chosen by the calling baseline's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import gpytorch
from torch import Tensor

from gpscale.distributions import Predictive

__all__ = ["ConditionedExactGP", "ExactGPState", "negative_mll", "gaussian_predictive"]


class ConditionedExactGP(gpytorch.models.ExactGP):
    """``ExactGP`` on ``(x, y)`` with a given mean, kernel and Gaussian likelihood (shared).

    Args:
        x: (n, d) training inputs.
        y: (n,) training targets.
        mean: GPyTorch mean module.
        kernel: GPyTorch kernel (a scaled kernel, or GPyTorch's ``InducingPointKernel``).
        likelihood: GPyTorch Gaussian likelihood.
    """

    def __init__(self, x: Tensor, y: Tensor, mean: gpytorch.means.Mean,
                 kernel: gpytorch.kernels.Kernel,
                 likelihood: gpytorch.likelihoods.GaussianLikelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = mean
        self.covar_module = kernel

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def _get_train_prior_distribution(self, train_inputs, **kwargs):
        """GPyTorch's hook for the training prior that prediction conditions on.

        Evaluated here, with GPyTorch's SGPR diagonal correction off: Titsias' predictive
        conditions on Q + σ²I, while the correction diag(K − Q) (FITC's) may only restore the
        prior variance k(x_*, x_*) of the test points. No effect for ordinary kernels.
        """
        with gpytorch.settings.sgpr_diagonal_correction(False):
            prior = super()._get_train_prior_distribution(train_inputs, **kwargs)
            return gpytorch.distributions.MultivariateNormal(
                prior.mean, prior.lazy_covariance_matrix.evaluate_kernel())


@dataclass(frozen=True)
class ExactGPState:
    """A GPyTorch ExactGP conditioned on training data.

    Attributes:
        x: (n, d) training inputs.
        y: (n,) training targets.
        gp: the conditioned ExactGP (shares the baseline's parameters).
    """

    x: Tensor
    y: Tensor
    gp: ConditionedExactGP


def negative_mll(state: ExactGPState) -> Tensor:
    """−(1/n)[log p(y) + added loss terms] by GPyTorch's ``ExactMarginalLogLikelihood``.

    The added loss terms are empty for an exact GP and Titsias' trace term −tr(K − Q)/(2σ²) for
    GPyTorch's ``InducingPointKernel`` (computed when the kernel is in train mode).
    """
    gp = state.gp
    # ExactGP.__call__ switches on its own flag; set it alone, leaving the shared submodules.
    gp.training = True
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(gp.likelihood, gp)
    return -mll(gp(state.x), state.y)


def gaussian_predictive(state: ExactGPState, x_test: Tensor) -> Predictive:
    """Marginal latent predictive at ``x_test`` (t, d) from GPyTorch's posterior mode."""
    gp = state.gp
    gp.training = False
    f = gp(x_test)
    return Predictive(mean=f.mean, variance=f.variance,
                      noise=gp.likelihood.noise.reshape(()))
