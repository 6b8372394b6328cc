"""The probe ``method="auto"`` runs before it chooses between a minibatch inducing-point method
and CaGP-Opt (:func:`gpscale.methods.auto.choose_method`): a few seconds that say whether what
the inducing points miss would dominate the test error.

An exact GP is fitted to :data:`PROBE_POINTS` random training points (the pre-fit's code,
:func:`gpscale.training.prefit.exact_prefit`, with its held-out choice of the noise, stopping
once its loss gains less than its noise: seconds, where running its epochs out takes
minutes), and its mean squared error on up to 500 other training points is the
probe's ``error``. At its hyperparameters, :data:`PROBE_INDUCING` k-means centres of the
training inputs (SVGP's default inducing points and their initialisation) leave a Nyström
residual k(x, x) − k_xZ K_ZZ⁻¹ k_Zx at each training point; its mean over up to
:data:`RESIDUAL_POINTS` points, divided by ``error``, is the probe's ratio ρ. Where ρ is small
the inducing points add little to the error a small exact GP already makes (noise, or a function
1,000 points cannot pin down); where it is large, a target the small GP predicts closely, their
error would dominate and a computation-aware method gains (BENCHMARKS "auto on the clock").
Inputs and target are standardised inside the probe; ρ does not depend on their units.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gpscale.kernels import kernel_diag, kernel_matrix, make_kernel
from gpscale.methods._common import kmeans_points
from gpscale.methods.auto import PROBE_METHOD, Probe
from gpscale.training.prefit import exact_prefit

if TYPE_CHECKING:
    from gpytorch.kernels import Kernel

__all__ = ["inducing_probe", "mean_nystrom_residual", "PROBE_POINTS", "PROBE_INDUCING",
           "RESIDUAL_POINTS", "PROBE_EPOCHS"]

log = logging.getLogger("gpscale.fit.prefit")

PROBE_POINTS = 1000
"""Training points of the probe's exact GP (a few seconds on a CPU)."""
PROBE_INDUCING = 512
"""Inducing points whose residual the probe measures: SVGP's and SOLVE-GP's default count."""
RESIDUAL_POINTS = 2000
"""Most training points over which the residual is averaged."""
PROBE_EPOCHS = 30
"""Most L-BFGS epochs of the probe's exact GP (the pre-fit's cap)."""


def inducing_probe(x: Tensor, y: Tensor, *, kernel: str = "matern32", seed: int = 0,
                   size: int = PROBE_POINTS, num_inducing: int = PROBE_INDUCING) -> Probe:
    """Fit the probe's exact GP to ``size`` of the rows of ``x`` (n, d) and ``y`` (n,) and
    measure what ``num_inducing`` k-means inducing points leave unexplained (module docstring).

    Raises:
        ValueError: fewer than 4 rows, or a constant target.
    """
    tic = time.perf_counter()
    n = x.shape[0]
    if n < 4:
        raise ValueError(f"the probe needs at least 4 training points; got {n}")
    xd, yd = x.detach().double().cpu(), y.detach().double().cpu()
    scale = yd.std()
    if not torch.isfinite(scale) or scale <= 0:
        raise ValueError("the probe needs a target that varies; every training target is "
                         f"{float(yd[0]):g}")
    xd = (xd - xd.mean(0)) / xd.std(0).clamp_min(1e-12)
    yd = (yd - yd.mean()) / scale
    found = exact_prefit(xd, yd, method=PROBE_METHOD, kernel=kernel, ard=True, size=size,
                         seed=seed, max_epochs=PROBE_EPOCHS, quiet=True, stop_on_noise=True)
    k = make_kernel(kernel, x.shape[1], ard=True).double()
    k.base_kernel.lengthscale = torch.as_tensor(found["lengthscale"], dtype=torch.float64)
    k.outputscale = found["outputscale"]
    m = max(1, min(num_inducing, n // 2))
    z = kmeans_points(xd, m, seed=seed, max_points=10_000)
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))[:RESIDUAL_POINTS]
    residual = mean_nystrom_residual(k, z, xd[rows])
    probe = Probe(noise=found["noise"], outputscale=found["outputscale"], residual=residual,
                  num_inducing=m, points=min(size, n), seconds=time.perf_counter() - tic,
                  error=found.get("heldout_mse", math.nan))
    log.debug("probe: %s", probe.describe())
    return probe


def mean_nystrom_residual(kernel: Kernel, z: Tensor, x: Tensor, jitter: float = 1e-8) -> float:
    """mean over the rows of ``x`` of k(x, x) − k_xZ (K_ZZ + jitter·s·I)⁻¹ k_Zx for a stationary
    ``kernel`` of outputscale s (so k(x, x) = s), in float64, clamped at 0."""
    with torch.no_grad():
        s = float(kernel_diag(kernel, x[:1]).reshape(-1)[0])
        kzz = kernel_matrix(kernel, z, z)
        kzz = kzz + jitter * s * torch.eye(z.shape[0], dtype=kzz.dtype)
        factor = torch.linalg.cholesky(kzz)
        a = torch.linalg.solve_triangular(factor, kernel_matrix(kernel, z, x), upper=False)
        return float((s - (a * a).sum(0)).clamp_min(0).mean())
