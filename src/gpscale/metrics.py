"""Evaluation metrics on plain tensors.

Regression metrics take the predictive mean and variance of ``y`` (latent variance plus noise);
classification metrics take class probabilities of shape (t, C). All return Python floats.

=====================  =====================================================================
``rmse``               :math:`\\sqrt{\\tfrac1t\\sum_j (y_j - \\mu_j)^2}`
``gaussian_nll``       :math:`\\tfrac1t\\sum_j \\tfrac12[\\log 2\\pi s_j + (y_j-\\mu_j)^2/s_j]`
``accuracy``           fraction of :math:`\\arg\\max_c p_{jc} = y_j`
``multiclass_nll``     :math:`-\\tfrac1t\\sum_j \\log p_{j y_j}`
``ece``                expected calibration error, 15 equal-width confidence bins
``coverage``           fraction of y inside the central 95\\% interval of the predictive
``coverage_error``     :math:`|\\text{empirical coverage of the central 95\\% interval} - 0.95|`
``poisson_nll``        :math:`-\\tfrac1t\\sum_j \\log E_{f \\sim N(\\mu_j, s_j)} p(y_j | e^f)`
                       for Poisson counts (Gauss-Hermite quadrature over the log-rate)
=====================  =====================================================================
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["json_safe", "rmse", "gaussian_nll", "accuracy", "multiclass_nll", "ece",
           "coverage", "coverage_error", "poisson_nll", "covering_noise_range",
           "covering_scale_range", "COVERAGE_SLACK", "COVERAGE_BAR", "coverage_slack"]

COVERAGE_BAR = 0.025
"""The product's bar: a default's 95 % intervals cover 95 % ± this share of new rows."""
COVERAGE_SLACK = 0.01
"""The least slack of :func:`coverage_slack`: a calibration on a few hundred held-out rows
keeps their 95 % intervals covering 95 % ± this share of them."""


def coverage_slack(rows: int, level: float = 0.95) -> float:
    """How far a calibration lets the coverage of ``level`` intervals on ``rows`` held-out
    rows stray from ``level`` before it moves the variance (:func:`covering_noise_range`):
    :data:`COVERAGE_BAR` less two binomial standard errors of that share (what the rows say
    about the coverage on new rows), at least :data:`COVERAGE_SLACK`. Within it the NLL's
    best variance stands: where the errors are heavy-tailed the coverage changes little with
    the variance, and a move into a narrower band costs much density for a fraction of a
    point of coverage."""
    error = math.sqrt(level * (1 - level) / max(rows, 1))
    return max(COVERAGE_SLACK, COVERAGE_BAR - 2 * error)


def rmse(mean: Tensor, y: Tensor) -> float:
    """Root mean squared error between a predictive mean (t,) and targets (t,)."""
    _same_length(mean, y)
    return float(torch.sqrt(torch.mean((y - mean) ** 2)))


def gaussian_nll(mean: Tensor, variance: Tensor, y: Tensor) -> float:
    """Mean negative log predictive density of ``y`` under N(mean, variance), per point.

    Args:
        mean: (t,) predictive mean of y.
        variance: (t,) predictive variance of y (latent variance plus observation noise).
        y: (t,) targets.
    """
    _same_length(mean, y)
    if bool((variance <= 0).any()):
        raise ValueError("gaussian_nll needs a strictly positive predictive variance")
    nlpd = 0.5 * (torch.log(2 * math.pi * variance) + (y - mean) ** 2 / variance)
    return float(nlpd.mean())


def poisson_nll(mean: Tensor, variance: Tensor, y: Tensor, num_nodes: int = 64) -> float:
    """Mean negative log predictive probability of counts under a Gaussian latent log-rate.

    p(y_j) = ∫ Poisson(y_j; exp f) N(f; mean_j, variance_j) df, computed with ``num_nodes``-point
    Gauss-Hermite quadrature in log space (exact for variance 0).

    Args:
        mean: (t,) latent mean of the log-rate.
        variance: (t,) latent variance (≥ 0).
        y: (t,) non-negative counts.
    """
    _same_length(mean, y)
    if bool((variance < 0).any()):
        raise ValueError("poisson_nll needs a non-negative latent variance")
    nodes, weights = (torch.as_tensor(a, dtype=torch.float64)
                      for a in _hermgauss(num_nodes))
    y = y.double()[:, None]
    f = mean.double()[:, None] + torch.sqrt(2 * variance.double())[:, None] * nodes
    log_p = y * f - torch.exp(f) - torch.lgamma(y + 1)  # (t, nodes)
    log_w = torch.log(weights / math.sqrt(math.pi))
    return float(-torch.logsumexp(log_p + log_w, -1).mean())


def _hermgauss(num_nodes: int):
    import numpy as np

    return np.polynomial.hermite.hermgauss(num_nodes)


def accuracy(probs: Tensor, y: Tensor) -> float:
    """Fraction of points whose most probable class (argmax over the last axis) equals ``y``."""
    _same_length(probs, y)
    return float((probs.argmax(-1) == y.long()).double().mean())


def multiclass_nll(probs: Tensor, y: Tensor, eps: float = 1e-12) -> float:
    """Mean negative log probability of the true class; probabilities are floored at ``eps``."""
    _same_length(probs, y)
    p_true = probs.gather(-1, y.long().unsqueeze(-1)).squeeze(-1)
    return float(-torch.log(p_true.clamp_min(eps)).mean())


def ece(probs: Tensor, y: Tensor, num_bins: int = 15) -> float:
    """Expected calibration error with ``num_bins`` equal-width confidence bins on [0, 1].

    ``ECE = sum_b (|B_b| / t) * |acc(B_b) - conf(B_b)|``, where a point falls in bin b when its top
    probability lies in (b/num_bins, (b+1)/num_bins] (the first bin also takes 0).
    """
    _same_length(probs, y)
    conf, pred = probs.max(-1)
    correct = (pred == y.long()).double()
    conf = conf.double()
    bins = torch.clamp(torch.ceil(conf * num_bins).long() - 1, 0, num_bins - 1)
    total = torch.zeros(num_bins, dtype=torch.float64, device=probs.device)
    sum_conf = total.index_add(0, bins, conf)
    sum_acc = total.index_add(0, bins, correct)
    gap = (sum_acc - sum_conf).abs()  # = count * |acc - conf| per bin
    return float(gap.sum() / conf.numel())


def coverage(mean: Tensor, variance: Tensor, y: Tensor, level: float = 0.95) -> float:
    """The fraction of y inside the central ``level`` interval of N(mean, variance)."""
    _same_length(mean, y)
    z = math.sqrt(2.0) * float(torch.special.erfinv(torch.tensor(level, dtype=torch.float64)))
    inside = (y - mean).abs() <= z * variance.sqrt()
    return float(inside.double().mean())


def coverage_error(mean: Tensor, variance: Tensor, y: Tensor, level: float = 0.95) -> float:
    """The absolute difference between the fraction of y inside the central ``level`` interval
    of N(mean, variance) and ``level``."""
    return abs(coverage(mean, variance, y, level) - level)


def covering_noise_range(err2: Tensor, latent: Tensor, slack: float,
                         level: float = 0.95) -> tuple[float, float]:
    """(lo, hi): the noise variances σ² with which the central ``level`` intervals of
    N(mean, latent + σ²) cover ``level`` ± ``slack`` of the rows whose squared errors are
    ``err2`` (lo ≤ hi; hi may be below zero where the latent variance alone covers too many).

    The NLL's best σ² matches the errors' spread on average, not their ``level`` quantile:
    where the errors are heavier- or lighter-tailed than a Gaussian, or spread otherwise than
    the latent variance says, its intervals cover more or fewer rows. Row i is inside its
    interval exactly when σ² ≥ t_i = err2_i / z² − latent_i, so the coverage is the share of
    t_i ≤ σ²: the bounds are two order statistics of t."""
    _same_length(latent, err2)
    return _covering_range(err2.double() / _z(level)**2 - latent.double(), level, slack)


def covering_scale_range(err2: Tensor, latent: Tensor, noise: float, slack: float,
                         level: float = 0.95) -> tuple[float, float]:
    """(lo, hi): the factors c of the latent variance with which the central ``level``
    intervals of N(mean, c · latent + σ²) (σ² = ``noise``) cover ``level`` ± ``slack`` of the
    rows whose squared errors are ``err2``; as :func:`covering_noise_range`, row i is inside
    exactly when c ≥ t_i = (err2_i / z² − σ²) / latent_i (−∞ or +∞ where latent_i is 0)."""
    _same_length(latent, err2)
    need = err2.double() / _z(level)**2 - float(noise)
    latent = latent.double()
    t = torch.where(latent > 0, need / latent.clamp_min(1e-300),
                    torch.where(need <= 0, -math.inf, math.inf))
    return _covering_range(t, level, slack)


def _z(level: float) -> float:
    return math.sqrt(2.0) * float(torch.special.erfinv(torch.tensor(level, dtype=torch.float64)))


def _covering_range(t: Tensor, level: float, slack: float) -> tuple[float, float]:
    """(lo, hi) of the values v for which the share of ``t`` ≤ v is ``level`` ± ``slack``."""
    t = torch.sort(t).values
    n = t.numel()
    low = min(max(math.ceil((level - slack) * n), 1), n)
    high = math.floor((level + slack) * n)
    lo = float(t[low - 1])
    hi = math.nextafter(float(t[high]), -math.inf) if high < n else math.inf
    return lo, max(hi, lo)


def _same_length(a: Tensor, y: Tensor) -> None:
    if a.shape[0] != y.shape[0]:
        raise ValueError(f"predictions have {a.shape[0]} rows but targets have {y.shape[0]}")


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) replaced by ``None`` (JSON ``null``),
    through dicts, lists and tuples; numpy and 0-d tensor scalars become Python numbers."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
