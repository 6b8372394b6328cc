r"""CaGP-Opt's intervals, calibrated on training rows held out of its training.

CaGP's latent variance K_i(x, x) is the exact posterior's variance plus the computational
uncertainty of conditioning on i projections of the data, a bound on the error the few actions
leave. Where the noise is small next to the signal that bound dominates the predictive, and it
is loose: the 95 % intervals of a converged CaGP-Opt cover nearly every test row and its
predictive density is far lower than its errors warrant. Where the actions have not converged
(a time budget on many rows) the intervals can also be too narrow.

The rows it calibrates on are held out of training (:func:`hold_rows`, at build time: a tenth
of the rows, at most :data:`HELD_MAX_ROWS`, never a block's first row): their action entries
stay zero, so neither the actions nor the ELBO (which skips their likelihood terms) see them,
and the posterior does not condition on them. After training, :func:`calibrate_scale` predicts
them, as new rows, and fits two factors on them (:func:`fit_factors`): c of the latent variance
and b of the noise in the predictive c · K_i(x, x) + b · σ², those with the smallest negative
log predictive density, then moved into the range where their 95 % intervals cover 95 % ±
:func:`~gpscale.metrics.coverage_slack` of them. The model then predicts with them; the
posterior itself (its mean, and the σ² it conditions with) stays the ELBO's.

Why held out, not predicted from the others after training on them: CaGP-Opt's actions are n
parameters, one per row, and the longer they train the more they fit the rows they were
trained on. Rows in the training predicted from the others (the fixed point below) came out
more accurate than new rows, by more the longer the actions trained, so intervals fitted to
them were too narrow on new rows (docs/notes). The cost is the held rows' data in the
posterior.

The fixed point (:func:`left_out_predictive`, for rows whose entries are not zero: a model
grown or loaded without held rows). Removing a row's entry from its action would damage the
action the ELBO learned with it; instead the actions stay whole and the left-out rows'
residuals are replaced by the values the posterior itself predicts for them: with
A = K(X_H, X) S G⁻¹ Sᵀ restricted to the columns H, the predictions r̂_H = A_HT r_T +
A_HH r̂_H, i.e. r̂_H = (I − A_HH)⁻¹ A_HT r_T, a linear predictor B r_T of the left-out rows from
the others. For the exact GP (S = I) this fixed point is the leave-out posterior mean
(conditioning on an observation equal to its predicted mean changes no mean). Its latent
variance is the prior variance of f_H − B r_T, as CaGP's own K_i(x, x) is that of
f(x) − μ_i(x):

.. math::
    k(x_h, x_h) - 2 P_h Z'_h{}^\top + P_h G' P_h^\top, \qquad
    P = (I - A_{HH})^{-1} K(X_H, X) S G^{-1},

with Z' = K(X_H, X) S' and G' = S'ᵀ K̂ S' for S' the actions with the rows H at zero (one more
conditioning). Every block keeps at least one row outside H, so G' stays positive definite.
For held rows (zero entries) A_HH = 0, S' = S, and this is the plain predictive at X_H.

The noise's factor matters where the data are nearly noiseless: the ELBO's σ² then sits at the
likelihood's floor of 10⁻⁴, which alone gives intervals wider than the errors, and a predictive
noise below it has no numerical role. ``-o calibrate=off`` keeps the ELBO's variance as the
paper defines it, and holds no rows out.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import torch
from torch import Tensor

from gpscale.errors import CalibrationWarning, NumericalError
from gpscale.kernels import kernel_diag
from gpscale.linalg.operators.block_sparse import BlockLayout, BlockSparseActions
from gpscale.linalg.ops import upcast
from gpscale.metrics import (
    COVERAGE_BAR,
    coverage,
    coverage_slack,
    covering_noise_range,
    covering_scale_range,
)

__all__ = ["CALIBRATIONS", "HELD_FRACTION", "HELD_MIN_ROWS", "HELD_MAX_ROWS", "MIN_ROWS",
           "FACTOR_BOUNDS", "held_rows", "hold_rows", "held_after_growing", "fit_factors",
           "left_out_predictive", "calibrate_scale", "unit_scale_if_absent"]

log = logging.getLogger("gpscale.methods")

CALIBRATIONS = ("heldout", "off")
"""Values of CaGP-Opt's ``calibrate`` option."""
HELD_FRACTION = 0.1
"""Share of the training rows held out of training to calibrate the variance on."""
HELD_MIN_ROWS = 100
"""Fewest rows predicted."""
HELD_MAX_ROWS = 2_000
"""Most rows predicted: two factors are fitted on them (I − A_HH is solved at this size)."""
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


def hold_rows(policy: Any, seed: int = 0) -> None:
    """Hold out the rows CaGP-Opt calibrates on (``calibrate='heldout'``, at least
    :data:`MIN_ROWS` rows): their entries stay zero, so neither the actions nor the ELBO see
    them (:meth:`~gpscale.linalg.policies.block_sparse.LearnedBlockSparsePolicy.hold`)."""
    positions = held_rows(policy.layout, _count(policy.layout.num_points), seed)
    if positions.numel() >= HELD_MIN_ROWS:
        policy.hold(positions)


def held_after_growing(order: Tensor, num_kept: int, seed: int = 0) -> Tensor:
    """(N,) bool in the grown block order: the positions of rows added by
    :func:`~gpscale.linalg.policies.block_sparse.grow_blocks` (``order`` ≥ ``num_kept``: rows
    the trained actions never saw, as ``auto``'s race held them out) to calibrate on, as many
    as :func:`hold_rows` would hold of N rows (fewer where fewer were added; none below
    :data:`HELD_MIN_ROWS`)."""
    added = torch.nonzero(order >= num_kept).flatten()
    pick = torch.randperm(added.numel(), generator=torch.Generator().manual_seed(seed))
    held = torch.zeros(order.shape[0], dtype=torch.bool)
    chosen = added[pick[:_count(order.shape[0])]]
    if chosen.numel() >= HELD_MIN_ROWS:
        held[chosen] = True
    return held


def _count(n: int) -> int:
    if n < MIN_ROWS:
        return 0
    return min(max(round(HELD_FRACTION * n), HELD_MIN_ROWS), HELD_MAX_ROWS)


def fit_factors(err2: Tensor, latent: Tensor, noise: float) -> tuple[float, float]:
    """(c, b) in :data:`FACTOR_BOUNDS` whose predictive N(mean, c · latent + b · ``noise``)
    gives the rows with squared errors ``err2`` the smallest mean negative log density (a 2-D
    log grid refined three times around its best cell); then c moved into the range where
    their central 95 % intervals cover 95 % ± ``coverage_slack`` of them
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
    slack = coverage_slack(err2.numel(), LEVEL)
    low, high = covering_scale_range(err2, latent, factor * noise, slack, LEVEL)
    scale = _clamp(scale, low, high)
    if not low <= scale <= high:  # the bounds on c cannot reach the coverage: b moves
        low, high = covering_noise_range(err2, scale * latent, slack, LEVEL)
        factor = _clamp(factor, low / noise, high / noise)
    return scale, factor


def _clamp(value: float, low: float, high: float) -> float:
    """``value`` moved into [low, high], then into :data:`FACTOR_BOUNDS`."""
    return min(max(value, low, FACTOR_BOUNDS[0]), max(high, FACTOR_BOUNDS[0]), FACTOR_BOUNDS[1])


def left_out_predictive(model: Any, x: Tensor, y: Tensor, positions: Tensor,
                        state: Any = None) -> tuple[Tensor, Tensor, float]:
    """(squared errors, latent variances, σ²) of CaGP-Opt ``model``'s predictions of the rows at
    ``positions`` (block order) of ``x``, ``y`` from the others, its actions whole (module
    docstring); float64 on the CPU. ``state``: ``model``'s posterior on ``x``, ``y`` if the
    caller has it (else conditioned here). Raises :class:`~gpscale.errors.NumericalError` where
    I − A_HH does not solve."""
    policy = model.policy
    index, values = policy.index, policy.values.detach().masked_fill(policy.held, 0.0)
    positions = positions.to(index.device)
    rows, v_h = index[positions], upcast(values[positions])
    blocks = policy.layout.block_ids(index.device)[positions]
    with torch.no_grad():
        state = model.condition(x, y) if state is None else state
        kept = values.clone()
        kept[positions] = 0
        other = state if not bool(v_h.any()) else model.condition(  # held rows: S' = S
            x, y, actions=BlockSparseActions(kept, index, num_blocks=policy.layout.num_blocks))
        r = upcast(state.residual)
        M = torch.cholesky_solve(upcast(state.K_S[rows]).mT, state.cholesky).mT  # K_HX S G⁻¹
        A = M[:, blocks] * v_h[None, :]  # A_HH
        u = upcast(state.y_proj).index_add(0, blocks, -(v_h * r[rows]))  # S_Tᵀ r_T
        try:
            lu = torch.linalg.lu_factor(torch.eye(len(rows), dtype=A.dtype, device=A.device) - A)
        except RuntimeError as err:
            raise NumericalError(f"I − A_HH does not factor: {err}") from None
        r_hat = torch.linalg.lu_solve(*lu, (M @ u)[:, None])[:, 0]
        P = torch.linalg.lu_solve(*lu, M)
        Z = upcast(other.K_S[rows])  # K_HX S' with the rows H at zero
        latent = (upcast(kernel_diag(model.kernel, x[rows])) - 2 * (P * Z).sum(1)
                  + (P @ other.cholesky).square().sum(1))
    err2 = (r[rows] - r_hat).square()
    if not bool(torch.isfinite(err2).all() and torch.isfinite(latent).all()):
        raise NumericalError("the left-out predictions are not finite")
    return err2.cpu(), latent.clamp_min(0).cpu(), float(state.noise)


def calibrate_scale(model: Any, x: Tensor, y: Tensor, seed: int = 0,
                    sharded: bool = False, state: Any = None) -> dict[str, float] | None:
    """Fit and set CaGP-Opt ``model``'s factors of the latent variance and the noise on rows of
    ``x``, ``y`` (its training rows): the held rows, predicted as new (module docstring); returns
    them and those rows' coverage before and after, for the history, or ``None`` below
    :data:`MIN_ROWS` rows, on a rank of a data-parallel run (``sharded``: its rows are a
    shard, and the prediction needs every row) or where the prediction fails (warned); the
    factors then stay as they are."""
    if sharded:
        log.info("cagp-opt: several processes: the predictive variance is not calibrated")
        return None
    policy = model.policy
    positions = (torch.nonzero(policy.held).flatten() if bool(policy.held.any())
                 else held_rows(policy.layout, _count(x.shape[0]), seed))
    if positions.numel() < HELD_MIN_ROWS:
        return None
    model.variance_scale.fill_(1.0)
    model.noise_scale.fill_(1.0)
    try:
        err2, latent, noise = left_out_predictive(model, x, y, positions, state)
    except NumericalError as err:
        warnings.warn(f"cagp-opt: the predictive variance is not calibrated ({err}); its "
                      "intervals are the ELBO's", CalibrationWarning, stacklevel=3)
        return None
    count = positions.numel()
    scale, factor = fit_factors(err2, latent, noise)
    before = _coverage(err2, latent + noise)
    after = _coverage(err2, scale * latent + factor * noise)
    model.variance_scale.fill_(scale)
    model.noise_scale.fill_(factor)
    log.info("cagp-opt: latent variance x %.3g, noise x %.3g on %d training rows predicted "
             "as new (95%% intervals covered %.1f%% of them, now %.1f%%)", scale, factor,
             count, 100 * before, 100 * after)
    if abs(after - LEVEL) > COVERAGE_BAR:
        warnings.warn(f"cagp-opt: with its latent variance x {scale:.3g} and noise x "
                      f"{factor:.3g} (the ends of the range searched) the 95% intervals cover "
                      f"{100 * after:.1f}% of the {count:,} training rows predicted "
                      "as new; treat the intervals with care", CalibrationWarning,
                      stacklevel=3)
    return {"variance_scale": scale, "noise_scale": factor, "left_out_coverage_trained": before,
            "left_out_coverage": after, "left_out_rows": float(count)}


def unit_scale_if_absent(module: Any, state_dict: dict[str, Any], prefix: str, *args) -> None:
    """A load-state-dict pre-hook: a state saved before the factors existed loads with the
    factors 1."""
    for name in ("variance_scale", "noise_scale"):
        state_dict.setdefault(prefix + name, torch.ones((), dtype=torch.float64))


def _coverage(err2: Tensor, variance: Tensor) -> float:
    return coverage(torch.zeros_like(err2), variance, err2.sqrt(), LEVEL)
