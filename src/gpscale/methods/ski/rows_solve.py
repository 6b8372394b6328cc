r"""SKI's n-dimensional solves (:mod:`gpscale.methods.ski`): CG on W K_G Wᵀ + σ²I over the
training rows, for one grid (:class:`~gpscale.linalg.interpolation.Interpolation`) or an
additive model's stacked rows (:class:`~gpscale.linalg.additive.AdditiveRows`) alike: both
give ``matmul`` (W v) and ``rmatmul`` (Wᵀu), and K_G is a
:class:`~gpscale.linalg.toeplitz.GridKernel` or a
:class:`~gpscale.linalg.additive.BlockGridKernel`.

- :func:`condition_rows` solves [r, z_1..z_p] in one batched CG (mBCG) and hands the
  m-dimensional results — Wᵀz̃, Wᵀx_l, the Lanczos quadrature of log det K̃ — to
  :func:`~gpscale.methods.ski.solve.mll_state`, the same assembly (and surrogate gradients)
  as GGP's m-dimensional solves.
- :func:`variance_reduction` gives test rows ↦ w_*ᵀ K_G Wᵀ K̃⁻¹ W K_G w_*, the predictive
  variance's reduction: exact by a CG solve per test chunk, or LOVE from n-dimensional Lanczos.

Every iteration touches n-vectors: this is the paper's baseline, which GGP's statistics avoid.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from gpscale.errors import ConvergenceWarning
from gpscale.linalg.additive import AdditiveRows
from gpscale.linalg.ops import rademacher
from gpscale.linalg.solvers.cg import ConjugateGradient
from gpscale.linalg.solvers.lanczos import lanczos, lanczos_quadrature
from gpscale.methods.ski.solve import GridState, love_term, mll_state, sparse_columns
from gpscale.validation import check_x, check_xy

__all__ = ["RowsSolved", "probe_rows", "ski_operator", "condition_rows", "variance_reduction"]

_F64 = torch.float64


def probe_rows(rows, n: int, num_probes: int, seed: int, device) -> tuple[Tensor, Tensor]:
    """The seeded Rademacher probes Z (n, p) and WᵀZ (m, p): what every step on the same rows
    reuses, so the log-determinant estimate is the same function at every epoch."""
    generator = torch.Generator().manual_seed(seed)
    Z = rademacher(n, num_probes, dtype=_F64, generator=generator).to(device)
    return Z, rows.rmatmul(Z)


def ski_operator(GK, rows, noise: float) -> Callable[[Tensor], Tensor]:
    """V (n, k) ↦ (W K_G Wᵀ + σ²I) V."""
    return lambda V: rows.matmul(GK.matmul(rows.rmatmul(V))) + noise * V


def condition_rows(options: dict[str, Any], GK, rows, probes: tuple[Tensor, Tensor], y: Tensor,
                   noise: Tensor, mu: Tensor) -> GridState:
    """The likelihood terms of the SKI model on the rows ``rows`` of the training inputs and
    targets ``y``: one batched CG on [r, z_1..z_p] (``rtol``, ``max_iters``), r = y − μ, then
    :func:`~gpscale.methods.ski.solve.mll_state` (differentiable in K_G's hyperparameters,
    σ² and μ by surrogates). ``state.data`` is ``rows``."""
    Z, wt_probes = probes
    r = y.detach().to(_F64) - mu.detach().to(_F64)
    with torch.no_grad():
        rhs = torch.cat([r[:, None], Z], 1)
        cg = ConjugateGradient(rtol=options["rtol"], max_iters=options["max_iters"],
                               record_lanczos=True)
        result = cg.run(cg.init(ski_operator(GK, rows, float(noise.detach()))), rhs)
        X = result.solution
        # the probes' columns only feed the log-determinant estimate
        _warn_unless_converged(result.converged[:1], options,
                               "the likelihood and the predictive mean")
        wt_x = rows.rmatmul(X)
        b_dot_x = (rhs * X).sum(0)
        samples = result.lanczos_weights[1:] * lanczos_quadrature(result.tridiagonal[1:])
    return mll_state(GK, noise, mu, y.shape[0], quad=b_dot_x[0], wt_z=wt_x[:, 0],
                     z_sq=X[:, 0] @ X[:, 0], one_z=X[:, 0].sum(), h_probes=wt_probes,
                     wt_x=wt_x[:, 1:], probe_dot=b_dot_x[1:], logdet_samples=samples,
                     iterations=result.iterations, data=rows)


def _warn_unless_converged(converged: Tensor, options: dict[str, Any], what: str) -> None:
    """A :class:`~gpscale.errors.ConvergenceWarning` when a CG column in ``converged`` stopped
    on ``max_iters`` before ``rtol``; its last iterate is used."""
    if not bool(converged.all()):
        warnings.warn(f"SKI: CG on W K Wᵀ + σ²I stopped after max_iters={options['max_iters']} "
                      f"iterations above rtol={options['rtol']:g}; {what} are approximate "
                      "(raise max_iters, or use ggp, whose solves need fewer iterations)",
                      ConvergenceWarning, stacklevel=3)


def _columns(rows) -> Tensor:
    """Dense Wᵀ (m, t) of a few test rows, one grid's or stacked."""
    return rows.columns() if isinstance(rows, AdditiveRows) else sparse_columns(rows)


def variance_reduction(options: dict[str, Any], GK, rows, noise: float, *, exact: bool,
                       device) -> Callable[[Any], Tensor]:
    """Test rows ↦ w_*ᵀ K_G Wᵀ K̃⁻¹ W K_G w_* (t,), the reduction of the prior variance
    w_*ᵀ K_G w_* by the training rows ``rows``: by a CG solve per test chunk (``exact``), else
    by LOVE from ``variance_rank`` Lanczos steps on K̃ started at W K_G 1/m."""
    A = ski_operator(GK, rows, noise)
    if exact:
        cg = ConjugateGradient(rtol=options["rtol"], max_iters=options["max_iters"])

        def solved(test_rows) -> Tensor:
            Kw = GK.matmul(_columns(test_rows))
            result = cg.run(cg.init(A), rows.matmul(Kw))
            _warn_unless_converged(result.converged, options, "the predictive variances")
            return (Kw * rows.rmatmul(result.solution)).sum(0)
        return solved
    m = GK.num_grid
    b0 = rows.matmul(GK.matmul(torch.full((m,), 1.0 / m, dtype=_F64, device=device)))
    Q, T = lanczos(A, b0, options["variance_rank"])
    return love_term(GK, rows.rmatmul(Q), T)


class RowsSolved:
    """``training_loss`` and ``condition`` of a SKI model, by :func:`condition_rows`; the class
    gives ``_interpolate(x)`` (W's rows of x) and ``_solve_kernel()`` (K_G)."""

    def _rows(self, x: Tensor):
        """W's rows of x, the seeded probes Z and WᵀZ (what every step on x reuses)."""
        rows = self._interpolate(x)
        return rows, probe_rows(rows, x.shape[0], self.options["num_probes"],
                                self.options["seed"], x.device)

    def training_loss(self, x: Tensor, y: Tensor):
        """The loss ``training.fit`` minimises: W's rows and the probes of (x, y) are built
        here once and held by the returned function (nothing is kept on the module)."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        prepared = self._rows(x)

        def loss(model: RowsSolved, xb: Tensor, yb: Tensor) -> Tensor:
            if xb is not x:
                return model.loss(model.condition(xb, yb))
            return model.loss(model._condition(y, prepared))
        return loss

    def condition(self, x: Tensor, y: Tensor) -> GridState:
        """n-dimensional CG on [r, z_1..z_p] (mBCG), then the same likelihood terms as GGP."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        return self._condition(y, self._rows(x))

    def _condition(self, y: Tensor, prepared) -> GridState:
        rows, probes = prepared
        return condition_rows(self.options, self._solve_kernel(), rows, probes, y, self.noise,
                              self.mean.constant.reshape(()))
