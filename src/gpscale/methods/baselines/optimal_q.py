r"""The ELBO-optimal q(v) and noise σ² of whitened SVGP regression, in closed form.

With a Gaussian likelihood the optimal whitened variational distribution for fixed inducing
inputs z and kernel is known (Titsias 2009; Hensman et al. 2013, §3). With L Lᵀ = K_zz,
A = L⁻¹ K_zx (m × n), residuals r = y − μ(x) and t = Σᵢ (k(xᵢ, xᵢ) − ‖Aᵢ‖²):

.. math::
    S = (I + σ^{-2} A Aᵀ)^{-1}, \qquad m = σ^{-2} S A r,

and for that q the ELBO is Titsias' collapsed bound

.. math::
    F(σ²) = \log N(r \mid 0, AᵀA + σ² I) − t / (2σ²),

a function of one number. In the eigenbasis of G = A Aᵀ = V Λ Vᵀ, with b̃ = Vᵀ A r,

.. math::
    \log|AᵀA + σ²I| = (n − m) \log σ² + Σ_k \log(λ_k + σ²), \quad
    rᵀ(AᵀA + σ²I)^{-1} r = \bigl(rᵀr − Σ_k b̃_k² / (λ_k + σ²)\bigr) / σ²,

so after one O(n m²) pass over the data (the sums G, A r, rᵀr, t and n, which add over
minibatches and over the ranks of a data-parallel run) F costs O(m) per value of σ².

Why. Stochastic training moves q(v) and σ² by small steps from the prior N(0, I) and a noise
near the data's variance; a run that its budget stops leaves both short of the optimum, and
its predictive intervals too wide although its mean may already be accurate. This step puts
them at the optimum for the trained z and kernel: it never lowers the ELBO.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gpscale.kernels import kernel_matrix
from gpscale.linalg.ops import safe_cholesky, upcast

__all__ = ["CollapsedStatistics", "collapsed_statistics", "kernel_statistics", "optimal_noise",
           "optimal_q"]


@dataclass(frozen=True)
class CollapsedStatistics:
    """The sums the collapsed bound needs (float64): G = A Aᵀ (m, m), b = A r (m,),
    rᵀr, t = Σ (k_ii − ‖A_i‖²) and the number of rows n."""

    G: Tensor
    b: Tensor
    rr: Tensor
    t: Tensor
    n: Tensor

    def reduced(self, reduce: Callable[[Tensor], Tensor] | None) -> CollapsedStatistics:
        """The sums over every rank of a data-parallel run (``reduce`` sums a tensor)."""
        if reduce is None:
            return self
        return CollapsedStatistics(*(reduce(v) for v in (self.G, self.b, self.rr, self.t,
                                                          self.n)))


def collapsed_statistics(chunks: Iterable[tuple[Tensor, Tensor, Tensor]]) -> CollapsedStatistics:
    """:class:`CollapsedStatistics` from chunks ``(A_c, r_c, kdiag_c)``: A's columns (m, c), the
    residuals (c,) and the prior variances k(xᵢ, xᵢ) (c,) of each chunk of rows."""
    G = b = None
    rr = t = n = torch.zeros((), dtype=torch.float64)
    for A, r, kdiag in chunks:
        A, r, kdiag = A.double(), r.double(), kdiag.double()
        G = A @ A.mT if G is None else G + A @ A.mT
        b = A @ r if b is None else b + A @ r
        rr = rr.to(A.device) + r @ r
        t = t.to(A.device) + (kdiag - (A * A).sum(0)).clamp_min(0).sum()
        n = n.to(A.device) + r.shape[0]
    if G is None:
        raise ValueError("the collapsed statistics need at least one row")
    return CollapsedStatistics(G, b, rr, t, n)


def kernel_statistics(kernel: Any, mean: Any, z: Tensor, x: Tensor, y: Tensor, *,
                      jitter: float, chunk_size: int = 4096) -> CollapsedStatistics:
    """:func:`collapsed_statistics` of a GPyTorch ``kernel`` and ``mean`` with inducing inputs
    ``z`` (L Lᵀ = K_zz + ``jitter`` I), over chunks of the rows of ``(x, y)``; float64."""
    z = upcast(z.detach())
    eye = torch.eye(z.shape[0], dtype=z.dtype, device=z.device)
    L = safe_cholesky(kernel_matrix(kernel, z, z) + jitter * eye, name="K_zz")

    def chunks():
        for i in range(0, x.shape[0], chunk_size):
            xc = upcast(x[i:i + chunk_size])
            A = torch.linalg.solve_triangular(L, kernel_matrix(kernel, z, xc), upper=False)
            r = y[i:i + chunk_size].double() - mean(xc).double()
            yield A, r, kernel(xc, diag=True).double()

    return collapsed_statistics(chunks())


def _bound(lam: Tensor, bt: Tensor, stats: CollapsedStatistics, s: Tensor) -> Tensor:
    n, m = stats.n, lam.shape[0]
    s = s[:, None]
    logdet = (n - m) * s[:, 0].log() + (lam + s).log().sum(-1)
    quad = (stats.rr - (bt * bt / (lam + s)).sum(-1)) / s[:, 0]  # Woodbury
    return -0.5 * (logdet + quad + n * math.log(2 * math.pi) + stats.t / s[:, 0]) / n


def optimal_noise(stats: CollapsedStatistics, floor: float) -> float:
    """σ² ≥ ``floor`` maximising the collapsed bound: a log grid, refined three times around
    its best cell."""
    lam, V = torch.linalg.eigh(stats.G)
    lam, bt = lam.clamp_min(0), V.mT @ stats.b
    spread = float((stats.rr + stats.t) / stats.n)
    lo, hi = math.log(floor), math.log(max(10 * spread, 10 * floor))
    best = (-math.inf, lo)
    for points in (64, 17, 17, 17):
        grid = torch.linspace(lo, hi, points, dtype=torch.float64, device=lam.device)
        values = _bound(lam, bt, stats, grid.exp())
        values = torch.where(torch.isfinite(values), values, -torch.inf)
        k = int(values.argmax())
        if float(values[k]) > best[0]:
            best = (float(values[k]), float(grid[k]))
        step = (hi - lo) / (points - 1)
        lo, hi = max(best[1] - step, math.log(floor)), best[1] + step
    return math.exp(best[1])


def optimal_q(stats: CollapsedStatistics, noise: float) -> tuple[Tensor, Tensor]:
    """The optimal whitened q(v) = N(m, S) at σ² = ``noise``: (m, chol(S)), float64.

    S = V diag(σ²/(λ + σ²)) Vᵀ and m = V diag(1/(λ + σ²)) b̃ in the eigenbasis of G."""
    lam, V = torch.linalg.eigh(stats.G)
    lam = lam.clamp_min(0)
    mean = V @ ((V.mT @ stats.b) / (lam + noise))
    S = (V * (noise / (lam + noise))) @ V.mT
    S = 0.5 * (S + S.mT)
    eye = torch.eye(S.shape[0], dtype=S.dtype, device=S.device)
    return mean, torch.linalg.cholesky(S + 1e-12 * eye)
