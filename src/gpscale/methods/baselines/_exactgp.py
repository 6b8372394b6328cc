"""GPyTorch's ``ExactGP`` conditioned on data, shared by the exact, cggp and sgpr baselines.

A baseline module owns the mean, kernel and likelihood. Its ``condition(x, y)`` builds a light
:class:`ConditionedExactGP` whose submodules are those same objects (parameters are shared, not
copied) and returns it inside an :class:`ExactGPState`; nothing is stored on the baseline module.

The covariances of the test points are ours (GPyTorch's hook
``_get_test_prior_mean_and_covariances``): GPyTorch's kernels centre both point sets on the mean
of their first argument, the test batch in K(x_*, x), so one far test row spoiled every other
row's distances by cancellation (and at 10²⁰⁰ overflowed them: NaN). :func:`~gpscale.kernels.
kernel_matrix` takes its distances within reach instead; the test prior's own
variance k(x_*, x_*) stays GPyTorch's lazily evaluated diagonal.

GPyTorch memoises its prediction caches (representer weights, and for SGPR the m×m covariance
cache) on the ExactGP at the first prediction, so one state serves any number of ``predict``
calls; those caches hold the hyperparameters current at that first call. Which linear algebra
GPyTorch uses (Cholesky, CG/Lanczos, Woodbury) is chosen by the calling baseline's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import gpytorch
import torch
from linear_operator.operators import DenseLinearOperator, MatmulLinearOperator
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.kernels import inducing_factor, kernel_diag, kernel_hyperparameters, kernel_matrix
from gpscale.linalg.reach import beyond_box

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

    def _get_test_prior_mean_and_covariances(self, train_inputs, test_inputs, **kwargs):
        """GPyTorch's hook for the test prior: K(x_*, x) from :func:`kernel_matrix` (for SGPR
        the factors of Q(x_*, x) = K_*z K_zz⁻¹ K_zx), and k(x_*, x_*) lazily: only its diagonal
        is read. For SGPR that is the base kernel's, the prior variance Q_** + diag(K_** − Q_**)
        that GPyTorch's diagonal correction would restore from K_*z (centred on x_*).

        Returns:
            (test mean (t,), test covariance (t, t), test–train covariance (t, n), batch
            shape, test shape, the predictive class), as GPyTorch's own.
        """
        (x,), (x_test,) = train_inputs, test_inputs
        kernel = self.covar_module
        if isinstance(kernel, gpytorch.kernels.InducingPointKernel):
            test_train = MatmulLinearOperator(inducing_factor(kernel, x_test),
                                              inducing_factor(kernel, x).mT)
            test_test = kernel.base_kernel(x_test, x_test)
        else:
            test_train = kernel_matrix(kernel, x_test, x)  # x_* as rows: x sets the reference
            test_test = kernel(x_test, x_test)
        return (self.mean_module(x_test), test_test, test_train, x_test.shape[:-2],
                x_test.shape[-2:-1], gpytorch.distributions.MultivariateNormal)

    def _get_train_prior_distribution(self, train_inputs, **kwargs):
        """GPyTorch's hook for the training prior that prediction conditions on.

        Evaluated here, with GPyTorch's SGPR diagonal correction off: Titsias' predictive
        conditions on Q + σ²I, while the correction diag(K − Q) (FITC's) may only restore the
        prior variance k(x_*, x_*) of the test points. No effect for ordinary kernels.
        """
        kernel = self.covar_module
        if not isinstance(kernel, gpytorch.kernels.InducingPointKernel) \
                and kernel_hyperparameters(kernel) is not None:
            # K(x, x) as one autograd node by row blocks: no n × n intermediates of GPyTorch's
            # kernel (the exact GP's conditioning peaked at 5.2 n × n matrices with them)
            (x,) = train_inputs
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), DenseLinearOperator(kernel_matrix(kernel, x, x)))
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
    """Marginal latent predictive at ``x_test`` (t, d) from GPyTorch's posterior mode.

    A row beyond the kernel's reach of the training (and inducing) inputs has an all-zero
    cross-covariance: it gets the prior, m(x_*) and k(x_*, x_*), and stays out of GPyTorch's
    solve, whose CG (``cggp``) stops on the mean residual over all columns, so that a zero
    column would loosen the other rows' variances.
    """
    gp = state.gp
    gp.training = False
    noise = gp.likelihood.noise.reshape(())
    kernel = gp.covar_module
    inducing = isinstance(kernel, gpytorch.kernels.InducingPointKernel)
    prior_kernel = kernel.base_kernel if inducing else kernel
    hp = kernel_hyperparameters(prior_kernel)
    if hp is not None:
        inputs = torch.cat([state.x, kernel.inducing_points]) if inducing else state.x
        near = ~beyond_box(x_test, inputs.amin(0), inputs.amax(0), hp.lengthscale)  # (t,)
        if not bool(near.all()):
            mean, variance = gp.mean_module(x_test), kernel_diag(prior_kernel, x_test)
            rows = near.nonzero()[:, 0]
            if rows.numel():
                f = gp(x_test[rows])
                mean = mean.index_put((rows,), f.mean)
                variance = variance.index_put((rows,), f.variance)
            return Predictive(mean=mean, variance=variance, noise=noise)
    f = gp(x_test)
    return Predictive(mean=f.mean, variance=f.variance, noise=noise)
