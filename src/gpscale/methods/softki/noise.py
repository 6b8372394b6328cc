r"""SoftKI's noise calibration: the β² that maximises the exact marginal likelihood once the
interpolant (points, kernel) is trained.

SoftKI trains with β² fixed (1e-3, the paper's choice: a learned β² harms the interpolant), which
leaves the predictive variance unrelated to the data's noise. With G = W Uᵀ (n × m, UᵀU = K_zz)
the training covariance is Σ(β²) = G Gᵀ + β² I. Let λ_j, v_j be the eigenpairs of A = GᵀG
(so λ_j = s_j², the squared singular values of G = Σ_j s_j u_j v_jᵀ), b = Gᵀ r and
q_j = (v_jᵀ b)² / λ_j = (u_jᵀ r)². Then, for the m' directions with λ_j > 0,

.. math::
    -\log N(r \mid 0, Σ) = \tfrac12 \Big[\sum_j \log(λ_j + β^2) + (n - m') \log β^2
        + \sum_j \frac{q_j}{λ_j + β^2} + \frac{r^\top r - \sum_j q_j}{β^2} + n \log 2π\Big],

a function of β² alone once A, b, rᵀr and n are known. These are sums over data points, so they
stream in chunks (memory O(chunk · m)) and all-reduce across ranks; the one-dimensional
minimisation then costs O(m) per evaluation: a log-spaced grid, refined by golden section.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["noise_statistics", "negative_log_likelihood", "calibrate_noise"]

NOISE_FLOOR = 1e-6
"""Smallest β² the calibration returns (as a variance of the standardised target)."""


def noise_statistics(features: Callable[[Tensor], Tensor], x: Tensor, r: Tensor,
                     chunk_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(A = GᵀG, b = Gᵀr, rᵀr, n) in float64, with ``features(x_chunk)`` the rows of G."""
    A = b = None
    for i in range(0, x.shape[0], chunk_size):
        G = features(x[i:i + chunk_size]).double()
        rc = r[i:i + chunk_size].double()
        A = G.mT @ G if A is None else A + G.mT @ G
        b = G.mT @ rc if b is None else b + G.mT @ rc
    rr = r.double().square().sum()
    return A, b, rr, torch.tensor(float(x.shape[0]), dtype=torch.float64, device=r.device)


def _spectrum(A: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """(λ_j, q_j) over the directions with λ_j above rounding level."""
    lam, V = torch.linalg.eigh(A)
    keep = lam > lam.max().clamp_min(0) * A.shape[0] * torch.finfo(A.dtype).eps
    lam, proj = lam[keep], (V.mT @ b)[keep]
    return lam, proj.square() / lam


def negative_log_likelihood(noise: Tensor, A: Tensor, b: Tensor, rr: Tensor,
                            n: Tensor) -> Tensor:
    """−log N(r | 0, GGᵀ + β²I) / n for each β² in ``noise`` (any shape), from the statistics."""
    lam, q = _spectrum(A, b)
    beta2 = noise.double()[..., None]
    logdet = torch.log(lam + beta2).sum(-1) + (n - lam.numel()) * beta2[..., 0].log()
    quad = (q / (lam + beta2)).sum(-1) + (rr - q.sum()).clamp_min(0) / beta2[..., 0]
    return 0.5 * (logdet + quad + n * math.log(2 * math.pi)) / n


def _minimise_log(f: Callable[[Tensor], Tensor], lower: float, upper: float) -> float:
    """argmin of ``f`` (vectorised) over [lower, upper] on a log grid, refined by golden section."""
    grid = torch.logspace(math.log10(lower), math.log10(upper), 400, dtype=torch.float64)
    best = int(f(grid).argmin())
    lo, hi = math.log(grid[max(best - 1, 0)]), math.log(grid[min(best + 1, len(grid) - 1)])
    ratio = (math.sqrt(5) - 1) / 2

    def at(t: float) -> float:
        return float(f(torch.tensor(math.exp(t), dtype=torch.float64)))

    for _ in range(40):  # golden section on the log inside the best grid cell's neighbours
        a, c = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if at(a) < at(c):
            hi = c
        else:
            lo = a
    return max(lower, math.exp(0.5 * (lo + hi)))


def calibrate_noise(A: Tensor, b: Tensor, rr: Tensor, n: Tensor) -> float:
    """The β² ≥ :data:`NOISE_FLOOR` of least :func:`negative_log_likelihood`."""
    A, b, rr, n = (t.cpu() for t in (A, b, rr, n))  # small (m × m); its grid search is on the CPU
    upper = max(float(rr / n), 10 * NOISE_FLOOR) * 10.0  # β² beyond var(r) only adds log-det
    return _minimise_log(lambda noise: negative_log_likelihood(noise, A, b, rr, n),
                         NOISE_FLOOR, upper)
