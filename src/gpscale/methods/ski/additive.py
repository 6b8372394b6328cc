r"""Additive GGP: ``ggp`` with a kernel expression that is a sum of stationary kernels on groups
of at most three inputs, one grid per group (:mod:`gpscale.linalg.additive`).

``ggp -o kernel='rbf(0) + rbf(1) + matern32(2, 3)'`` models f = Σ_g f_g(x_{S_g}) with each f_g
on its own grid, so data with many inputs whose function is a sum of low-dimensional parts
reach GGP's cost per iteration — independent of n — where one grid over every input is
exponential in d. The statistics are those of the single grid (:mod:`~gpscale.methods.ski`)
with W = [W_1 … W_G] (n, M): WᵀW is held dense (M × M, the groups' cross blocks are dense),
Wᵀy, Wᵀ1, the probes' Wᵀz, yᵀy, Σy, n. The solves, the likelihood, its gradients and the
predictive are the single grid's (:mod:`gpscale.methods.ski.solve`) on the block-diagonal K_B;
the whitened solve's preconditioner is block diagonal (each group's Kronecker one), so
``solver='auto'`` takes it where every group's kernel is a Kronecker product (RBF, or any kernel
on one input) and the factorized CG otherwise.

What a group's terms may be, how terms on the same inputs share a grid, the grids' sizes and
the reach of a group beyond its grid: :mod:`gpscale.methods.ski.groups`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.linalg.additive import (
    AdditiveRows,
    BlockGridKernel,
    accumulate_gram,
    additive_rows,
    mirror_blocks,
)
from gpscale.linalg.factorized import span_cg, span_lanczos
from gpscale.linalg.interpolation import Grid, Interpolation, interpolate
from gpscale.linalg.ops import rademacher, safe_cholesky
from gpscale.linalg.reach import beyond_box
from gpscale.linalg.stencil import pair_offsets
from gpscale.methods._common import HeldOutNoise
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.ski.groups import (
    Group,
    additive_grids,
    additive_groups,
    group_grid_kernel,
    group_reach,
)
from gpscale.methods.ski.solve import (
    GridState,
    condition_statistics,
    love_term,
    operators,
    use_preconditioned,
    whitened_system,
)
from gpscale.methods.ski.statistics import StatisticsMemo, float64_chunks
from gpscale.validation import check_x, check_xy

__all__ = ["AdditiveGGP", "AdditiveStatistics", "DENSE_VARIANCE_MAX", "additive_statistics",
           "grid_posterior"]

DENSE_VARIANCE_MAX = 8192
"""Largest M whose posterior covariance on the grids ``variance='auto'`` factors densely."""
_F64 = torch.float64


@dataclass(frozen=True)
class AdditiveStatistics:
    """What an additive ``ggp`` keeps of the data: the single grid's statistics with W the
    stacked groups' rows (module docstring); O(M² + p M) floats, independent of n.

    Attributes:
        grids: each group's grid.  columns: each group's input indices.
        gram: dense WᵀW (M, M).  wt_y, wt_one: (M,).  yty, y_sum: scalars.  n: rows.
        wt_probes: (M, p).  probe_sq: (p,).
    """

    grids: tuple[Grid, ...]
    columns: tuple[tuple[int, ...], ...]
    gram: Tensor
    wt_y: Tensor
    wt_one: Tensor
    yty: Tensor
    y_sum: Tensor
    n: int
    wt_probes: Tensor
    probe_sq: Tensor


def additive_statistics(data, grids: list[Grid], columns: list[list[int]], *,
                        num_probes: int = 16, seed: int = 0, chunk_size: int = 100_000,
                        device=None) -> AdditiveStatistics:
    """One pass over ``data`` (tensors, arrays or an iterable of chunks, as
    :func:`~gpscale.methods.ski.statistics.sufficient_statistics`)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    M = sum(g.num_points for g in grids)
    zeros = lambda *shape: torch.zeros(*shape, dtype=_F64, device=device)  # noqa: E731
    gram, wt_y, wt_one, wt_probes = zeros(M, M), zeros(M), zeros(M), zeros(M, num_probes)
    yty, y_sum, n = zeros(()), zeros(()), 0
    generator = torch.Generator().manual_seed(seed)
    for x, y in float64_chunks(data, chunk_size):
        check_xy(x, y.reshape(-1))
        x, y = x.to(device), y.reshape(-1).to(device)
        rows = additive_rows(grids, columns, x)
        accumulate_gram(gram, rows)
        wt_y += rows.rmatmul(y)
        wt_one += rows.rmatmul(torch.ones_like(y))
        if num_probes:
            probes = rademacher(y.shape[0], num_probes, dtype=_F64, generator=generator)
            wt_probes += rows.rmatmul(probes.to(device))
        yty, y_sum, n = yty + y @ y, y_sum + y.sum(), n + y.shape[0]
    if n == 0:
        raise ValueError("no data: the chunks were empty")
    mirror_blocks(gram, [g.num_points for g in grids])
    return AdditiveStatistics(tuple(grids), tuple(tuple(c) for c in columns), gram, wt_y,
                              wt_one, yty, y_sum, n, wt_probes,
                              torch.full((num_probes,), float(n), dtype=_F64, device=device))


def grid_posterior(GK: BlockGridKernel, gram: Tensor, noise: float) -> Tensor:
    """The posterior covariance on the grids (M, M), K_B − K_B Wᵀ K̃⁻¹ W K_B, in Woodbury form
    σ² (C⁻¹L)ᵀ(C⁻¹L) with L = K_B^{1/2} (per block) and C Cᵀ = σ²I + L WᵀW L; O(M³)."""
    roots = []
    for block in GK.kernels:
        lam, U = torch.linalg.eigh(block.to_dense())
        roots.append((U * lam.clamp_min(0).sqrt()) @ U.T)
    L = torch.block_diag(*roots)
    A = L @ gram @ L
    A = 0.5 * (A + A.T) + noise * torch.eye(A.shape[0], dtype=_F64, device=A.device)
    C = safe_cholesky(A, name="σ²I + L WᵀW L")
    R = torch.linalg.solve_triangular(C, L, upper=False)  # C⁻¹ L
    return noise * (R.T @ R)


class AdditiveGGP(HeldOutNoise, Method):
    """GGP on a sum of kernels of input groups, one grid each (module docstring).

    Args:
        mean, kernel, likelihood: GPyTorch constant mean, the expression's kernel (an
            ``AdditiveKernel`` of ``ScaleKernel`` of RBF/Matérn with ``active_dims``, or one such
            term), Gaussian likelihood.
        options: resolved options (the expression, flat grids, solver, probes, tolerances).
    """

    key = "ggp"
    needs_data_for_prediction = True
    summary_types = (AdditiveStatistics, Grid)

    def __init__(self, mean, kernel, likelihood, *, num_dims: int, options: dict[str, Any]):
        super().__init__(task="regression", options=options)
        self.mean, self.kernel, self.likelihood = mean, kernel, likelihood
        self.num_dims = num_dims
        _, self.groups = additive_groups(options["kernel"], num_dims)
        self.columns = [list(group.columns) for group in self.groups]
        self._memo = StatisticsMemo()

    @property
    def grids(self) -> list[Grid]:
        return additive_grids(self.options, self.columns)

    def _terms(self) -> list[Any]:
        """The ScaleKernel of each group, in the expression's order."""
        return list(self.kernel.kernels) if hasattr(self.kernel, "kernels") else [self.kernel]

    def _group_terms(self, group: Group) -> list[Any]:
        terms = self._terms()
        return [terms[t] for t in group.terms]

    def _block_kernel(self, grids: list[Grid]) -> BlockGridKernel:
        return BlockGridKernel(tuple(
            group_grid_kernel(self._group_terms(group), group, grid, self.num_dims)
            for group, grid in zip(self.groups, grids, strict=True)))

    def statistics(self, data, chunk_size: int = 100_000) -> AdditiveStatistics:
        """One streaming pass over ``data``; the same tensors again reuse the last pass."""
        o = self.options
        grids = self.grids
        settings = (tuple(grids), o["num_probes"], o["seed"], self.noise.device)
        stats = self._memo.get(data, settings)
        if stats is None:
            stats = additive_statistics(data, grids, self.columns, num_probes=o["num_probes"],
                                        seed=o["seed"], chunk_size=chunk_size,
                                        device=self.noise.device)
            self._memo.put(data, settings, stats)
        return stats

    def condition(self, x: Tensor, y: Tensor) -> GridState:
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        return self.condition_stats(self.statistics((x, y)))

    def training_loss(self, x: Tensor, y: Tensor):
        """The loss on (x, y): its statistics computed once, each step O(M² + m log m)."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        stats = self.statistics((x, y))

        def loss(model: AdditiveGGP, xb: Tensor, yb: Tensor) -> Tensor:
            if xb is not x:
                return model.loss(model.condition(xb, yb))
            return model.loss(model.condition_stats(stats))
        return loss

    def condition_stats(self, stats: AdditiveStatistics) -> GridState:
        if list(stats.grids) != self.grids:
            raise ValueError("the statistics were computed on different grids than the model's")
        GK = self._block_kernel(list(stats.grids))
        return condition_statistics(self.options, stats, GK, self.noise,
                                    self.mean.constant.reshape(()))

    def loss(self, state: GridState) -> Tensor:
        """−log p(y)/n; gradients w.r.t. every group's ℓ and s, σ², μ."""
        if not torch.isfinite(state.logdet.detach()):
            raise ValueError("the log-likelihood needs probes: build with num_probes >= 1")
        value = 0.5 * (state.quad + state.logdet) / state.n + 0.5 * math.log(2 * math.pi)
        return value.to(self.noise.dtype)

    def summary(self, state: GridState) -> AdditiveStatistics:
        """A saved model keeps the statistics (O(M²), not the data)."""
        return state.data

    def from_summary(self, summary: AdditiveStatistics) -> GridState:
        with torch.no_grad():
            return self.condition_stats(summary)

    def predict(self, state: GridState, x_test: Tensor, chunk_size: int = 4096) -> Predictive:
        """Mean μ + w_*ᵀa and latent variance w_*ᵀK_Bw_* − (posterior reduction), by the
        ``variance`` option (LOVE or exact solves); groups beyond reach give their prior."""
        check_x(x_test, num_dims=self.num_dims, name="x_test")
        grids = self._grids_of(state)
        with torch.no_grad():
            GK = self._block_kernel(grids)
            term = self._variance_term(GK, state.data)
            groups = [self._group_terms(group) for group in self.groups]
            reach = [(torch.tensor(lo, dtype=_F64, device=x_test.device),
                      torch.tensor(hi, dtype=_F64, device=x_test.device),
                      group_reach(terms, cols).to(x_test.device)[None])
                     for (lo, hi), terms, cols in zip((g.bounds() for g in grids), groups,
                                                      self.columns, strict=True)]
            scales = [sum(t.outputscale.to(_F64).reshape(()) for t in terms) for terms in groups]

            def chunk(xc: Tensor) -> Predictive:
                rows, far_var = self._test_rows(xc.to(_F64), grids, reach, scales)
                mean = state.mean_constant.to(_F64) + rows.matmul(state.mean_weights)
                var = far_var + term(rows).clamp_min(0.0)
                return Predictive(mean.to(xc.dtype), var.to(xc.dtype), noise=state.noise)

            size = (chunk_size if self._variance(GK) == "lanczos" else
                    min(chunk_size, 256 if GK.num_grid > DENSE_VARIANCE_MAX else 1024))
            return predict_in_chunks(chunk, x_test, size)

    def _grids_of(self, state: GridState) -> list[Grid]:
        """The grids ``state`` was conditioned on (its statistics')."""
        return list(state.data.grids)

    def _variance(self, GK: BlockGridKernel) -> str:
        """The ``variance`` option resolved: ``auto`` is ``exact`` (by a dense factor) where M
        is at most :data:`DENSE_VARIANCE_MAX`, else LOVE."""
        chosen = self.options["variance"]
        if chosen == "auto":
            return "exact" if GK.num_grid <= DENSE_VARIANCE_MAX else "lanczos"
        return chosen

    def _test_rows(self, x: Tensor, grids, reach, scales) -> tuple[AdditiveRows, Tensor]:
        """Each group's rows, zero for points beyond its reach (whose prior variance is
        added to the second output instead)."""
        groups, far_var = [], torch.zeros(x.shape[0], dtype=_F64, device=x.device)
        for grid, cols, (lower, upper, ell), scale in zip(grids, self.columns, reach, scales,
                                                          strict=True):
            xg = x[:, cols]
            far = beyond_box(xg, lower, upper, ell)
            if bool(far.any()):
                xg = torch.where(far[:, None], (0.5 * (lower + upper)).to(xg.dtype), xg)
                far_var = far_var + far.to(_F64) * scale
            rows = interpolate(grid, xg)
            if bool(far.any()):
                rows = Interpolation(rows.index, rows.weight * (~far).to(_F64)[:, None],
                                     rows.num_grid)
            groups.append(rows)
        return AdditiveRows(tuple(groups)), far_var

    def _variance_term(self, GK: BlockGridKernel, stats: AdditiveStatistics):
        """rows ↦ w_*ᵀ (K_B − K_B Wᵀ K̃⁻¹ W K_B) w_*, the latent posterior variance.

        ``exact`` with M ≤ :data:`DENSE_VARIANCE_MAX`: the posterior covariance on the grids in
        Woodbury form, σ² (C⁻¹L)ᵀ(C⁻¹L) with L = K_B^{1/2} (per block) and C Cᵀ = σ²I + L WᵀW L,
        formed once (O(M³)), then S² entries of it per test point; beyond it solves per test
        point. ``lanczos``: LOVE (rank ``variance_rank``), which keeps too much
        of the prior where many directions of the grids are informed.
        """
        o = self.options
        K, B, s2 = operators(o, GK, stats, self.noise)
        pairs = [pair_offsets(g.support, g.num_dims) for g in stats.grids]
        prior = lambda rows: GK.interp_quad(rows, pairs)  # noqa: E731
        variance = self._variance(GK)
        if variance == "exact" and GK.num_grid <= DENSE_VARIANCE_MAX:
            posterior = grid_posterior(GK, stats.gram, s2)
            return lambda rows: rows.quad(posterior)
        if variance == "exact" and use_preconditioned(o, GK):
            system = whitened_system(GK, B, stats, s2)
            return lambda rows: system.posterior_quad(rows.columns(), rtol=o["rtol"],
                                                      max_iters=o["max_iters"])
        if variance == "exact":
            def exact(rows):
                Kw = K(rows.columns())
                xd, _ = span_cg(K, B, s2, Kw, rtol=o["rtol"], max_iters=o["max_iters"])
                return prior(rows) - (Kw * xd).sum(0)
            return exact
        M = GK.num_grid
        b0 = K(torch.full((M,), 1.0 / M, dtype=_F64, device=stats.wt_y.device))
        _, P, T = span_lanczos(K, B, s2, b0, o["variance_rank"])
        reduction = love_term(GK, P, T)
        return lambda rows: prior(rows) - reduction(rows)

