"""Pieces of ``ski``/``ggp`` (:mod:`gpscale.methods.ski`) that need no module.

GGP's sufficient statistics (notes/002 §4.5), one streaming pass over the data in float64: WᵀW
(as a stencil), Wᵀy, Wᵀ1, yᵀy, Σy, n and Rademacher probe sketches Wᵀz, O(7^d m + p m) floats
independent of n; and the resolution of the grid options. :mod:`gpscale.methods.ski` re-exports
the statistics.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gpscale.linalg.interpolation import INTERPOLATIONS, Grid, interpolate, make_grid
from gpscale.linalg.ops import rademacher
from gpscale.linalg.stencil import GramStencil, cell_blocks, pair_offsets
from gpscale.validation import check_xy

__all__ = ["CELL_BUFFER_BYTES", "DEFAULT_GRID_SIZE", "MAX_DIMS", "StatisticsAccumulator",
           "StatisticsMemo", "SufficientStatistics", "grid_options", "sufficient_statistics"]

MAX_DIMS = 3
DEFAULT_GRID_SIZE = {1: 1024, 2: 100, 3: 32}
CELL_BUFFER_BYTES = 6 * 2**30
"""Largest per-cell buffer (m S² float64, S = s^d) :class:`StatisticsAccumulator` keeps; beyond
it the chunks scatter into the stencil directly."""
_F64 = torch.float64


@dataclass(frozen=True)
class SufficientStatistics:
    """What ``ggp`` keeps of the data (§4.5): O(7^d m + p m) floats, independent of n.

    Attributes:
        grid: the grid the statistics belong to.
        gram: WᵀW as a stencil.  wt_y: Wᵀy (m,).  wt_one: Wᵀ1 (m,).
        yty: yᵀy.  y_sum: Σ y.  n: number of points (float64 scalars).
        wt_probes: Wᵀz_l for p fixed Rademacher probes z_l ∈ ℝⁿ (m, p).  probe_sq: ‖z_l‖² (p,).
        gram_csr: WᵀW as torch CSR when the model uses ``wtw_format='csr'`` (else None).
    """

    grid: Grid
    gram: GramStencil
    wt_y: Tensor
    wt_one: Tensor
    yty: Tensor
    y_sum: Tensor
    n: int
    wt_probes: Tensor
    probe_sq: Tensor
    gram_csr: Tensor | None = None


def float64_chunks(data, chunk_size: int):
    """(x, y) float64 tensor chunks from a pair of arrays/tensors/memmaps or an iterable."""
    if isinstance(data, tuple) and len(data) == 2 and hasattr(data[0], "shape"):
        x, y = data
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
        for start in range(0, x.shape[0], chunk_size):
            yield _as_f64(x[start:start + chunk_size]), _as_f64(y[start:start + chunk_size])
        return
    for x, y in data:
        yield _as_f64(x), _as_f64(y)


def _as_f64(a) -> Tensor:
    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.asarray(a, dtype=np.float64))
    return a.detach().to(_F64)


def sufficient_statistics(data, grid: Grid, *, num_probes: int = 16, seed: int = 0,
                          chunk_size: int = 100_000, device=None) -> SufficientStatistics:
    """WᵀW, Wᵀy, Wᵀ1, yᵀy, Σy, n and probe sketches Wᵀz in one pass over ``data`` (float64).

    Args:
        data: ``(x, y)`` tensors or arrays (NumPy memmaps are read chunk by chunk), or any
            iterable of ``(x_chunk, y_chunk)`` (e.g. :class:`gpscale.data.synthetic.FieldStream`).
        grid: fixed grid; every point must lie in ``grid.bounds()`` (else ValueError).
        num_probes: p Rademacher probes for the log-determinant (drawn chunk by chunk from
            ``seed``; WᵀW, Wᵀy, yᵀy, n do not depend on the chunking, the probes do).
        chunk_size: rows per chunk for array input.
        device: where the statistics are summed (each chunk is moved there); default the CPU.

    Cost: O(n (16^d + (p + 2) 4^d)) time (cubic), O(chunk · 16^d) transient memory.
    """
    acc = StatisticsAccumulator(grid, num_probes, device=device)
    generator = torch.Generator().manual_seed(seed)
    for x, y in float64_chunks(data, chunk_size):
        check_xy(x, y.reshape(-1))
        x, y = x.to(acc.device), y.reshape(-1).to(acc.device)
        probes = (rademacher(y.shape[0], num_probes, dtype=_F64, generator=generator)
                  .to(acc.device) if num_probes else None)
        acc.add(x, y, probes)
    return acc.result("no data: the chunks were empty")


class StatisticsAccumulator:
    """Running sums of :class:`SufficientStatistics` over chunks of (x, y) in float64.

    WᵀW is summed per cell first: an (m, S, S) buffer (S = s^d) holds Σ w_i w_iᵀ of the points
    whose first node is each grid node, added to by rows (:func:`cell_blocks`), and is scattered
    into the stencil once, by :meth:`result`. Per chunk that costs S² scattered values per
    occupied cell instead of per point (at n = 10⁷, d = 3 about 200 points share a cell). The
    buffer is allocated lazily (untouched pages cost nothing) and used only when it fits in
    ``cell_buffer_bytes``; otherwise each chunk scatters into the stencil itself.
    """

    def __init__(self, grid: Grid, num_probes: int, *, cell_buffer_bytes: int | None = None,
                 device=None):
        m, S = grid.num_points, grid.support ** grid.num_dims
        limit = CELL_BUFFER_BYTES if cell_buffer_bytes is None else cell_buffer_bytes
        self.grid, self.num_probes = grid, num_probes
        self.device = torch.device("cpu") if device is None else torch.device(device)
        zeros = functools.partial(torch.zeros, dtype=_F64, device=self.device)
        self.gram = GramStencil.zeros(grid.sizes, grid.support, device=self.device)
        self.pairs = pair_offsets(grid.support, grid.num_dims).to(self.device)
        self.cell_sums = zeros(m, S, S) if m * S * S * 8 <= limit else None
        self.touched = torch.zeros(m, dtype=torch.bool, device=self.device)
        self.wt_y, self.wt_one, self.wt_probes = zeros(m), zeros(m), zeros(m, num_probes)
        self.yty, self.y_sum, self.n = zeros(()), zeros(()), 0

    def add(self, x: Tensor, y: Tensor, probes: Tensor | None) -> None:
        """Add a chunk: x (b, d), y (b,), probes (b, p) or None (p = 0)."""
        rows = interpolate(self.grid, x)
        if self.cell_sums is None:
            self.gram.add_(rows, self.pairs)
        else:
            for cells, blocks in cell_blocks(rows):
                self.cell_sums.index_add_(0, cells, blocks)
                self.touched[cells] = True
        self.wt_y += rows.rmatmul(y)
        self.wt_one += rows.rmatmul(torch.ones_like(y))
        if probes is not None:
            self.wt_probes += rows.rmatmul(probes)
        self.yty, self.y_sum, self.n = self.yty + y @ y, self.y_sum + y.sum(), self.n + y.shape[0]

    def _flush(self, block: int = 1024) -> None:
        """Move the per-cell sums into the stencil (touched cells only) and clear them."""
        if self.cell_sums is None:
            return
        cells = torch.nonzero(self.touched)[:, 0]
        for start in range(0, cells.numel(), block):
            batch = cells[start:start + block]
            self.gram.add_blocks_(batch, self.cell_sums[batch], self.pairs)
            self.cell_sums[batch] = 0
        self.touched.zero_()

    def result(self, empty_message: str) -> SufficientStatistics:
        """The statistics; ValueError(empty_message) when no rows were added."""
        if self.n == 0:
            raise ValueError(empty_message)
        self._flush()
        return SufficientStatistics(self.grid, self.gram, self.wt_y, self.wt_one, self.yty,
                                    self.y_sum, self.n, self.wt_probes,
                                    torch.full((self.num_probes,), float(self.n), dtype=_F64,
                                               device=self.device))


def grid_options(num_dims: int, init, grid_size, grid_bounds, grid_margin: float,
                  interpolation: str) -> dict[str, Any]:
    """Resolve the grid: sizes per dimension and the box [lower, upper] it pads around."""
    if num_dims > MAX_DIMS:
        raise ValueError(f"ski/ggp build a grid of m = Π_j m_j points, exponential in the input "
                         f"dimension; d = {num_dims} > {MAX_DIMS} is impractical. Give a sum of "
                         f"kernels on groups of at most {MAX_DIMS} inputs, one grid each (-o "
                         "kernel='rbf(0) + rbf(1, 2) + ...'), or use a method for higher "
                         "dimensions: 'softki', 'svgp', 'sgpr' or 'cagp-opt'.")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; valid: "
                         f"{', '.join(INTERPOLATIONS)}")
    sizes = grid_size if grid_size is not None else DEFAULT_GRID_SIZE[num_dims]
    sizes = ([int(sizes)] * num_dims if isinstance(sizes, int | float)
             else [int(s) for s in sizes])
    if len(sizes) != num_dims:
        raise ValueError(f"grid_size needs 1 or {num_dims} entries; got {len(sizes)}")
    if grid_bounds is not None:
        lower, upper = ([float(v) for v in b] for b in grid_bounds)
    elif init is not None:
        x = init[0].detach().to(_F64)
        lo, hi = x.min(0).values, x.max(0).values
        span = torch.clamp_min(hi - lo, 1e-6)
        lower = (lo - grid_margin * span).tolist()
        upper = (hi + grid_margin * span).tolist()
    else:
        raise ValueError("ski/ggp need grid_bounds=(lower, upper) when init is None")
    if len(lower) != num_dims or len(upper) != num_dims:
        raise ValueError(f"grid_bounds needs (lower, upper) with {num_dims} entries each")
    make_grid(lower, upper, sizes, interpolation)  # validates
    return {"grid_size": sizes, "grid_lower": lower, "grid_upper": upper,
            "interpolation": interpolation}


class StatisticsMemo:
    """The last statistics computed from a pair of tensors, handed back while the same tensors
    come again: same objects, storage, shape, dtype and in-place version counter, and the same
    ``settings`` (grid, probes, seed, device). The statistics do not depend on the
    hyperparameters, so GGP's conditioning after training (and ``posterior``) reuses the pass
    its training made — at 10⁸ rows a pass of ~10 minutes. Anything else (arrays, streams,
    other tensors) misses. Holds weak references to the data and is empty when copied or
    pickled.
    """

    def __init__(self):
        self._entry: tuple[Any, tuple[Any, ...], SufficientStatistics] | None = None

    @staticmethod
    def _key(data, settings) -> Any:
        if not (isinstance(data, tuple) and len(data) == 2
                and all(isinstance(t, Tensor) for t in data)):
            return None
        return (tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype, t.device)
                      for t in data), settings)

    def get(self, data, settings) -> SufficientStatistics | None:
        """The memoised statistics of ``data`` under ``settings``, or ``None``."""
        key = self._key(data, settings)
        if key is None or self._entry is None:
            return None
        old, refs, stats = self._entry
        if old == key and all(ref() is t for ref, t in zip(refs, data, strict=True)):
            return stats
        return None

    def put(self, data, settings, stats: SufficientStatistics) -> None:
        """Remember ``stats`` as the statistics of ``data`` (tensors only)."""
        key = self._key(data, settings)
        if key is not None:
            self._entry = (key, tuple(weakref.ref(t) for t in data), stats)

    def __deepcopy__(self, memo) -> StatisticsMemo:
        return StatisticsMemo()

    def __getstate__(self) -> dict[str, Any]:
        return {"_entry": None}
