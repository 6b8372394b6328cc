r"""Regular grids and local interpolation W (notes/002 §3).

Structured kernel interpolation (Wilson & Nickisch 2015) approximates K_X ≈ W K_G Wᵀ; Yadav,
Sheldon & Musco (2021, "Faster Kernel Interpolation for Gaussian Processes", notes/002) run its
solvers on the sufficient statistics WᵀW, Wᵀy instead. This module holds the grid and W:

- :class:`Grid`: per dimension j, ``sizes[j]`` equally spaced nodes ``start_j + k h_j``, row-major
  linear index (first dimension slowest, notes §3.1). :func:`make_grid` pads the data box
  [lower, upper] with ``r`` nodes on each side (cubic r = 2, linear r = 1), so every point in
  [lower − h, upper + h) has all its neighbours: rows are never truncated (the reference code drops
  out-of-range neighbours, rows then sum to ≈ 1.018, notes §3.2). Points outside raise ValueError.
- :func:`interpolate` → :class:`Interpolation`: W as (n, s^d) node indices and weights, s = 4 (Keys
  cubic convolution, a = −0.5) or 2 (linear); the d-dimensional row is the Kronecker product of
  the 1-D rows. ``W v`` is a gather, ``Wᵀ u`` a scatter-add: O(n s^d). Never dense.

The structures built on them live beside it: the stencil WᵀW
(:class:`~gpscale.linalg.stencil.GramStencil`) in :mod:`gpscale.linalg.stencil` and the grid
kernel K_G (:class:`~gpscale.linalg.toeplitz.GridKernel`, FFT products) in
:mod:`gpscale.linalg.toeplitz`, which both import this module; the solvers that run on
(K_G, WᵀW) alone in :mod:`gpscale.linalg.factorized`.

Everything computed from data (weights, statistics) is float64 (the m-dimensional solves are
float64, notes §9.2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["INTERPOLATIONS", "Grid", "Interpolation", "interpolate", "keys_cubic", "make_grid"]

INTERPOLATIONS = {"cubic": 4, "linear": 2}
"""Interpolation scheme -> support s (nodes per dimension per point)."""

_F64 = torch.float64


@dataclass(frozen=True)
class Grid:
    """A regular tensor-product grid with m = Π_j sizes[j] nodes.

    Attributes:
        start: first node per dimension.
        spacing: h_j per dimension.
        sizes: nodes m_j per dimension (padding included).
        interpolation: ``'cubic'`` or ``'linear'``.
    """

    start: tuple[float, ...]
    spacing: tuple[float, ...]
    sizes: tuple[int, ...]
    interpolation: str = "cubic"

    @property
    def num_dims(self) -> int:
        return len(self.sizes)

    @property
    def num_points(self) -> int:
        return math.prod(self.sizes)

    @property
    def support(self) -> int:
        return INTERPOLATIONS[self.interpolation]

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides of the linear node index (first dimension slowest)."""
        return tuple(math.prod(self.sizes[j + 1:]) for j in range(self.num_dims))

    def nodes(self, j: int) -> Tensor:
        """The m_j node coordinates of dimension j (float64)."""
        return self.start[j] + self.spacing[j] * torch.arange(self.sizes[j], dtype=_F64)

    def points(self) -> Tensor:
        """All m nodes (m, d) in linear-index order; dense, for tests and small grids."""
        axes = torch.meshgrid(*[self.nodes(j) for j in range(self.num_dims)], indexing="ij")
        return torch.stack([a.reshape(-1) for a in axes], -1)

    def bounds(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """[low, high) per dimension: the points :func:`interpolate` accepts."""
        r = self.support // 2
        low = tuple(s + (r - 1) * h for s, h in zip(self.start, self.spacing, strict=True))
        high = tuple(s + (m - r) * h
                     for s, h, m in zip(self.start, self.spacing, self.sizes, strict=True))
        return low, high


def make_grid(lower: Sequence[float], upper: Sequence[float], sizes: Sequence[int],
              interpolation: str = "cubic") -> Grid:
    """A grid of ``sizes[j]`` nodes whose interior spans [lower_j, upper_j] in each dimension.

    r = s/2 padding nodes lie outside the box on each side (cubic: 2, linear: 1), so every point
    of [lower − h, upper + h) has all s^d neighbours. ``sizes[j] − 2r − 1`` intervals cover the box.

    Raises:
        ValueError: unknown interpolation, mismatched lengths, lower ≥ upper, or sizes too small.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; valid: "
                         f"{', '.join(INTERPOLATIONS)}")
    if not len(lower) == len(upper) == len(sizes) or len(sizes) == 0:
        raise ValueError(f"lower, upper and sizes need one entry per dimension; got "
                         f"{len(lower)}, {len(upper)}, {len(sizes)}")
    r = INTERPOLATIONS[interpolation] // 2
    start, spacing = [], []
    for lo, hi, m in zip(lower, upper, sizes, strict=True):
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"grid bounds need lower < upper (finite); got [{lo}, {hi}]")
        if int(m) < 2 * r + 2:
            raise ValueError(f"{interpolation} interpolation needs at least {2 * r + 2} grid "
                             f"points per dimension (2·{r} padding); got {m}")
        h = (hi - lo) / (int(m) - 2 * r - 1)
        start.append(float(lo - r * h))
        spacing.append(float(h))
    return Grid(tuple(start), tuple(spacing), tuple(int(m) for m in sizes), interpolation)


def keys_cubic(t: Tensor) -> Tensor:
    """Keys' cubic convolution kernel (a = −0.5) at distances t ≥ 0 in grid units (notes §3.2)."""
    t = t.abs()
    near = (1.5 * t - 2.5) * t * t + 1
    far = ((-0.5 * t + 2.5) * t - 4) * t + 2
    return torch.where(t <= 1, near, torch.where(t < 2, far, torch.zeros_like(t)))


@dataclass(frozen=True)
class Interpolation:
    """W (n, m) as s^d node indices and weights per row (never dense).

    Attributes:
        index: (n, s^d) int64 linear node indices, local order row-major in the per-dim offsets.
        weight: (n, s^d) float64 weights.
        num_grid: m.
    """

    index: Tensor
    weight: Tensor
    num_grid: int

    def matmul(self, v: Tensor) -> Tensor:
        """W v for v (m,) or (m, k): a gather, O(n s^d k).

        With k columns the gather runs one support node at a time, so its temporaries are
        (n, k), not (n, s^d, k): for a chunk of 10⁵ rows, 64 nodes (cubic, 3-D) and 16
        columns that is 13 MB instead of 820 MB allocated and returned to the system per call.
        """
        if v.dim() == 1:
            return (v[self.index] * self.weight).sum(-1)
        w = self.weight.to(v.dtype)
        out = v[self.index[:, 0]] * w[:, :1]
        for j in range(1, self.index.shape[1]):
            out += v[self.index[:, j]] * w[:, j:j + 1]
        return out

    def rmatmul(self, u: Tensor) -> Tensor:
        """Wᵀ u for u (n,) or (n, k): a scatter-add, O(n s^d k), by support node with k
        columns (temporaries (n, k); see :meth:`matmul`)."""
        w = self.weight.to(u.dtype)
        if u.dim() == 1:
            out = u.new_zeros(self.num_grid)
            return out.index_add_(0, self.index.reshape(-1), (w * u[:, None]).reshape(-1))
        out = u.new_zeros(self.num_grid, u.shape[1])
        for j in range(self.index.shape[1]):
            out.index_add_(0, self.index[:, j], u * w[:, j:j + 1])
        return out

    def to_dense(self) -> Tensor:
        """Dense W (n, m); for tests on small problems only."""
        n = self.index.shape[0]
        W = self.weight.new_zeros(n, self.num_grid)
        return W.scatter_add_(1, self.index, self.weight)


def _rows_1d(grid: Grid, x: Tensor, j: int) -> tuple[Tensor, Tensor]:
    """Per-dimension node indices and weights (n, s) of x (n,) in dimension j."""
    u = (x - grid.start[j]) / grid.spacing[j]
    base = torch.floor(u)
    t = u - base
    base = base.long()
    r = grid.support // 2
    low, high = r - 1, grid.sizes[j] - r - 1
    bad = (base < low) | (base > high)
    if bool(bad.any()):
        lo, hi = grid.bounds()
        i = int(torch.nonzero(bad)[0])
        raise ValueError(
            f"{int(bad.sum())} point(s) lie outside the interpolation grid in dimension {j} "
            f"(valid [{lo[j]:.6g}, {hi[j]:.6g}); e.g. row {i} has x = {float(x[i]):.6g}). "
            "Widen the grid to cover every training and test input: option grid_margin=... "
            "(the share of the training inputs' range added each side) or grid_bounds=... "
            "(in the inputs' standardised units where the estimator standardises them).")
    if grid.interpolation == "cubic":
        offsets = torch.arange(-1, 3, device=x.device)
        weight = keys_cubic(t[:, None] - offsets.to(t.dtype))
    else:
        offsets = torch.arange(0, 2, device=x.device)
        weight = torch.stack([1 - t, t], -1)
    return base[:, None] + offsets, weight


def interpolate(grid: Grid, x: Tensor) -> Interpolation:
    """W's rows for points x (n, d): Kronecker products of the 1-D rows (notes §3.2).

    Raises:
        ValueError: a point lies outside ``grid.bounds()`` or the dimension does not match.
    """
    if x.dim() != 2 or x.shape[1] != grid.num_dims:
        raise ValueError(f"x must be (n, {grid.num_dims}) for this grid; got {tuple(x.shape)}")
    x = x.detach().to(_F64)
    n, s = x.shape[0], grid.support
    index = torch.zeros(n, 1, dtype=torch.long, device=x.device)
    weight = torch.ones(n, 1, dtype=_F64, device=x.device)
    for j, stride in enumerate(grid.strides):
        idx, w = _rows_1d(grid, x[:, j], j)
        index = (index[:, :, None] + stride * idx[:, None, :]).reshape(n, -1)
        weight = (weight[:, :, None] * w[:, None, :]).reshape(n, -1)
    assert index.shape[1] == s ** grid.num_dims
    return Interpolation(index, weight, grid.num_points)
