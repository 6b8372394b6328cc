r"""Predictive intervals checked and the noise calibrated on rows the training never saw.

A Gaussian-likelihood model whose noise σ² is learned by small optimiser steps (the grid
methods' Adam on a stochastic log-determinant) can end its budget with σ² far from where the
data put it: too large from a large start (intervals too wide), or too small where the kernel
has overfitted the training rows (intervals far too narrow). A method that declares
``heldout_noise`` (:class:`~gpscale.methods.base.Method`) trains on all but
:func:`heldout_rows` of its rows; after training, :func:`calibrate_noise` sets σ² to the value
whose predictive, conditioned on the rows trained on, has the smallest negative log density on
the held-out rows while its 95 % intervals cover 95 % of them (within
:func:`~gpscale.metrics.coverage_slack`; a fixed point of a few conditionings), and the
harness then conditions on every row.

:func:`interval_coverage` and :func:`coverage_tolerance` say whether a predictive's central
95 % intervals cover what they should on a given number of rows.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import torch
from torch import Tensor

from gpscale.errors import CalibrationWarning
from gpscale.metrics import COVERAGE_BAR, COVERAGE_SLACK, coverage_slack, covering_noise_range

__all__ = ["heldout_rows", "calibrate_noise", "interval_coverage", "coverage_tolerance",
           "coverage_message",
           "HELDOUT_FRACTION", "HELDOUT_MIN_ROWS", "HELDOUT_MAX_ROWS", "HELDOUT_MIN_TRAIN_ROWS",
           "NOISE_ROUNDS", "NOISE_TOLERANCE", "COVERAGE_SLACK"]

log = logging.getLogger("gpscale.training")

HELDOUT_FRACTION = 0.1
"""Share of the training rows held out to calibrate σ² by."""
HELDOUT_MIN_ROWS = 100
"""Fewest rows held out: fewer estimate one variance too coarsely."""
HELDOUT_MAX_ROWS = 2_000
"""Most rows held out: one number is calibrated on them (its standard error ~3 % at 2,000)."""
HELDOUT_MIN_TRAIN_ROWS = 1_000
"""Below this many training rows nothing is held out."""
NOISE_ROUNDS = 4
"""Most conditionings of the fixed point that calibrates σ²."""
NOISE_TOLERANCE = 0.05
"""The fixed point stops once σ² changes by less than this share of itself."""
Z95 = 1.959963984540054
"""The central 95 % interval of a Gaussian is mean ± Z95 · std."""


def heldout_rows(n: int) -> int:
    """Rows of ``n`` to hold out for the noise calibration (0: none)."""
    if n < HELDOUT_MIN_TRAIN_ROWS:
        return 0
    return min(max(int(round(HELDOUT_FRACTION * n)), HELDOUT_MIN_ROWS), HELDOUT_MAX_ROWS)


def interval_coverage(mean: Tensor, variance: Tensor, y: Tensor) -> float:
    """Fraction of ``y`` inside the central 95 % interval of N(mean, variance)."""
    inside = (y.double() - mean.double()).abs() <= Z95 * variance.double().clamp_min(0).sqrt()
    return float(inside.double().mean())


def coverage_tolerance(rows: int) -> float:
    """How far the coverage of 95 % intervals on ``rows`` rows may stray from 0.95 before it
    says the intervals are wrong: 2.5 points, or three binomial standard errors where the
    rows are too few for that."""
    return max(COVERAGE_BAR, 3 * math.sqrt(0.95 * 0.05 / max(rows, 1)))


def _heldout_predictive(model: Any, fit: tuple[Tensor, Tensor], held: tuple[Tensor, Tensor],
                        noise: float) -> tuple[Tensor, Tensor]:
    """(squared held-out errors, latent variances) of the predictive conditioned on ``fit``
    with σ² = ``noise``; float64."""
    model.set_noise(noise)
    pred = model.predict(model.posterior(*fit), held[0])
    return (held[1].double() - pred.mean.double()) ** 2, pred.variance.double().clamp_min(0)


def _nll(err2: Tensor, latent: Tensor, noise: Tensor | float) -> Tensor:
    var = latent[:, None] + torch.as_tensor(noise, dtype=torch.float64).reshape(1, -1)
    return 0.5 * (torch.log(2 * math.pi * var) + err2[:, None] / var).mean(0)


def _best_noise(err2: Tensor, latent: Tensor, floor: float) -> float:
    """σ² ≥ ``floor`` minimising the held-out NLL with the predictive mean and latent variance
    held fixed, then moved into the range where the held-out 95 % intervals cover 95 % ±
    :func:`~gpscale.metrics.coverage_slack` of the rows
    (:func:`~gpscale.metrics.covering_noise_range`)."""
    lo, hi = covering_noise_range(err2, latent, coverage_slack(err2.numel()))
    return min(max(_nll_noise(err2, latent, floor), lo, floor), max(hi, floor))


def _nll_noise(err2: Tensor, latent: Tensor, floor: float) -> float:
    """σ² ≥ ``floor`` minimising the held-out NLL with the predictive mean and latent variance
    held fixed: a log grid refined three times (each a vector operation)."""
    lo, hi = math.log(floor), math.log(max(10 * float(err2.mean()), 10 * floor))
    best = (math.inf, lo)
    for points in (64, 17, 17, 17):
        grid = torch.linspace(lo, hi, points, dtype=torch.float64)
        values = _nll(err2, latent, grid.exp())
        k = int(torch.where(torch.isfinite(values), values, torch.inf).argmin())
        if float(values[k]) < best[0]:
            best = (float(values[k]), float(grid[k]))
        step = (hi - lo) / (points - 1)
        lo, hi = max(best[1] - step, math.log(floor)), best[1] + step
    return math.exp(best[1])


def calibrate_noise(model: Any, fit: tuple[Tensor, Tensor], held: tuple[Tensor, Tensor],
                    *, floor: float) -> dict[str, float]:
    """Set ``model``'s σ² by the held-out rows (not below ``floor``); returns what it found, for
    the history: the noise trained and calibrated, and the held-out coverage of the 95 %
    intervals before and after.

    A fixed point: σ² minimises the held-out NLL of the predictive mean and latent variance
    that σ² itself conditions, within the range where the held-out intervals cover 95 % ±
    :func:`~gpscale.metrics.coverage_slack` of the rows; each round conditions on ``fit``
    once, and the rounds stop when σ² moves by less than :data:`NOISE_TOLERANCE` of itself (at most
    :data:`NOISE_ROUNDS`)."""
    trained = float(model.noise.detach().reshape(-1)[0])
    noise, first = trained, None
    for _ in range(NOISE_ROUNDS):
        err2, latent = _heldout_predictive(model, fit, held, noise)
        if first is None:
            first = (err2, latent)
        new = _best_noise(err2, latent, floor)
        moved = abs(math.log(new / noise))
        noise = new
        if moved < math.log1p(NOISE_TOLERANCE):
            break
    err2, latent = _heldout_predictive(model, fit, held, noise)
    before = _coverage_of(*first, trained)
    after = _coverage_of(err2, latent, noise)
    log.info("noise calibrated on %d held-out rows: %.4g -> %.4g (95%% intervals covered "
             "%.1f%% of them, now %.1f%%)", held[0].shape[0], trained, noise,
             100 * before, 100 * after)
    if abs(after - 0.95) > coverage_tolerance(held[0].shape[0]):
        warnings.warn(f"the 95% predictive intervals cover {100 * after:.1f}% of the "
                      f"{held[0].shape[0]:,} held-out rows even with the noise calibrated on "
                      f"them (σ² {noise:.4g}): the predictive variance itself is off; treat "
                      "the intervals with care", CalibrationWarning, stacklevel=3)
    return {"noise_trained": trained, "noise_calibrated": noise,
            "heldout_coverage_trained": before, "heldout_coverage": after,
            "heldout_rows": float(held[0].shape[0])}


def _coverage_of(err2: Tensor, latent: Tensor, noise: float) -> float:
    return float((err2 <= Z95**2 * (latent + noise)).double().mean())


def coverage_message(method: str, coverage: float | None, rows: int,
                     stopped: str | None = None) -> str | None:
    """A one-line warning when the 95 % intervals covered ``coverage`` of ``rows`` test rows,
    further from 0.95 than :func:`coverage_tolerance` allows; ``None`` when they did not (or
    when there is no coverage to judge)."""
    if coverage is None or not math.isfinite(coverage) or rows < 1:
        return None
    tolerance = coverage_tolerance(rows)
    if abs(coverage - 0.95) <= tolerance:
        return None
    side = "too wide" if coverage > 0.95 else "too narrow"
    why = (" training stopped on its time budget before converging (a longer --max-time may "
           "calibrate them);" if stopped == "time" else "")
    return (f"{method}: the 95% predictive intervals covered {100 * coverage:.1f}% of the "
            f"{rows:,} test rows, not 95% ± {100 * tolerance:.1f}%: they are {side};{why} "
            "treat this model's uncertainty with care (metrics.json: test_coverage)")
