r"""Regular grids and local interpolation W (notes/002 §3).

Structured kernel interpolation (Wilson & Nickisch 2015) approximates K_X ≈ W K_G Wᵀ; Yadav,
Sheldon & Musco (2021, "Faster Kernel Interpolation for Gaussian Processes", notes/002) run its
solvers on the sufficient statistics WᵀW, Wᵀy instead. This module holds the grid and W; the
structures built on them live beside it:

- :class:`Grid`: per dimension j, ``sizes[j]`` equally spaced nodes ``start_j + k h_j``, row-major
  linear index (first dimension slowest, notes §3.1). :func:`make_grid` pads the data box
  [lower, upper] with ``r`` nodes on each side (cubic r = 2, linear r = 1), so every point in
  [lower − h, upper + h) has all its neighbours: rows are never truncated (the reference code drops
  out-of-range neighbours, rows then sum to ≈ 1.018, notes §3.2). Points outside raise ValueError.
- :func:`interpolate` → :class:`Interpolation`: W as (n, s^d) node indices and weights, s = 4 (Keys
  cubic convolution, a = −0.5) or 2 (linear); the d-dimensional row is the Kronecker product of
  the 1-D rows. ``W v`` is a gather, ``Wᵀ u`` a scatter-add: O(n s^d). Never dense.
- The grid and W are defined in :mod:`gpscale.linalg.interpolation`, the stencil WᵀW
  (:class:`~gpscale.linalg.stencil.GramStencil`) in :mod:`gpscale.linalg.stencil`, the grid
  kernel K_G (:class:`~gpscale.linalg.toeplitz.GridKernel`, FFT products) in
  :mod:`gpscale.linalg.toeplitz`; this module re-exports all three (the latter two import only
  the first, so there is no import cycle). The solvers that run
  on (K_G, WᵀW) alone live in :mod:`gpscale.linalg.factorized`.

Everything computed from data (weights, statistics) is float64 (the m-dimensional solves are
float64, notes §9.2).
"""

from __future__ import annotations

from gpscale.linalg.interpolation import (
    INTERPOLATIONS,
    Grid,
    Interpolation,
    interpolate,
    keys_cubic,
    make_grid,
)
from gpscale.linalg.stencil import MAX_GROUP, GramStencil, cell_blocks, pair_offsets
from gpscale.linalg.toeplitz import PROFILES, GridKernel, grid_kernel

__all__ = [
    "INTERPOLATIONS", "MAX_GROUP", "PROFILES", "Grid", "GridKernel", "GramStencil",
    "Interpolation", "cell_blocks", "grid_kernel", "interpolate", "keys_cubic", "make_grid",
    "pair_offsets",
]
