r"""SoftKI on held-out rows: the score that picks its best epoch, and the calibration of β² and
the outputscale after training.

Why held out. SoftKI's m learned points (m · d parameters) fit the training rows better than
new ones, and the test error is often best well before the training loss stops falling. Every
criterion on the training rows (marginal likelihood, leave-one-out) then takes the noise for
smaller than it is, and the interpolant can stop with an outputscale far too small for the
noise it needs; on small sets the last epoch can also be far worse than the best. Rows the
points never saw measure all three (figures: docs/notes/benchmarks-2026-12.md).

The calibration. With G = W Uᵀ (UᵀU = K_zz) of the n rows conditioned on, the model
Σ = a G Gᵀ + s I scales the interpolated kernel by a and sets the noise to s. In the
eigenbasis of A = GᵀG = V Λ Vᵀ, with u = Vᵀ Gᵀ r and P = G_h V for the held-out rows,

.. math::
    μ_h = a P \frac{u}{aλ + s}, \qquad
    \operatorname{var}_h = P^{\circ 2} \frac{a s}{aλ + s} + s,

so after one O(n m²) pass and an m × m eigendecomposition the held-out NLL of any (a, s) costs
O(n_h m): a whole grid of them is two matrix products. :func:`calibrate` searches a log grid and
refines it twice around its best cell.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gpscale.kernels import kernel_matrix
from gpscale.linalg.ops import safe_cholesky, upcast
from gpscale.methods.softki.noise import NOISE_FLOOR, calibrate_noise, noise_statistics
from gpscale.metrics import coverage_slack, covering_noise_range

__all__ = ["HeldOutStatistics", "held_out_statistics", "calibrate", "holdout_rows",
           "held_out_score", "calibrate_after_training",
           "VALIDATION_FRACTION", "VALIDATION_MAX_ROWS", "VALIDATION_MIN_ROWS",
           "VALIDATION_MIN_TRAIN_ROWS",
           "MONITOR_MAX_ROWS"]

VALIDATION_FRACTION = 0.1
"""Share of the training rows SoftKI holds out by default (option ``validation``)."""
VALIDATION_MAX_ROWS = 10_000
"""At most this many rows are held out: two numbers are calibrated on them."""
VALIDATION_MIN_ROWS = 100
"""Fewer held-out rows than this: no hold-out (the training marginal likelihood calibrates β²)."""
VALIDATION_MIN_TRAIN_ROWS = 1_000
"""Fewer training rows than this: no hold-out (the training marginal likelihood calibrates β²),
as for the noise calibration of the other keys
(:data:`~gpscale.training.calibration.HELDOUT_MIN_TRAIN_ROWS`). From here on the held-out rows
buy intervals of the right width and a guard against a bad last epoch for a tenth of the rows
the points learn from."""
COVERAGE_ROUNDS = 3
"""Most moves of s into the covering range (each moves the mean a little; the next checks)."""
MONITOR_MAX_ROWS = 100_000
"""The score after each epoch conditions on at most this many training rows (a fixed random
subset), so that it costs a small part of an epoch at any n; the final calibration uses all."""

SCALE_RANGE = (1e-2, 1e4)
"""Factors a of the interpolated kernel searched (the upper end is nearly noise-free)."""

log = logging.getLogger("gpscale.methods")


def holdout_rows(n: int, fraction: float) -> int:
    """Rows to hold out of ``n`` (0: none), under :data:`VALIDATION_MAX_ROWS`,
    :data:`VALIDATION_MIN_ROWS` and :data:`VALIDATION_MIN_TRAIN_ROWS`."""
    if n < VALIDATION_MIN_TRAIN_ROWS:
        return 0
    rows = min(int(round(fraction * n)), VALIDATION_MAX_ROWS)
    return rows if rows >= VALIDATION_MIN_ROWS and rows < n else 0


@dataclass(frozen=True)
class HeldOutStatistics:
    """What the held-out NLL of any (a, s) needs (float64): λ (m,), u (m,), P (n_h, m) and the
    held-out residuals r_h (n_h,)."""

    lam: Tensor
    u: Tensor
    P: Tensor
    r_held: Tensor

    def errors(self, scale: float, noise: float) -> tuple[Tensor, Tensor]:
        """(squared held-out errors, latent variances) of the predictive with (a, s)."""
        a, s = float(scale), float(noise)
        weights = a / (a * self.lam + s)
        mean = self.P @ (weights * self.u)
        return (self.r_held - mean) ** 2, (self.P * self.P) @ (weights * s)

    def nll(self, scale: Tensor, noise: Tensor) -> Tensor:
        """Mean held-out NLL for each pair of the 1-D tensors ``scale`` and ``noise``."""
        a, s = scale.double()[None, :], noise.double()[None, :]
        lam = self.lam[:, None]
        denom = a * lam + s  # (m, k)
        mean = self.P @ (a * self.u[:, None] / denom)  # (n_h, k)
        var = (self.P * self.P) @ (a * s / denom) + s
        err = self.r_held[:, None] - mean
        return 0.5 * (torch.log(2 * math.pi * var) + err * err / var).mean(0)


def held_out_statistics(features: Callable[[Tensor], Tensor], fit: tuple[Tensor, Tensor],
                        held: tuple[Tensor, Tensor], chunk_size: int) -> HeldOutStatistics:
    """:class:`HeldOutStatistics` from ``features(x_chunk)`` = rows of G and residuals r = y − c
    of the rows conditioned on (``fit``) and held out (``held``)."""
    (x, r), (x_held, r_held) = fit, held
    A, b, _, _ = noise_statistics(features, x, r, chunk_size)
    lam, V = torch.linalg.eigh(A)
    P = torch.cat([features(x_held[i:i + chunk_size]).double() @ V
                   for i in range(0, x_held.shape[0], chunk_size)])
    return HeldOutStatistics(lam.clamp_min(0), V.mT @ b, P, r_held.double())


def calibrate(stats: HeldOutStatistics, *, noise_floor: float,
              fit_scale: bool = True) -> tuple[float, float, float]:
    """(held-out NLL, a, s) minimising :meth:`HeldOutStatistics.nll`; a = 1 unless
    ``fit_scale``. s ranges from ``noise_floor`` to 10 var(r_h), and is then moved into the
    range where the held-out 95 % intervals cover 95 % ± ``coverage_slack`` of the rows
    (:func:`~gpscale.metrics.covering_noise_range`; the NLL's best s matches the errors'
    spread, not their quantile)."""
    on = dict(dtype=torch.float64, device=stats.P.device)
    spread = max(float(stats.r_held.var()) if stats.r_held.numel() > 1 else 1.0, noise_floor)
    lo_s, hi_s = math.log(noise_floor), math.log(10 * spread)
    lo_a, hi_a = (math.log(SCALE_RANGE[0]), math.log(SCALE_RANGE[1])) if fit_scale else (0, 0)
    best = (math.inf, 0.0, 0.0)
    for points in (24, 9, 9, 9):  # a coarse grid, then finer ones around its best cell
        grid_a = torch.linspace(lo_a, hi_a, points if fit_scale else 1, **on)
        grid_s = torch.linspace(lo_s, hi_s, points, **on)
        la, ls = torch.meshgrid(grid_a, grid_s, indexing="ij")
        values = stats.nll(la.reshape(-1).exp(), ls.reshape(-1).exp())
        values = torch.where(torch.isfinite(values), values, torch.inf)
        k = int(values.argmin())
        if float(values[k]) < best[0]:
            best = (float(values[k]), float(la.reshape(-1)[k]), float(ls.reshape(-1)[k]))
        step_a = (hi_a - lo_a) / max(points - 1, 1)
        step_s = (hi_s - lo_s) / max(points - 1, 1)
        lo_a = max(best[1] - step_a, math.log(SCALE_RANGE[0])) if fit_scale else 0.0
        hi_a = min(best[1] + step_a, math.log(SCALE_RANGE[1])) if fit_scale else 0.0
        lo_s, hi_s = max(best[2] - step_s, math.log(noise_floor)), best[2] + step_s
    a, s = math.exp(best[1]), math.exp(best[2])
    for _ in range(COVERAGE_ROUNDS):  # s into the range where the intervals cover 95 %
        lo, hi = covering_noise_range(*stats.errors(a, s), coverage_slack(stats.r_held.numel()))
        moved = min(max(s, lo, noise_floor), max(hi, noise_floor))
        if moved == s:
            break
        s = moved
    if s == math.exp(best[2]):
        return best[0], a, s
    one = dict(dtype=torch.float64, device=stats.P.device)
    return float(stats.nll(torch.tensor([a], **one), torch.tensor([s], **one))[0]), a, s


def _features(model: Any) -> Callable[[Tensor], Tensor]:
    """``x_chunk -> G`` (float64) of a SoftKI model at its current points and kernel."""
    z = model.inducing_points.detach()
    U = safe_cholesky(kernel_matrix(model.kernel, upcast(z), upcast(z)), name="SoftKI K_zz").mT
    return lambda xc: model.weights(xc, z).double() @ U.mT


def _scalable(model: Any) -> bool:
    return hasattr(model.kernel, "outputscale")


def _residuals(model: Any, rows: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    x, y = rows
    return x, y.to(x.dtype) - model.mean_constant


def held_out_score(fit: tuple[Tensor, Tensor], held: tuple[Tensor, Tensor], *,
                   seed: int = 0) -> Callable[[Any], dict[str, float]]:
    """The per-epoch score of :class:`~gpscale.training.validation.Validation`: the held-out
    NLL after :func:`calibrate`, conditioned on at most :data:`MONITOR_MAX_ROWS` of the
    ``fit`` rows (a fixed random subset)."""
    x, y = fit
    if x.shape[0] > MONITOR_MAX_ROWS:
        pick = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
        pick = pick[:MONITOR_MAX_ROWS].to(x.device)
        x, y = x[pick], y[pick]

    def score(model: Any) -> dict[str, float]:
        stats = held_out_statistics(_features(model), _residuals(model, (x, y)),
                                    _residuals(model, held), model.chunk_size)
        nll, a, s = calibrate(stats, noise_floor=NOISE_FLOOR, fit_scale=_scalable(model))
        return {"heldout_nll": nll, "heldout_scale": a, "heldout_noise": s}

    return score


def calibrate_after_training(model: Any, x: Tensor, y: Tensor, reduce: Any,
                             held: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]] | None
                             ) -> dict[str, float]:
    """Set SoftKI's β² (and with ``held`` = (fit rows, held-out rows) its outputscale) after
    training; returns what changed, for the history.

    With held-out rows: (a, s) of :func:`calibrate` with every fit row conditioned on; the
    kernel's outputscale is multiplied by a and β² set to s. Without: β² maximises the marginal
    likelihood of (x, y) (:mod:`~gpscale.methods.softki.noise`); ``reduce`` sums its statistics
    over the ranks of a data-parallel run.
    """
    trained = float(model.noise)
    if held is None:
        x, r = _residuals(model, (x, y))
        stats = noise_statistics(_features(model), x, r, model.chunk_size)
        if reduce is not None:
            stats = tuple(reduce(t) for t in stats)
        calibrated = calibrate_noise(*stats)
        model.log_noise.data.fill_(math.log(calibrated))
        return {"noise_trained": trained, "noise_calibrated": calibrated}
    fit, out = held
    stats = held_out_statistics(_features(model), _residuals(model, fit),
                                _residuals(model, out), model.chunk_size)
    nll, a, s = calibrate(stats, noise_floor=NOISE_FLOOR, fit_scale=_scalable(model))
    if _scalable(model):
        model.kernel.outputscale = model.kernel.outputscale * a
    model.log_noise.data.fill_(math.log(s))
    if a >= 0.99 * SCALE_RANGE[1]:
        log.info("SoftKI's held-out calibration took the largest outputscale factor searched "
                 "(%g): the held-out rows ask for a nearly noise-free interpolant", a)
    return {"noise_trained": trained, "noise_calibrated": s, "outputscale_factor": a,
            "final_heldout_nll": nll, "heldout_rows": float(out[0].shape[0])}
