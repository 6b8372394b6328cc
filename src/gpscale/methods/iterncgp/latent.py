"""Pieces of IterNCGP and SoD-Laplace around the algorithm: likelihood and kernel construction,
the SVGP pre-fit of the kernel hyperparameters (paper §C.4), and the predictive per likelihood.

Predictive per likelihood (notes/000 §8), from the latent marginals mean and variance (L, t):

===========  =================================================================================
Gaussian     latent mean/variance and the noise σ²
Bernoulli    probit approximation σ(m / √(1 + π v / 8)) (``probs="probit"``) or Monte Carlo
Softmax      probit approximation softmax(m / √(1 + π v / 8)) per class (§C.3), or Monte Carlo
             over independent class marginals (``probs="mc"``); given the C × C latent
             covariance Σ at each point (IterNCGP), the probit approximation takes the centred
             latents P f, P = I − 11ᵀ/C, and Monte Carlo draws from N(m, Σ) (see
             :func:`softmax_probs_joint`)
Poisson      expected rate E[e^f] = exp(m + v / 2), the mean of the log-normal (closed form)
===========  =================================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.kernels import (
    dense_kernel_matrix,
    is_expression,
    kernel_diag,
    kernel_matmul,
    kernel_matrix,
    make_kernel,
)
from gpscale.likelihoods import Bernoulli, Gaussian, Likelihood, Poisson, Softmax
from gpscale.linalg.ops import psd_sqrt
from gpscale.methods._common import dense_operator_limit
from gpscale.methods.base import probit_binary_probs
from gpscale.methods.iterncgp.composed import expression_kernel, expression_value
from gpscale.methods.iterncgp.held_distances import held_distance_matmul
from gpscale.methods.options import Option
from gpscale.validation import check_x, check_xy

__all__ = [
    "ARD_MAX_DIMS", "LAPLACE_PRIOR_OPTIONS", "PREFIT_OPTIONS", "LatentKernel", "PredictiveOptions",
    "fixed_kernel", "hyperparameter_options",
    "latent_moments", "latent_predictive", "likelihood_for_task",
    "probit_softmax_probs", "resolve_ard", "softmax_probs_joint",
]

PROBS = ("probit", "mc")
ARD_MAX_DIMS = 64
"""Inputs up to which ``ard=None`` learns one lengthscale per input. Measured with
``gpscale fit`` defaults (BENCHMARKS.md ``iterncgp``): on tabular data with inputs that do not
matter ARD is far ahead, where every input matters the two are level; on images (hundreds of
pixels) they are level in quality but ARD takes more time, because an ARD kernel's products cost
O(n² d) where a single lengthscale's come from held distances
(:mod:`gpscale.methods.iterncgp.held_distances`)."""


def resolve_ard(ard: bool | None, num_dims: int) -> bool:
    """``ard``, or for ``None`` whether ``num_dims`` ≤ :data:`ARD_MAX_DIMS`."""
    return num_dims <= ARD_MAX_DIMS if ard is None else bool(ard)


LAPLACE_PRIOR_OPTIONS = (
    Option("kernel", "kernel", "matern32", "covariance function of the latent GPs: a name, or "
           "an expression such as 'rbf(0,1) * periodic(2) + matern32(3:)' (guide: kernels)"),
    Option("ard", "bool", None, "one lengthscale per input dimension (a named kernel); none: one "
           f"per input up to {ARD_MAX_DIMS} inputs, else one for all"),
    Option("lengthscale", "floats", None, "fixed lengthscale(s); none: from the SVGP pre-fit; "
           "with an expression one value, for its stationary leaves that give none",
           minimum=0, exclusive=True),
    Option("outputscale", "floats", None, "fixed kernel variance(s); none: from the pre-fit; "
           "with an expression one value, shared by its terms that give none",
           minimum=0, exclusive=True),
    Option("shared_kernel", "bool", True, "one kernel for all classes (else one per class)"),
    Option("prior_mean", "float", 0.0, "constant prior mean of the latent GPs"),
    Option("probs", "str", "probit", "class probabilities by the probit approximation or "
           "Monte Carlo (IterNCGP's softmax: on the centred latents / over their joint "
           "covariance)", choices=PROBS),
    Option("num_samples", "int", 1000, "Monte Carlo samples per test point (probs=mc)",
           minimum=1),
    Option("seed", "int", 0, "seeds the chol order, the pre-fit and Monte Carlo draws"),
)
"""Prior and predictive options shared by ``iterncgp`` and ``sod-laplace``."""

PREFIT_OPTIONS = (
    Option("prefit_steps", "int", 100, "Adam steps of the SVGP hyperparameter pre-fit",
           minimum=1),
    Option("prefit_num_inducing", "int", 64, "inducing points per class of the pre-fit",
           minimum=1),
    Option("prefit_lr", "float", 0.05, "learning rate of the pre-fit", minimum=0,
           exclusive=True),
    Option("prefit_batch_size", "int", 1024, "minibatch size of the pre-fit", minimum=1),
)


@dataclass(frozen=True)
class PredictiveOptions:
    """How class probabilities are integrated.

    Args:
        probs: ``"probit"`` (MacKay's approximation, the paper's choice) or ``"mc"``.
        num_samples: Monte Carlo samples per test point for ``"mc"``.
        seed: seeds the Monte Carlo draws.
    """

    probs: str = "probit"
    num_samples: int = 1000
    seed: int = 0

    def __post_init__(self):
        if self.probs not in PROBS:
            raise ValueError(f"probs must be one of {PROBS}; got {self.probs!r}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be ≥ 1; got {self.num_samples}")


def likelihood_for_task(task: str, num_classes: int | None, noise: float | None = None
                        ) -> Likelihood:
    """Bernoulli (C = 2), Softmax (C > 2), Poisson (counts) or Gaussian (regression)."""
    if task == "classification":
        if num_classes is None or num_classes < 2:
            raise ValueError(f"classification needs num_classes ≥ 2; got {num_classes}")
        return Bernoulli() if num_classes == 2 else Softmax(num_classes)
    if task == "counts":
        return Poisson()
    if task == "regression":
        return Gaussian(1.0 if noise is None else noise)
    raise ValueError(f"unknown task {task!r}")


def fixed_kernel(name: str, num_dims: int, *, ard: bool, num_latents: int, shared: bool,
                 lengthscale: Any, outputscale: Any) -> Kernel:
    """A scaled kernel with fixed (``requires_grad=False``) hyperparameters.

    One kernel shared by the L latent GPs (``shared``) or a batch of L kernels (batch_shape
    (L,)). Values: a lengthscale is a float (a list of d floats with ``ard``); with a batch it
    may also be given per latent GP, as a list of L floats (L lists of d with ``ard``), and the
    outputscale as a list of L floats. ``name`` may be a kernel expression: then ``ard`` does
    not apply and the values are ``None`` or one number each
    (:func:`~gpscale.methods.iterncgp.composed.expression_kernel`).
    """
    batch = torch.Size() if shared or num_latents == 1 else torch.Size([num_latents])
    if is_expression(name):
        return expression_kernel(name, num_dims, batch_shape=batch, lengthscale=lengthscale,
                                 outputscale=outputscale).requires_grad_(False)
    kernel = make_kernel(name, num_dims, ard=ard, batch_shape=batch)
    ls, os_ = torch.as_tensor(lengthscale), torch.as_tensor(outputscale)
    if batch and ls.dim() == (2 if ard else 1):  # per latent GP
        ls = ls.reshape(num_latents, 1, -1)
    kernel.initialize(**{"outputscale": os_, "base_kernel.lengthscale": ls})
    kernel.requires_grad_(False)
    return kernel


def probit_softmax_probs(mean: Tensor, variance: Tensor) -> Tensor:
    """softmax(m / √(1 + π v / 8)) over the last axis (probit approximation, paper §C.3)."""
    return torch.softmax(mean / torch.sqrt(1 + math.pi * variance / 8), -1)


def softmax_probs_joint(mean: Tensor, covariance: Tensor, options: PredictiveOptions) -> Tensor:
    """Class probabilities E[softmax(f)], f ~ N(mean, covariance), at each of t points.

    softmax(f) = softmax(P f) for P = I − 11ᵀ/C: the variance of the common shift 1ᵀf/C cannot
    move a probability. The marginals of a Laplace posterior hold much of it (W 1 = 0 for the
    softmax, so the data never inform that direction: a large share of the latent variance at
    the default kernel), and per-class probit factors applied to the marginals spread it as
    noise over every class difference, which makes the probabilities underconfident.
    ``"probit"`` therefore applies the per-class probit approximation to the centred latents
    P f ~ N(P m, P Σ P); ``"mc"`` samples f from the full covariance (eigenvalues clamped at 0).

    Args:
        mean: (t, C) latent means.
        covariance: (t, C, C) latent covariances.
        options: ``probs``, ``num_samples`` and ``seed``.

    Returns:
        (t, C) probabilities.
    """
    if options.probs == "probit":
        centred = mean - mean.mean(-1, keepdim=True)
        # (P Σ P)_cc = Σ_cc − 2 mean_d Σ_cd + mean_de Σ_de (Σ symmetric)
        var = (covariance.diagonal(dim1=-2, dim2=-1) - 2 * covariance.mean(-1)
               + covariance.mean((-2, -1))[..., None])
        return probit_softmax_probs(centred, var.clamp_min(0))
    root = psd_sqrt(covariance)  # root rootᵀ = Σ (t, C, C), the same on any device
    generator = torch.Generator().manual_seed(options.seed)  # CPU draws: equal on any device
    eps = torch.randn((options.num_samples, *mean.shape), generator=generator,
                      dtype=mean.dtype).to(mean.device)
    return torch.softmax(mean + torch.einsum("tcd,std->stc", root, eps), -1).mean(0)


def _mc_probs(mean: Tensor, variance: Tensor, link: Callable[[Tensor], Tensor],
              options: PredictiveOptions) -> Tensor:
    """E[link(f)] for independent f ~ N(mean, variance) (t, C) by Monte Carlo."""
    generator = torch.Generator().manual_seed(options.seed)  # CPU draws: equal on any device
    eps = torch.randn((options.num_samples, *mean.shape), generator=generator,
                      dtype=mean.dtype).to(mean.device)
    return link(mean + variance.sqrt() * eps).mean(0)


def _binary_mc_link(f: Tensor) -> Tensor:
    p1 = torch.sigmoid(f[..., 0])
    return torch.stack([1 - p1, p1], -1)


def _gaussian(lik: Gaussian, mean: Tensor, var: Tensor, options: PredictiveOptions) -> Predictive:
    noise = torch.as_tensor(lik.noise, dtype=mean.dtype, device=mean.device)
    return Predictive(mean[0], var[0], noise=noise)


def _bernoulli(lik: Bernoulli, mean: Tensor, var: Tensor,
               options: PredictiveOptions) -> Predictive:
    if options.probs == "probit":
        probs = probit_binary_probs(mean[0], var[0])
    else:
        probs = _mc_probs(mean.mT, var.mT, _binary_mc_link, options)
    return Predictive(mean[0], var[0], probs=probs)


def _softmax(lik: Softmax, mean: Tensor, var: Tensor, options: PredictiveOptions,
             covariance: Tensor | None = None) -> Predictive:
    mean, var = mean.mT, var.mT  # (t, C)
    if covariance is not None:
        probs = softmax_probs_joint(mean, covariance, options)
    elif options.probs == "probit":
        probs = probit_softmax_probs(mean, var)
    else:
        probs = _mc_probs(mean, var, lambda f: torch.softmax(f, -1), options)
    return Predictive(mean, var, probs=probs)


def _poisson(lik: Poisson, mean: Tensor, var: Tensor, options: PredictiveOptions) -> Predictive:
    return Predictive(mean[0], var[0], rate=torch.exp(mean[0] + var[0] / 2))


_PREDICTIVES: dict[type, Callable[..., Predictive]] = {
    Gaussian: _gaussian, Bernoulli: _bernoulli, Softmax: _softmax, Poisson: _poisson,
}


def latent_moments(latent_kernel: LatentKernel, x: Tensor, v: Tensor, Q: Tensor, x_test: Tensor,
                   prior_mean: float, *, joint: bool
                   ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Latent means and variances (L, t) at ``x_test`` (Eqs. 8–9) from the representer weights
    v (L, n) and the precision root Q (L, n, B'), and with ``joint`` the L × L covariances
    (t, L, L): Q is joint over the latents, so Σ_lm(x⋄) = δ_lm k_l(x⋄, x⋄) − Σ_b
    [K_l(x⋄, X) Q_l]_b [K_m(x⋄, X) Q_m]_b."""
    KR = latent_kernel.matmul(x_test, x, torch.cat([v[..., None], Q], -1))  # (L, t, 1 + B')
    mean, A = prior_mean + KR[..., 0], KR[..., 1:]
    prior = latent_kernel.diag(x_test)  # (L, t)
    # Eq. 9: k(x, x) − ‖K(x, X) Q‖²; ≥ 0 in exact arithmetic, clamped against round-off.
    var = (prior - A.square().sum(-1)).clamp_min(0)
    if not joint:
        return mean, var, None
    return mean, var, torch.diag_embed(prior.mT) - torch.einsum("ltb,mtb->tlm", A, A)


def latent_predictive(lik: Likelihood, mean: Tensor, variance: Tensor,
                      options: PredictiveOptions, covariance: Tensor | None = None
                      ) -> Predictive:
    """The Predictive for latent marginals ``mean``, ``variance`` (L, t) under ``lik``.

    ``mean``/``variance`` come back as (t,) for one latent function and (t, C) for softmax.
    ``covariance`` (t, L, L), the joint latent covariance at each point, is used by the softmax
    probabilities (:func:`softmax_probs_joint`); without it the latents count as independent.
    """
    if type(lik) not in _PREDICTIVES:
        raise ValueError(f"no predictive for likelihood {type(lik).__name__}; supported: "
                         f"{', '.join(t.__name__ for t in _PREDICTIVES)}")
    if covariance is not None and isinstance(lik, Softmax):
        return _softmax(lik, mean, variance, options, covariance)
    return _PREDICTIVES[type(lik)](lik, mean, variance, options)


def resolve_options(**options: Any) -> dict[str, Any]:
    """JSON-like copy of factory options (tensors and tuples become lists)."""
    def plain(value):
        if isinstance(value, Tensor):
            return value.tolist()
        return list(value) if isinstance(value, tuple) else value

    return {k: plain(v) for k, v in options.items()}


@dataclass(frozen=True)
class LatentKernel:
    """Products with the block-diagonal prior covariance of L independent latent GPs.

    K = blockdiag(K_1, …, K_L) in latent-major (NC) ordering. A kernel without batch shape is
    shared by all L GPs (then one :func:`~gpscale.kernels.kernel_matmul` serves all latents at
    once); a kernel with batch shape (L,) gives each GP its own hyperparameters.

    Attributes:
        kernel: a GPyTorch kernel, batch shape () or (L,).
        num_latents: L.
        chunk_size: rows per chunk of :func:`~gpscale.kernels.kernel_matmul`.
        backend: its backend.
    """

    kernel: Kernel
    num_latents: int
    chunk_size: int | None = None
    backend: str = "auto"

    def __post_init__(self):
        batch = tuple(self.kernel.batch_shape)
        if batch not in ((), (self.num_latents,)):
            raise ValueError(f"the kernel's batch shape must be () (shared) or "
                             f"({self.num_latents},) (one per latent GP); got {batch}")

    @property
    def shared(self) -> bool:
        return tuple(self.kernel.batch_shape) == ()

    def matmul(self, x1: Tensor, x2: Tensor, V: Tensor) -> Tensor:
        """K(x1, x2) V per latent: x1 (n1, d), x2 (n2, d), V (L, n2, k) → (L, n1, k)."""
        L, n2, k = V.shape
        if self.shared:
            flat = V.permute(1, 0, 2).reshape(n2, L * k)  # (n2, L k)
            out = kernel_matmul(self.kernel, x1, x2, flat, chunk_size=self.chunk_size,
                                backend=self.backend)
            return out.reshape(x1.shape[0], L, k).permute(1, 0, 2)
        return kernel_matmul(self.kernel, x1, x2, V, chunk_size=self.chunk_size,
                             backend=self.backend)

    def training_matmul(self, x: Tensor) -> Callable[[Tensor], Tensor]:
        """V (L, n, k) ↦ K(x, x) V for the many products of one conditioning: the n × n matrix
        computed once and held, where a shared kernel needs no gradient and the matrix fits
        :func:`~gpscale.methods._common.dense_operator_limit`; otherwise matrix-free
        (:meth:`matmul`). Each product then costs n² k L multiply-adds instead of n² kernel
        evaluations in d dimensions (the bulk of a conditioning's time at large d)."""
        fits = x.shape[0] ** 2 * x.element_size() <= dense_operator_limit(x.device)
        if not (self.shared and fits) or any(p.requires_grad for p in self.kernel.parameters()):
            return lambda V: self.matmul(x, x, V)
        K = dense_kernel_matrix(self.kernel, x)  # (n, n), no gradient

        def product(V: Tensor) -> Tensor:  # one GEMM over all latents: K is read once
            L, n, k = V.shape
            out = K @ V.to(K.dtype).permute(1, 0, 2).reshape(n, L * k)
            return out.reshape(n, L, k).permute(1, 0, 2)

        return product

    def learning_matmul(self, x: Tensor, rows: int = 1024) -> Callable[[Tensor], Tensor]:
        """V (L, n, k) ↦ K_θ(x, x) V, differentiable in the hyperparameters, for the many
        products of one kernel-learning round.

        A shared isotropic RBF/Matérn kernel k = s φ(‖x − x'‖ / ℓ) whose n × n matrix fits
        :func:`~gpscale.methods._common.dense_operator_limit` holds the distances ‖x_i − x_j‖
        (computed once, no gradient) and evaluates s φ(D / ℓ) a block of ``rows`` rows at a
        time (memory: D and one block); where a gradient is wanted the same pass forms
        (∂K/∂ℓ) V. A product and its gradient cost two GEMMs of n² k L and a few elementwise
        passes instead of n² kernel evaluations in d dimensions (several times faster at large d).
        From :data:`~gpscale.methods.iterncgp.held_distances.FLOAT32_MIN_ROWS` points the
        products run in float32
        (:func:`~gpscale.methods.iterncgp.held_distances.held_distance_matmul`).
        Otherwise the matrix-free :meth:`matmul`."""
        n = x.shape[0]
        product = None
        if self.shared and n * n * x.element_size() <= dense_operator_limit(x.device):
            product = held_distance_matmul(self.kernel, x, rows)
        return product if product is not None else (lambda V: self.matmul(x, x, V))

    def diag(self, x: Tensor) -> Tensor:
        """Prior variances k_l(x, x) as (L, t)."""
        d = kernel_diag(self.kernel, x)
        return d.expand(self.num_latents, x.shape[0])

    def dense(self, x1: Tensor, x2: Tensor) -> Tensor:
        """Dense blocks K_l(x1, x2) as (L, n1, n2) (for the subset-of-data baseline)."""
        K = kernel_matrix(self.kernel, x1, x2)
        return K.expand(self.num_latents, *K.shape[-2:])


def hyperparameter_options(init: tuple[Tensor, Tensor] | None, task: str,
                           num_classes: int | None, *, kernel: str, ard: bool, shared: bool,
                           lengthscale: Any, outputscale: Any, prefit: dict[str, Any]
                           ) -> tuple[Any, Any]:
    """Fixed lengthscale/outputscale: the given values, or placeholders 1.0 for a rebuild (no
    ``init``) whose state dict brings them. Missing values with ``init`` are an error: the SVGP
    pre-fit that supplies them (paper §C.4) is a training step, :mod:`gpscale.training.prefit`,
    run by the harness before the build. A kernel expression carries its own start values: the
    two are ``None`` or one number each (:mod:`gpscale.methods.iterncgp.composed`)."""
    if is_expression(kernel):
        return (expression_value("lengthscale", lengthscale),
                expression_value("outputscale", outputscale))
    if (lengthscale is None or outputscale is None) and init is not None:
        raise ValueError(
            "iterncgp and sod-laplace keep their kernel fixed: pass lengthscale and outputscale, "
            "or build through gpscale.training.harness.build_method (gpscale fit, "
            "GPClassifier), which fits the missing ones by an SVGP pre-fit "
            "(gpscale.training.prefit)")
    return (1.0 if lengthscale is None else lengthscale,
            1.0 if outputscale is None else outputscale)


TASKS = ("classification", "counts")
"""Tasks of ``iterncgp`` and ``sod-laplace``."""


@dataclass(frozen=True)
class PriorSetup:
    """What both factories derive from their prior options: C, likelihood, frozen kernel."""

    num_classes: int | None
    likelihood: Likelihood
    kernel: Kernel
    ard: bool
    lengthscale: Any
    outputscale: Any
    prefit_options: dict[str, Any]


def prior_setup(key: str, num_dims: int, *, task: str, num_classes: int | None,
                init: tuple[Tensor, Tensor] | None, kernel: str, ard: bool | None, shared: bool,
                lengthscale: Any, outputscale: Any, seed: int, prefit_steps: int,
                prefit_num_inducing: int, prefit_lr: float, prefit_batch_size: int
                ) -> PriorSetup:
    """Validate the task and ``init``, infer C, and build the fixed kernel (pre-fitting the
    missing hyperparameters on ``init``, see :func:`hyperparameter_options`).

    Raises:
        ValueError: a task other than :data:`TASKS`, or invalid ``init`` data.
    """
    if task not in TASKS:
        raise ValueError(f"method {key!r} does not support task {task!r}; it supports "
                         f"{', '.join(TASKS)}")
    if init is not None:
        check_x(init[0], num_dims=num_dims)
        check_xy(*init, task=task, num_classes=num_classes)
        if task == "classification" and num_classes is None:
            num_classes = max(2, int(init[1].max()) + 1)
    lik = likelihood_for_task(task, num_classes)
    ard = resolve_ard(ard, num_dims)
    prefit = dict(num_inducing=prefit_num_inducing, steps=prefit_steps, lr=prefit_lr,
                  batch_size=prefit_batch_size, seed=seed)
    lengthscale, outputscale = hyperparameter_options(
        init, task, num_classes, kernel=kernel, ard=ard, shared=shared,
        lengthscale=lengthscale, outputscale=outputscale, prefit=prefit)
    k = fixed_kernel(kernel, num_dims, ard=ard, num_latents=lik.num_latents, shared=shared,
                     lengthscale=lengthscale, outputscale=outputscale)
    return PriorSetup(num_classes, lik, k, ard, lengthscale, outputscale,
                      {f"prefit_{name}": v for name, v in prefit.items() if name != "seed"})
