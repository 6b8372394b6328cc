r"""SOLVE-GP regression after training: q(u), q(v⊥) and σ² at the optimum of the ELBO.

With a Gaussian likelihood the optimal q(v⊥) (Eqs. 28–29), the optimal q(u) given it
(notes §2.7) and the bound they reach (Eq. 30, :func:`~gpscale.methods.solvegp.parts.
collapsed_bound`) depend on the data only through sums over the rows:

======================  ==============================================================
sum                     what it is
======================  ==============================================================
``BB``, ``BD``, ``DD``  BBᵀ (M, M), BDᵀ (M, M2), DDᵀ (M2, M2) of the whitened projections
``Br``, ``Dr``          B r, D r with r = y − μ₀
``rr``, ``prior``, n    rᵀr, Σ k(xᵢ, xᵢ) and the number of rows
======================  ==============================================================

so one pass over the data in chunks (O(n (M + M2)²), memory O(chunk · (M + M2))) gives them,
they add over the ranks of a data-parallel run, and every σ² then costs O((M + M2)³): σ² is
searched on a log grid refined three times, then q set at the best σ². Minibatch training
moves q and σ² by small steps from the prior and a large noise; a run its budget stops
leaves its intervals far too wide, which this step removes without lowering the ELBO.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gpscale.linalg.ops import safe_cholesky, upcast

__all__ = ["SolveStatistics", "solve_statistics", "optimal_solve_q", "solve_bound",
           "best_solve_noise", "finalize_regression"]


@dataclass(frozen=True)
class SolveStatistics:
    """The sums of the module docstring (float64)."""

    BB: Tensor
    BD: Tensor
    DD: Tensor
    Br: Tensor
    Dr: Tensor
    rr: Tensor
    prior: Tensor
    n: Tensor

    def reduced(self, reduce: Callable[[Tensor], Tensor] | None) -> SolveStatistics:
        """The sums over every rank (``reduce`` sums a tensor over the ranks)."""
        if reduce is None:
            return self
        return SolveStatistics(*(reduce(getattr(self, f)) for f in self.__dataclass_fields__))


def solve_statistics(model: Any, x: Tensor, y: Tensor, chunk_size: int = 4096
                     ) -> SolveStatistics:
    """:class:`SolveStatistics` of a one-latent SOLVE-GP ``model`` over the rows of (x, y)."""
    factors = model.factors()
    sums: dict[str, Tensor] = {}
    for i in range(0, x.shape[0], chunk_size):
        proj = model.projections(factors, x[i:i + chunk_size], dtype=torch.float64)
        B, D, prior = upcast(proj.B[0]), upcast(proj.D[0]), upcast(proj.prior_var[0])
        r = upcast(y[i:i + chunk_size]) - upcast(model.mean.constant.reshape(()))
        part = {"BB": B @ B.mT, "BD": B @ D.mT, "DD": D @ D.mT, "Br": B @ r, "Dr": D @ r,
                "rr": r @ r, "prior": prior.sum(), "n": torch.tensor(float(r.shape[0]),
                                                                      dtype=torch.float64,
                                                                      device=r.device)}
        sums = part if not sums else {k: sums[k] + v for k, v in part.items()}
    return SolveStatistics(**sums)


def _solve(chol: Tensor, rhs: Tensor) -> Tensor:
    return torch.cholesky_solve(rhs if rhs.dim() == 2 else rhs[:, None], chol).reshape(rhs.shape)


def optimal_solve_q(s: SolveStatistics, noise: float) -> dict[str, Tensor]:
    """The optimal whitened q at σ² = ``noise`` and the bound it reaches (Eq. 30, per row):
    ``mean_u``, ``chol_u``, ``mean_v``, ``chol_v`` and ``bound``."""
    M, M2 = s.BB.shape[0], s.DD.shape[0]
    eye_u = torch.eye(M, dtype=s.BB.dtype, device=s.BB.device)
    eye_v = torch.eye(M2, dtype=s.BB.dtype, device=s.BB.device)
    chol_lam = safe_cholesky(eye_u + s.BB / noise, name="I + BBᵀ/σ²")  # Λ
    # D A⁻¹ Dᵀ and D A⁻¹ r with A = BᵀB + σ²I by Woodbury: A⁻¹ = (I − Bᵀ Λ⁻¹ B / σ²) / σ²
    DAD = (s.DD - s.BD.mT @ _solve(chol_lam, s.BD) / noise) / noise
    DAr = (s.Dr - s.BD.mT @ _solve(chol_lam, s.Br) / noise) / noise
    mean_v = _solve(safe_cholesky(eye_v + 0.5 * (DAD + DAD.mT), name="I + DA⁻¹Dᵀ"), DAr)
    chol_p = safe_cholesky(eye_v + s.DD / noise, name="I + DDᵀ/σ²")
    S_v = torch.cholesky_inverse(chol_p)
    Be = s.Br - s.BD @ mean_v  # B e, e = r − Dᵀa_v
    ee = s.rr - 2 * mean_v @ s.Dr + mean_v @ s.DD @ mean_v
    c = torch.linalg.solve_triangular(chol_lam, Be[:, None] / noise, upper=False)[:, 0]
    quad = ee / noise - c @ c
    logdet = s.n * math.log(noise) + 2 * chol_lam.diagonal().log().sum()
    trace = s.prior - s.BB.trace() - s.DD.trace() + (S_v * s.DD).sum()
    chol_v = torch.linalg.cholesky(S_v)
    kl_v = 0.5 * (S_v.trace() + mean_v @ mean_v - M2) - chol_v.diagonal().log().sum()
    bound = (-0.5 * (s.n * math.log(2 * math.pi) + logdet + quad) - 0.5 * trace / noise
             - kl_v) / s.n
    return {"mean_u": _solve(chol_lam, Be / noise),
            "chol_u": torch.linalg.cholesky(torch.cholesky_inverse(chol_lam)),
            "mean_v": mean_v, "chol_v": chol_v, "bound": bound}


def solve_bound(s: SolveStatistics, noise: float) -> float:
    """Eq. (30) per row at σ² = ``noise`` (−∞ where a factorisation fails)."""
    try:
        value = float(optimal_solve_q(s, noise)["bound"].detach())
    except (torch.linalg.LinAlgError, ValueError):
        return -math.inf
    return value if math.isfinite(value) else -math.inf


def best_solve_noise(s: SolveStatistics, floor: float) -> float:
    """σ² ≥ ``floor`` maximising :func:`solve_bound`: a log grid refined three times."""
    spread = float((s.rr + s.prior) / s.n)
    lo, hi = math.log(floor), math.log(max(10 * spread, 10 * floor))
    best = (-math.inf, lo)
    for points in (25, 9, 9, 9):
        step = (hi - lo) / (points - 1)
        for k in range(points):
            value = lo + k * step
            bound = solve_bound(s, math.exp(value))
            if bound > best[0]:
                best = (bound, value)
        lo, hi = max(best[1] - step, math.log(floor)), best[1] + step
    return math.exp(best[1])


def finalize_regression(model: Any, x: Tensor, y: Tensor,
                        reduce: Callable[[Tensor], Tensor] | None) -> dict[str, float] | None:
    """Set a trained SOLVE-GP regression model's whitened q(u), q(v⊥) and σ² to the optimum
    (one latent GP, ``objective='elbo'``, whitened, ``orthogonal_q='full'``, option
    ``optimal_q`` on; otherwise nothing changes and ``None`` is returned); returns the noise
    before and after, for the history."""
    if (model.task != "regression" or model.objective != "elbo" or not model.whiten
            or model.q_chol_v is None or not model.options.get("optimal_q", True)):
        return None
    with torch.no_grad():
        stats = solve_statistics(model, x, y).reduced(reduce)
        trained = float(model.noise.detach())
        floor = float(model.likelihood.noise_covar.raw_noise_constraint.lower_bound)
        noise = best_solve_noise(stats, 1.01 * floor)
        q = optimal_solve_q(stats, noise)
        for name, value in (("q_mean_u", q["mean_u"]), ("q_chol_u", q["chol_u"]),
                            ("q_mean_v", q["mean_v"]), ("q_chol_v", q["chol_v"])):
            param = getattr(model, name)
            param.copy_(value.reshape(param.shape).to(param))
        model.likelihood.noise = torch.full_like(model.likelihood.noise, noise)
    return {"noise_trained": trained, "noise_calibrated": float(model.noise.detach())}
