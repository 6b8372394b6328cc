"""Pieces shared by the method families (GPyTorch baselines, CaGP, and later methods).

- :func:`prior_options` resolves the options every baseline takes (kernel, ARD, initial
  hyperparameters) and :func:`prior_modules` builds GPyTorch's constant mean and scaled kernel
  from them.
- :func:`kmeans_points` initialises inducing points (scikit-learn k-means on a seeded subsample).
- :func:`gpytorch_mode` runs one computation with GPyTorch modules in train or eval mode and
  restores the caller's flags afterwards (GPyTorch switches behaviour on ``.training``).
- :func:`translate_cholesky_errors` turns linear_operator's ``NotPSDError`` into our
  :class:`~gpscale.errors.NumericalError`.
- :func:`dense_operator_limit` is how many bytes a method may spend on holding an n × n kernel
  matrix for gradient-free products (CaGP-CG's CG operator, IterNCGP's training products).

Default initial hyperparameters, chosen for standardised inputs and targets:

==============  ===========================================================================
lengthscale     √d per input dimension: for standardised inputs the mean squared distance
                between two points is 2d, so ℓ = √d puts typical scaled distances at √2
                whatever d (ℓ = 1 would start a high-dimensional kernel nearly diagonal and
                cost the first epochs' learning)
outputscale     var(y) for regression with ``init`` data, else 1.0
noise           0.1 var(y) for regression with ``init`` data, else 0.1 (a variance, σ²)
mean constant   mean(y) for regression with ``init`` data, else 0
==============  ===========================================================================
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from typing import Any

import gpytorch
import torch
from linear_operator.utils.errors import NotPSDError
from torch import Tensor, nn

from gpscale.errors import NumericalError
from gpscale.kernels import build_kernel, is_expression, make_kernel
from gpscale.methods.auto import available_memory
from gpscale.methods.options import PREFIT_OPTIONS
from gpscale.validation import check_num_points, check_x, check_xy

__all__ = [
    "check_task_and_init", "default_size", "follow_init", "prior_options", "prior_modules",
    "gaussian_likelihood", "set_gaussian_noise", "HeldOutNoise", "kmeans_points",
    "inducing_options",
    "initial_inducing_points",
    "resolve_num_classes", "gpytorch_mode", "translate_cholesky_errors", "pop_prefit_options",
    "DENSE_OPERATOR_BYTES", "dense_operator_limit",
]

DEFAULT_NOISE_FRACTION = 0.1

DENSE_OPERATOR_BYTES = 2**33
"""The largest kernel matrix (bytes) a method holds for gradient-free products (CaGP-CG's
:class:`~gpscale.methods.cagp.cg.KernelOperator`, IterNCGP's training products), further
limited to half the memory free at the time (:func:`dense_operator_limit`): 8 GiB holds
n ≤ 46,340 in float32 (n ≤ 32,768 in float64)."""


def check_task_and_init(key: str, task: str, tasks: tuple[str, ...], num_dims: int,
                        init: tuple[Tensor, Tensor] | None,
                        num_classes: int | None = None) -> None:
    """Raise ``ValueError`` for an unsupported ``task`` or invalid ``init`` data."""
    if task not in tasks:
        raise ValueError(f"method {key!r} does not support task {task!r}; it supports "
                         f"{', '.join(tasks)}")
    if init is not None:
        check_x(init[0], num_dims=num_dims)
        check_xy(*init, task=task, num_classes=num_classes)


def follow_init(model: nn.Module, init: tuple[Tensor, Tensor] | None) -> Any:
    """Move ``model`` to the dtype and device of the ``init`` inputs (unchanged without init)."""
    return model if init is None else model.to(device=init[0].device, dtype=init[0].dtype)


def prior_options(init: tuple[Tensor, Tensor] | None, task: str, num_dims: int, *,
                  kernel: str = "matern32", ard: bool = True, lengthscale: float | None = None,
                  outputscale: float | None = None, noise: float | None = None,
                  mean_constant: float | None = None) -> dict[str, Any]:
    """Resolve the prior and noise options of a baseline (see the module table for defaults).

    Args:
        init: training data ``(x, y)`` for data-dependent defaults, or ``None``.
        task: ``"regression"`` enables the data-dependent outputscale, noise and mean.
        num_dims: input dimension d (the default lengthscale is √d).
        kernel: a name of :data:`gpscale.kernels.KERNELS`, an expression, or a GPyTorch
            kernel object (its own hyperparameters, in the model's standardised units).
        ard: one lengthscale per input dimension.
        lengthscale: initial lengthscale(s); ``None`` for √d.
        outputscale: initial kernel variance; ``None`` for the default.
        noise: initial Gaussian noise variance σ²; ``None`` for the default.
        mean_constant: initial constant prior mean; ``None`` for the default.

    Returns:
        JSON-like dict of the resolved values, to be stored in ``model.options``.

    Raises:
        ValueError: ``lengthscale`` with a kernel expression (its leaves take start values).
    """
    own = isinstance(kernel, gpytorch.kernels.Kernel)  # the user's own kernel object
    if (is_expression(kernel) or own) and lengthscale is not None:
        raise ValueError("lengthscale sets the start of a named kernel; give a composed "
                         "kernel's in its expression, e.g. 'rbf(0, lengthscale=2) + linear(1)', "
                         "and a kernel object's in the object")
    var_y, mean_y = 1.0, 0.0
    if init is not None and task == "regression":
        y = init[1].double()
        var_y = float(y.var()) if y.numel() > 1 else 1.0
        var_y = var_y if var_y > 0 else 1.0
        mean_y = float(y.mean())
    return {
        "kernel": kernel,
        "ard": bool(ard),
        "lengthscale": (None if is_expression(kernel) or own
                        else _lengthscale_value(lengthscale, num_dims, ard)),
        "outputscale": float(var_y if outputscale is None else outputscale),
        "noise": float(DEFAULT_NOISE_FRACTION * var_y if noise is None else noise),
        "mean_constant": float(mean_y if mean_constant is None else mean_constant),
    }


def _lengthscale_value(value: Any, num_dims: int, ard: bool) -> float | list[float]:
    """The initial lengthscale option: √d when ``None``, a float, or (with ``ard``) a list of
    d floats, one per input; a list of one value is that value."""
    if value is None:
        return float(math.sqrt(num_dims))
    if not isinstance(value, (list, tuple)):
        return float(value)
    values = [float(v) for v in value]
    if len(values) == 1:
        return values[0]
    if not ard or len(values) != num_dims:
        raise ValueError(f"lengthscale takes one value, or one per input dimension with "
                         f"ard=true ({num_dims} here); got {len(values)} values with "
                         f"ard={bool(ard)}")
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"lengthscales must be positive and finite; got {values}")
    return values


def pop_prefit_options(options: dict[str, Any]) -> dict[str, Any]:
    """Remove the :data:`PREFIT_OPTIONS` from a factory's keyword ``options`` and return them,
    defaults filled in (the factory records them; the harness acts on them)."""
    return {o.name: options.pop(o.name, o.default) for o in PREFIT_OPTIONS}


def prior_modules(num_dims: int, opts: dict[str, Any], batch_shape: torch.Size | None = None
                  ) -> tuple[gpytorch.means.ConstantMean, gpytorch.kernels.Kernel]:
    """GPyTorch's constant mean and scaled kernel, initialised from :func:`prior_options`.

    ``batch_shape`` (e.g. ``torch.Size([C])``) gives C independent means and kernels.
    """
    batch_shape = torch.Size() if batch_shape is None else batch_shape
    mean = gpytorch.means.ConstantMean(batch_shape=batch_shape)
    mean.initialize(constant=opts["mean_constant"])
    if isinstance(opts["kernel"], gpytorch.kernels.Kernel):  # the user's own: a copy of it
        if batch_shape != torch.Size():
            raise ValueError("a kernel object serves one GP; this method needs a batch of "
                             f"{tuple(batch_shape)} kernels: give a name or an expression")
        return mean, copy.deepcopy(opts["kernel"])
    if is_expression(opts["kernel"]):  # start values in the expression, the rest by default
        kernel = build_kernel(opts["kernel"], num_dims, batch_shape=batch_shape,
                              outputscale=opts["outputscale"])
        return mean, kernel
    kernel = make_kernel(opts["kernel"], num_dims, ard=opts["ard"], batch_shape=batch_shape)
    # make_kernel returns ScaleKernel(base); initialise through GPyTorch's dotted names.
    kernel.initialize(**{"outputscale": opts["outputscale"],
                         "base_kernel.lengthscale": torch.as_tensor(opts["lengthscale"])})
    return mean, kernel


def gaussian_likelihood(noise: float) -> gpytorch.likelihoods.GaussianLikelihood:
    """GPyTorch's homoscedastic Gaussian likelihood with noise variance ``noise`` (σ² ≥ 1e-4)."""
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.initialize(noise=noise)
    return likelihood


def set_gaussian_noise(likelihood: gpytorch.likelihoods.GaussianLikelihood,
                       value: float) -> None:
    """Set a Gaussian likelihood's σ² to ``value``, kept just above its lower bound."""
    floor = float(likelihood.noise_covar.raw_noise_constraint.lower_bound)
    with torch.no_grad():
        likelihood.noise = torch.full_like(likelihood.noise, max(value, 1.01 * floor))


class HeldOutNoise:
    """Mixin of a regression method whose GPyTorch Gaussian ``likelihood`` holds σ² and whose
    σ² the harness calibrates on held-out rows after training (``Method.heldout_noise``).

    For the methods whose objective lets σ² absorb what the approximation cannot represent (a
    collapsed or evidence bound with few inducing points or actions) or whose σ² a time budget
    stops on its way (Adam on a stochastic log-determinant), the trained σ² makes the
    intervals too wide or too narrow; the held-out rows measure the noise the predictive
    needs."""

    heldout_noise = True

    @property
    def noise(self) -> Tensor:
        """σ², a scalar."""
        return self.likelihood.noise.squeeze(-1)

    def set_noise(self, value: float) -> None:
        set_gaussian_noise(self.likelihood, value)


def default_size(value: int | None, num_points: int | None, cap: int, divisor: int,
                 name: str) -> int:
    """``value``, or when it is ``None`` ``min(cap, n // divisor)`` (at least 1) for n points.

    Inducing points and actions default to a number that scales with small data sets (a fixed
    512 fails on every set of fewer than 512 training points) and is ``cap`` from
    ``cap · divisor`` points on.
    """
    if value is not None:
        return int(value)
    if num_points is None:
        raise ValueError(f"{name} must be given when no init data is")
    return max(1, min(cap, int(num_points) // divisor))


def inducing_options(init: tuple[Tensor, Tensor] | None, *, num_inducing: int | None = None,
                     seed: int = 0, kmeans_max_points: int = 10_000) -> dict[str, Any]:
    """Resolve and check the inducing-point options (k-means needs n ≥ ``num_inducing``);
    ``num_inducing=None`` is min(512, n/2) (:func:`default_size`)."""
    num_inducing = default_size(num_inducing, None if init is None else init[0].shape[0], 512,
                                2, "num_inducing")
    if num_inducing < 1:
        raise ValueError(f"num_inducing must be positive; got {num_inducing}")
    if kmeans_max_points < num_inducing:
        raise ValueError(f"kmeans_max_points ({kmeans_max_points}) must be at least "
                         f"num_inducing ({num_inducing})")
    if init is not None:
        check_num_points(init[0].shape[0], num_inducing, "inducing points")
    return {"num_inducing": int(num_inducing), "seed": int(seed),
            "kmeans_max_points": int(kmeans_max_points)}


def initial_inducing_points(init: tuple[Tensor, Tensor] | None, num_dims: int,
                            opts: dict[str, Any]) -> Tensor:
    """(m, d) k-means centres of the ``init`` inputs, or zeros (to be loaded) without init.

    ``opts`` is the dict of :func:`inducing_options`.
    """
    if init is None:
        return torch.zeros(opts["num_inducing"], num_dims)
    return kmeans_points(init[0], opts["num_inducing"], seed=opts["seed"],
                         max_points=opts["kmeans_max_points"])


def resolve_num_classes(task: str, num_classes: int | None,
                        init: tuple[Tensor, Tensor] | None) -> int | None:
    """C for classification (from the ``init`` labels, max + 1 and at least 2, when not given)."""
    if task != "classification":
        return None
    if num_classes is None:
        if init is None:
            raise ValueError("classification needs num_classes when init is None")
        num_classes = max(2, int(init[1].max()) + 1)
    if num_classes < 2:
        raise ValueError(f"classification needs at least 2 classes; got {num_classes}")
    return int(num_classes)


def kmeans_points(x: Tensor, num_points: int, *, seed: int, max_points: int) -> Tensor:
    """k-means centres of ``x`` (n, d), fitted on a seeded subsample of at most ``max_points`` rows.

    Returns:
        (num_points, d) centres on the device and in the dtype of ``x``.
    """
    from sklearn.cluster import KMeans  # scikit-learn (with scipy) takes seconds to import

    n = x.shape[0]
    rows = torch.arange(n)
    if n > max_points:
        rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_points]
    sample = x.detach()[rows.to(x.device)].double().cpu().numpy()
    km = KMeans(n_clusters=num_points, n_init=1, random_state=seed).fit(sample)
    return torch.as_tensor(km.cluster_centers_).to(device=x.device, dtype=x.dtype)


@contextlib.contextmanager
def gpytorch_mode(module: nn.Module, training: bool) -> Iterator[None]:
    """Run GPyTorch submodules of ``module`` in train (``True``) or eval mode, then restore.

    GPyTorch switches behaviour on ``.training``: ``InducingPointKernel`` adds Titsias' trace term
    only in train mode and refuses cross-covariances there; variational strategies and the
    inducing-point kernel memoise K_zz factors in eval mode. The baselines choose the mode per
    computation instead of inheriting the caller's. GPyTorch's ``train()`` drops eval-mode memos,
    and it is called on the way in and out, so nothing computed here outlives the call; the
    caller's flags are then restored as they were.
    """
    flags = [(m, m.training) for m in module.modules()]
    module.train(True)
    module.train(training)
    try:
        yield
    finally:
        module.train(True)
        for m, flag in flags:
            m.training = flag


@contextlib.contextmanager
def translate_cholesky_errors(what: str, hint: str) -> Iterator[None]:
    """Re-raise linear_operator's ``NotPSDError`` as :class:`NumericalError` with ``hint``."""
    try:
        yield
    except NotPSDError as err:
        raise NumericalError(f"Cholesky factorisation of the {what} failed after GPyTorch's "
                             f"jitter retries ({err}). {hint}") from err


def dense_operator_limit(device: torch.device | None = None) -> int:
    """Bytes a held kernel matrix may take on ``device``: :data:`DENSE_OPERATOR_BYTES`, at
    most half the memory free there now (host memory where the system says; a CUDA device's
    own free memory)."""
    if device is not None and device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = available_memory()
    return DENSE_OPERATOR_BYTES if free is None else min(DENSE_OPERATOR_BYTES, free // 2)
