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

What a group admits: any stationary kernel k(x − x') on at most three inputs, with its own
lengthscales and outputscale: RBF, Matérn ½, 3/2, 5/2, rational quadratic, periodic, and
products of these (on the union of their inputs: ``rbf(0) * periodic(0)`` is a locally
periodic kernel on one grid). One profile, or a product of one profile over single
inputs (RBF on any), is a Kronecker product built from the profile
(:func:`~gpscale.linalg.toeplitz.grid_kernel`); any other group's K_G is built from the
kernel's own values at the grid's offsets (:func:`~gpscale.linalg.toeplitz.evaluated_grid_kernel`:
Toeplitz on one input, multilevel Toeplitz on more, whose products the factorized CG solves).
Linear and polynomial kernels are not functions of x − x' and have no Toeplitz form.

Grid sizes per group: :data:`ADDITIVE_GRID_SIZE` points per input by the group's size (smaller
than one grid's defaults: M = Σ_g m_g sets the dense WᵀW's M² memory and product cost); one
``grid_size`` value applies to every input of every group, or one value per input of each group
in order.

A test point beyond the kernel's reach of a group's grid gets that group's prior (mean 0,
variance its outputscale) and no weight on it; within reach but outside a grid it is an error,
as for one grid. A periodic or rational quadratic factor never lets a point out of reach (the
one repeats, the other decays only polynomially): its group's grid must cover the test points
(``grid_bounds``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gpytorch
import torch
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.kernels import KERNELS
from gpscale.kernels.algebra import KernelSpec, KernelSyntaxError, parse_kernel
from gpscale.linalg.additive import (
    AdditiveRows,
    BlockGridKernel,
    accumulate_gram,
    additive_rows,
    mirror_blocks,
)
from gpscale.linalg.factorized import span_cg, span_lanczos
from gpscale.linalg.interpolation import Grid, Interpolation, interpolate, make_grid
from gpscale.linalg.ops import rademacher, safe_cholesky
from gpscale.linalg.reach import beyond_box
from gpscale.linalg.stencil import pair_offsets
from gpscale.linalg.toeplitz import evaluated_grid_kernel, grid_kernel
from gpscale.methods._common import HeldOutNoise
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.ski.solve import (
    GridState,
    condition_statistics,
    love_term,
    operators,
    use_preconditioned,
    whitened_system,
)
from gpscale.methods.ski.statistics import MAX_DIMS, StatisticsMemo, float64_chunks
from gpscale.validation import check_x, check_xy

__all__ = ["ADDITIVE_GRID_SIZE", "AdditiveGGP", "AdditiveStatistics", "additive_refusal",
           "additive_statistics", "additive_terms", "resolve_additive_grids"]

ADDITIVE_GRID_SIZE = {1: 128, 2: 32, 3: 12}
"""Default grid points per input of a group of 1, 2 or 3 inputs (module docstring)."""
DENSE_VARIANCE_MAX = 8192
"""Largest M whose posterior covariance on the grids ``variance='auto'`` factors densely."""
DENSE_GRAM_MAX = 16_384
"""Largest M = Σ_g m_g whose dense WᵀW (M² float64: 2 GiB) the additive model holds."""
_F64 = torch.float64
_PROFILES = {"rbf": "rbf", "matern12": "matern12", "matern32": "matern32",
             "matern52": "matern52"}
GRID_LEAVES = (*_PROFILES, "rq", "periodic")
"""Leaves of a group's kernel: stationary, k(x − x') (module docstring)."""
_UNBOUNDED = ("rq", "periodic")
"""Leaves that never let a point out of reach (module docstring)."""


def additive_refusal(text: str) -> str | None:
    """Why ``ggp`` cannot take the kernel ``text`` (``None``: it can, or it is a name)."""
    if text in KERNELS:
        return None
    try:
        spec = parse_kernel(text)
    except KernelSyntaxError:
        return None  # the option's parser names the position
    for term in spec.terms:
        for leaf in term:
            if leaf.name not in GRID_LEAVES:
                why = ("has no inputs to put on a grid (the constant mean takes an offset)"
                       if leaf.name == "constant" else "is not a function of x − x'")
                return (f"SKI and GGP interpolate sums of stationary kernels on at most "
                        f"{MAX_DIMS} inputs each; {leaf.name!r} {why}")
            if leaf.columns is None:
                return (f"each term of an additive SKI or GGP needs its inputs (at most "
                        f"{MAX_DIMS}), e.g. {leaf.name}(0, 1); {leaf.text!r} takes every input")
    return None


def additive_terms(text: str, num_dims: int
                   ) -> tuple[KernelSpec, list[str | None], list[list[int]]]:
    """The parsed expression, each term's profile (``None`` where its K_G is built from the
    kernel's values: module docstring) and input indices.

    Raises:
        ValueError: what :func:`additive_refusal` names, or a group of more than 3 inputs.
    """
    why = additive_refusal(text)
    if why is not None:
        raise ValueError(f"kernel {text!r}: {why}")
    spec = parse_kernel(text)
    columns = []
    for term, leaf_cols in zip(spec.terms, spec.resolve(num_dims), strict=True):
        cols = list(dict.fromkeys(j for c in leaf_cols for j in c))  # factors may share
        where = " * ".join(leaf.text for leaf in term)
        if len(cols) > MAX_DIMS:
            raise ValueError(f"kernel {text!r}: the term {where!r} is on {len(cols)} inputs; a "
                             f"grid takes at most {MAX_DIMS} (split it into smaller groups, "
                             "or use svgp or cagp-opt)")
        columns.append(cols)
    return spec, [_profile_of(term, cols) for term, cols in
                  zip(spec.terms, spec.resolve(num_dims), strict=True)], columns


def _profile_of(term, leaf_cols) -> str | None:
    """The profile whose Kronecker (or joint-distance) K_G :func:`grid_kernel` builds for a
    term: one RBF or Matérn leaf, or a product of one of them over single inputs (RBF over
    any); ``None`` otherwise."""
    names = {leaf.name for leaf in term}
    flat = [j for c in leaf_cols for j in c]
    if len(names) > 1 or not names <= set(_PROFILES) or len(set(flat)) < len(flat):
        return None
    name = names.pop()
    if len(term) == 1 or name == "rbf" or all(len(c) == 1 for c in leaf_cols):
        return _PROFILES[name]
    return None


def _leaves(term) -> list[Any]:
    base = term.base_kernel
    return list(base.kernels) if hasattr(base, "kernels") else [base]


def term_lengthscale(term) -> Tensor:
    """The lengthscales (d_g,) of a term (a ScaleKernel) over its inputs in order: one
    leaf's, or a product's leaves' concatenated (each broadcast over its own inputs)."""
    return torch.cat([leaf.lengthscale.reshape(-1).expand(len(leaf.active_dims))
                      for leaf in _leaves(term)])


def term_reach(term, columns: list[int]) -> Tensor:
    """The lengthscales (d_g,) over a term's ``columns`` that decide its reach: a product is
    negligible where any of its factors is, so each input takes the shortest lengthscale of
    the factors on it that decay; infinite where only a factor that never lets a point out of
    reach (:data:`_UNBOUNDED`) reads it."""
    unbounded = (gpytorch.kernels.PeriodicKernel, gpytorch.kernels.RQKernel)
    reach = torch.full((len(columns),), math.inf, dtype=_F64)
    with torch.no_grad():
        for leaf in _leaves(term):
            if isinstance(leaf, unbounded):
                continue
            ell = leaf.lengthscale.detach().reshape(-1).expand(len(leaf.active_dims))
            for k, col in enumerate(leaf.active_dims.tolist()):
                at = columns.index(col)
                reach[at] = min(float(reach[at]), float(ell[k]))
    return reach


def term_at_offsets(term, columns: list[int], num_dims: int) -> Callable[[Tensor], Tensor]:
    """τ (P, d_g) ↦ the term's k(τ, 0) (P,) in float64: the offsets placed on the term's
    ``columns`` of ``num_dims`` inputs, evaluated by the GPyTorch kernel itself."""
    def values(tau: Tensor) -> Tensor:
        dtype = term.outputscale.dtype
        x = tau.new_zeros(tau.shape[0], num_dims, dtype=dtype)
        x[:, columns] = tau.to(dtype)
        return term(x, x[:1] * 0).to_dense()[:, 0].to(_F64)
    return values


def resolve_additive_grids(columns: list[list[int]], init, grid_size, grid_bounds,
                           grid_margin: float, interpolation: str, *,
                           dense_gram: bool = True) -> dict[str, Any]:
    """Flat per-input lists (groups in order) of grid sizes and corners (module docstring);
    ``dense_gram``: the model holds WᵀW densely (``ggp``), so M is bounded."""
    dims = [len(c) for c in columns]
    total = sum(dims)
    if grid_size is None:
        sizes = [ADDITIVE_GRID_SIZE[d] for d in dims for _ in range(d)]
    elif isinstance(grid_size, int | float):
        sizes = [int(grid_size)] * total
    else:
        sizes = [int(s) for s in grid_size]
        if len(sizes) == 1:
            sizes = sizes * total
    if len(sizes) != total:
        raise ValueError(f"grid_size needs 1 value or one per input of each group ({total} for "
                         f"groups of {dims} inputs); got {len(sizes)}")
    if grid_bounds is not None:
        lower, upper = ([float(v) for v in b] for b in grid_bounds)
    elif init is not None:
        x = init[0].detach().to(_F64)[:, [j for cols in columns for j in cols]]
        lo, hi = x.min(0).values, x.max(0).values
        span = torch.clamp_min(hi - lo, 1e-6)
        lower, upper = (lo - grid_margin * span).tolist(), (hi + grid_margin * span).tolist()
    else:
        raise ValueError("an additive ggp needs grid_bounds=(lower, upper) when init is None")
    if len(lower) != total or len(upper) != total:
        raise ValueError(f"grid_bounds needs (lower, upper) with {total} entries each (one "
                         "per input of each group)")
    opts = {"grid_size": sizes, "grid_lower": lower, "grid_upper": upper,
            "interpolation": interpolation}
    grids = additive_grids(opts, columns)
    size = sum(g.num_points for g in grids)
    if dense_gram and size > DENSE_GRAM_MAX:
        raise ValueError(f"the additive grids hold M = {size:,} points; their dense WᵀW needs "
                         f"M ≤ {DENSE_GRAM_MAX:,}: give a smaller grid_size")
    return opts


def additive_grids(options: dict[str, Any], columns: list[list[int]]) -> list[Grid]:
    """The groups' grids from the flat options of :func:`resolve_additive_grids`."""
    grids, start = [], 0
    for cols in columns:
        stop = start + len(cols)
        grids.append(make_grid(options["grid_lower"][start:stop],
                               options["grid_upper"][start:stop],
                               options["grid_size"][start:stop], options["interpolation"]))
        start = stop
    return grids


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
        _, self.profiles, self.columns = additive_terms(options["kernel"], num_dims)
        self._memo = StatisticsMemo()

    @property
    def grids(self) -> list[Grid]:
        return additive_grids(self.options, self.columns)

    def _terms(self) -> list[Any]:
        """The ScaleKernel of each group, in the expression's order."""
        return list(self.kernel.kernels) if hasattr(self.kernel, "kernels") else [self.kernel]

    def _block_kernel(self, grids: list[Grid]) -> BlockGridKernel:
        blocks = []
        for term, grid, profile, cols in zip(self._terms(), grids, self.profiles, self.columns,
                                             strict=True):
            if profile is None:  # from the kernel's own values (module docstring)
                blocks.append(evaluated_grid_kernel(
                    grid, term_at_offsets(term, cols, self.num_dims),
                    device=term.outputscale.device))
                continue
            product = hasattr(term.base_kernel, "kernels")  # one profile's Kronecker product
            blocks.append(grid_kernel(grid, profile, term_lengthscale(term),
                                      term.outputscale.reshape(()), per_input=product))
        return BlockGridKernel(tuple(blocks))

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
            reach = [(torch.tensor(lo, dtype=_F64, device=x_test.device),
                      torch.tensor(hi, dtype=_F64, device=x_test.device),
                      term_reach(t, cols).to(x_test.device)[None])
                     for (lo, hi), t, cols in zip((g.bounds() for g in grids), self._terms(),
                                                  self.columns, strict=True)]
            scales = [t.outputscale.to(_F64).reshape(()) for t in self._terms()]

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

