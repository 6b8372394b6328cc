r"""CaGP-Opt's intervals, calibrated on rows left out of its posterior.

CaGP's latent variance K_i(x, x) is the exact posterior's variance plus the computational
uncertainty of conditioning on i projections of the data, a bound on the error the few actions
leave. Where the noise is small next to the signal that bound dominates the predictive, and it
is loose: the 95 % intervals of a converged CaGP-Opt cover nearly every test row and its
predictive density is far lower than its errors warrant. Where the actions have not converged
(a time budget on many rows) the intervals can also be too narrow.

After training, :func:`calibrate_scale` leaves a tenth of the rows (:func:`held_rows`) out of
the posterior by zeroing their action entries: with their rows of S at zero they enter no
quantity of Alg. S2 (Sᵀr, SᵀK̂S, K S at the other rows), so the posterior is the one that
conditions on the other rows with the same actions and hyperparameters, and those rows are new
to it. Every block keeps at least one row on, so no action is emptied. On them it fits two
factors (:func:`fit_factors`): c of the latent variance and b of the noise in the predictive
c · K_i(x, x) + b · σ², those with the smallest negative log predictive density, then moved
into the range where their 95 % intervals cover 95 % ± :data:`~gpscale.metrics.COVERAGE_SLACK`
of them; the model predicts with them from the posterior on every row. The posterior itself
(its mean, and the σ² it conditions with) stays the ELBO's. The noise's factor matters where
the data are nearly noiseless: the ELBO's σ² then sits at the likelihood's floor of 10⁻⁴,
which alone gives intervals wider than the errors, and a predictive noise below it has no
numerical role.

The hyperparameters and the other rows' entries were trained with the left-out rows in the
data; with a handful of hyperparameters and a tenth of the rows that optimism is small, and a
block that lost rows projects less of the data than it was trained to, which errs towards
wider intervals. ``-o calibrate=off`` keeps the ELBO's variance as the paper defines it.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import torch
from torch import Tensor

from gpscale.errors import CalibrationWarning
from gpscale.linalg.operators.block_sparse import BlockLayout, BlockSparseActions
from gpscale.metrics import COVERAGE_SLACK, coverage, covering_noise_range, covering_scale_range

__all__ = ["CALIBRATIONS", "HELD_FRACTION", "HELD_MIN_ROWS", "HELD_MAX_ROWS", "MIN_ROWS",
           "FACTOR_BOUNDS", "held_rows", "fit_factors", "calibrate_scale", "unit_scale_if_absent"]

log = logging.getLogger("gpscale.methods")

CALIBRATIONS = ("heldout", "off")
"""Values of CaGP-Opt's ``calibrate`` option."""
HELD_FRACTION = 0.1
"""Share of the training rows left out of the posterior to calibrate the variance by."""
HELD_MIN_ROWS = 100
"""Fewest rows left out."""
HELD_MAX_ROWS = 2_000
"""Most rows left out: one factor is fitted on them (its standard error ~3 % at 2,000)."""
MIN_ROWS = 1_000
"""Below this many training rows the variance is not calibrated."""
FACTOR_BOUNDS = (1e-4, 1e2)
"""The factors of the latent variance and of the noise searched."""
LEVEL = 0.95


def held_rows(layout: BlockLayout, count: int, seed: int = 0) -> Tensor:
    """``count`` positions in block order drawn under ``seed``, never a block's first: every
    block keeps a row (fewer where the blocks have fewer spare rows), sorted."""
    ids = layout.block_ids()
    spare = torch.nonzero(ids[1:] == ids[:-1]).flatten() + 1
    pick = torch.randperm(spare.numel(), generator=torch.Generator().manual_seed(seed))
    return spare[pick[:count]].sort().values


def _count(n: int) -> int:
    if n < MIN_ROWS:
        return 0
    return min(max(round(HELD_FRACTION * n), HELD_MIN_ROWS), HELD_MAX_ROWS)


def fit_factors(err2: Tensor, latent: Tensor, noise: float) -> tuple[float, float]:
    """(c, b) in :data:`FACTOR_BOUNDS` whose predictive N(mean, c · latent + b · ``noise``)
    gives the rows with squared errors ``err2`` the smallest mean negative log density (a 2-D
    log grid refined three times around its best cell); then c moved into the range where
    their central 95 % intervals cover 95 % ± ``COVERAGE_SLACK`` of them
    (:func:`~gpscale.metrics.covering_scale_range`) and, where no c in the bounds reaches it,
    b as well (:func:`~gpscale.metrics.covering_noise_range`)."""
    err2, latent = err2.double(), latent.double()
    edges = [math.log(FACTOR_BOUNDS[0]), math.log(FACTOR_BOUNDS[1])]
    box = [list(edges), list(edges)]
    best = (math.inf, 0.0, 0.0)
    for points in (24, 9, 9, 9):
        grids = [torch.linspace(lo, hi, points, dtype=torch.float64) for lo, hi in box]
        lc, lb = (g.reshape(-1) for g in torch.meshgrid(*grids, indexing="ij"))
        var = lc.exp()[None, :] * latent[:, None] + lb.exp()[None, :] * noise
        values = 0.5 * (torch.log(2 * math.pi * var) + err2[:, None] / var).mean(0)
        k = int(torch.where(torch.isfinite(values), values, torch.inf).argmin())
        if float(values[k]) < best[0]:
            best = (float(values[k]), float(lc[k]), float(lb[k]))
        box = [[max(centre - (hi - lo) / (points - 1), edges[0]),
                min(centre + (hi - lo) / (points - 1), edges[1])]
               for centre, (lo, hi) in zip(best[1:], box, strict=True)]
    scale, factor = math.exp(best[1]), math.exp(best[2])
    low, high = covering_scale_range(err2, latent, factor * noise, COVERAGE_SLACK, LEVEL)
    scale = _clamp(scale, low, high)
    if not low <= scale <= high:  # the bounds on c cannot reach the coverage: b moves
        low, high = covering_noise_range(err2, scale * latent, COVERAGE_SLACK, LEVEL)
        factor = _clamp(factor, low / noise, high / noise)
    return scale, factor


def _clamp(value: float, low: float, high: float) -> float:
    """``value`` moved into [low, high], then into :data:`FACTOR_BOUNDS`."""
    return min(max(value, low, FACTOR_BOUNDS[0]), max(high, FACTOR_BOUNDS[0]), FACTOR_BOUNDS[1])


def calibrate_scale(model: Any, x: Tensor, y: Tensor, seed: int = 0,
                    sharded: bool = False) -> dict[str, float] | None:
    """Fit and set CaGP-Opt ``model``'s factors of the latent variance and the noise on rows of
    ``x``, ``y`` (its training rows) left out of its posterior (module docstring); returns
    them and the left-out rows' coverage before and after, for the history, or ``None`` below
    :data:`MIN_ROWS` rows or on a rank of a data-parallel run (``sharded``: its rows are a
    shard, and the left-out posterior needs every row); the factors then stay as they are."""
    if sharded:
        log.info("cagp-opt: several processes: the predictive variance is not calibrated")
        return None
    policy = model.policy
    positions = held_rows(policy.layout, _count(x.shape[0]), seed)
    if positions.numel() < HELD_MIN_ROWS:
        return None
    model.variance_scale.fill_(1.0)
    model.noise_scale.fill_(1.0)
    values = policy.values.detach().clone()
    values[positions.to(values.device)] = 0
    index = policy.index
    actions = BlockSparseActions(values, index, num_blocks=policy.layout.num_blocks)
    rows = index[positions.to(index.device)]
    with torch.no_grad():
        state = model.condition(x, y, actions=actions)
        pred = model.predict(state, x[rows])
    err2 = (y[rows].double() - pred.mean.double()).square().cpu()
    latent, noise = pred.variance.double().cpu(), float(pred.noise)
    scale, factor = fit_factors(err2, latent, noise)
    before = _coverage(err2, latent + noise)
    after = _coverage(err2, scale * latent + factor * noise)
    model.variance_scale.fill_(scale)
    model.noise_scale.fill_(factor)
    log.info("cagp-opt: latent variance x %.3g, noise x %.3g on %d rows left out of the "
             "posterior (95%% intervals covered %.1f%% of them, now %.1f%%)", scale, factor,
             rows.numel(), 100 * before, 100 * after)
    if abs(after - LEVEL) > 2.5 * COVERAGE_SLACK:
        warnings.warn(f"cagp-opt: with its latent variance x {scale:.3g} and noise x "
                      f"{factor:.3g} (the ends of the range searched) the 95% intervals cover "
                      f"{100 * after:.1f}% of the {rows.numel():,} rows left out of the "
                      "posterior; treat the intervals with care", CalibrationWarning,
                      stacklevel=3)
    return {"variance_scale": scale, "noise_scale": factor, "left_out_coverage_trained": before,
            "left_out_coverage": after, "left_out_rows": float(rows.numel())}


def unit_scale_if_absent(module: Any, state_dict: dict[str, Any], prefix: str, *args) -> None:
    """A load-state-dict pre-hook: a state saved before the factors existed loads with the
    factors 1."""
    for name in ("variance_scale", "noise_scale"):
        state_dict.setdefault(prefix + name, torch.ones((), dtype=torch.float64))


def _coverage(err2: Tensor, variance: Tensor) -> float:
    return coverage(torch.zeros_like(err2), variance, err2.sqrt(), LEVEL)
