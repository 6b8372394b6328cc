r"""Regular grids, local interpolation W, the grid kernel K_G and the stencil WᵀW (notes/002 §3–§4).

Structured kernel interpolation (Wilson & Nickisch 2015) approximates K_X ≈ W K_G Wᵀ; Yadav,
Sheldon & Musco (2021, "Faster Kernel Interpolation for Gaussian Processes", notes/002) run its
solvers on the sufficient statistics WᵀW, Wᵀy instead. This module holds the structures both need:

- :class:`Grid`: per dimension j, ``sizes[j]`` equally spaced nodes ``start_j + k h_j``, row-major
  linear index (first dimension slowest, notes §3.1). :func:`make_grid` pads the data box
  [lower, upper] with ``r`` nodes on each side (cubic r = 2, linear r = 1), so every point in
  [lower − h, upper + h) has all its neighbours: rows are never truncated (the reference code drops
  out-of-range neighbours, rows then sum to ≈ 1.018, notes §3.2). Points outside raise ValueError.
- :func:`interpolate` → :class:`Interpolation`: W as (n, s^d) node indices and weights, s = 4 (Keys
  cubic convolution, a = −0.5) or 2 (linear); the d-dimensional row is the Kronecker product of
  the 1-D rows. ``W v`` is a gather, ``Wᵀ u`` a scatter-add: O(n s^d). Never dense.
- :class:`GridKernel`: K_G for a stationary kernel on the grid. For a product kernel (RBF with ARD,
  or any profile in 1-D) K_G = s ⊗_j T_j with symmetric Toeplitz T_j, and each factor acts along
  its mode by an FFT of its circulant embedding (size 2 m_j): O(m Σ_j log m_j). GPyTorch's Matérn
  with d > 1 is stationary but not a product, so K_G is multilevel (block) Toeplitz and acts by a
  d-dimensional FFT of the embedding (size 2^d m): O(2^d m log m). The output scale s multiplies
  once (the reference code applies it per factor, s^d: notes §3.3, §11.16).
- The solvers that run on (K_G, WᵀW) alone live in :mod:`gpscale.linalg.factorized`.
- :class:`GramStencil`: WᵀW = Σ_i w_i w_iᵀ as a d-dimensional stencil. WᵀW is nonzero only at
  offsets o ∈ {−(s−1)..s−1}^d (Claim 2: 7^d for cubic, 3^d for linear), so it is stored as one
  m-vector of coefficients per offset, ``coef[o, i] = (WᵀW)[i, i + off(o)]``, and applied as a sum
  of shifted products, O(m (2s−1)^d), grouped by the last dimension so that each group is one
  contiguous window (``unfold``). :meth:`GramStencil.to_csr` gives the same matrix in torch CSR.
  Accumulation uses the stencil (index-free, one scatter-add); for the products, torch CSR
  measured 2–4× faster on this project's CPU (d = 3, m = 32³: 29 ms vs 51 ms per column, 0.18 s
  vs 0.70 s for 17 columns; d = 1, m = 4096: 37 µs vs 110 µs), so ``ggp`` defaults to CSR.

Everything computed from data (weights, statistics) is float64; the kernel factors follow the
hyperparameters' dtype upcast to float64 (the m-dimensional solves are float64, notes §9.2).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "INTERPOLATIONS", "MAX_GROUP", "PROFILES", "Grid", "GridKernel", "GramStencil",
    "Interpolation", "cell_blocks", "grid_kernel", "interpolate", "keys_cubic", "make_grid",
    "pair_offsets",
]

INTERPOLATIONS = {"cubic": 4, "linear": 2}
"""Interpolation scheme -> support s (nodes per dimension per point)."""
PROFILES = ("rbf", "matern12", "matern32", "matern52")

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
        """W v for v (m,) or (m, k): a gather, O(n s^d k)."""
        if v.dim() == 1:
            return (v[self.index] * self.weight).sum(-1)
        return torch.einsum("nsk,ns->nk", v[self.index], self.weight.to(v.dtype))

    def rmatmul(self, u: Tensor) -> Tensor:
        """Wᵀ u for u (n,) or (n, k): a scatter-add, O(n s^d k)."""
        w = self.weight.to(u.dtype)
        flat = self.index.reshape(-1)
        if u.dim() == 1:
            out = u.new_zeros(self.num_grid)
            return out.index_add_(0, flat, (w * u[:, None]).reshape(-1))
        out = u.new_zeros(self.num_grid, u.shape[1])
        return out.index_add_(0, flat, (w[:, :, None] * u[:, None, :]).reshape(-1, u.shape[1]))

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
            "Build the grid with bounds covering all training and test inputs "
            "(option grid_bounds=...).")
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


def pair_offsets(support: int, num_dims: int) -> Tensor:
    """(S, S) stencil id of each local node pair (a, b), S = s^d: Σ_k (b_k − a_k + s − 1) q^(d−1−k).

    q = 2s − 1. The id names the offset of node b from node a; rows of :func:`interpolate`
    order their local nodes row-major, so this table is the same for every point.
    """
    q = 2 * support - 1
    local = torch.cartesian_prod(*[torch.arange(support)] * num_dims).reshape(-1, num_dims)
    diff = local[None, :, :] - local[:, None, :] + support - 1  # (S, S, d), b − a
    powers = torch.tensor([q ** (num_dims - 1 - k) for k in range(num_dims)])
    return (diff * powers).sum(-1)


MAX_GROUP = 64
"""Most points per group in :func:`cell_blocks` (the padded batch's middle dimension)."""


def cell_blocks(rows: Interpolation, *, max_group: int = MAX_GROUP, max_entries: int = 2**22):
    """Yield ``(cells, blocks)``: Σ w_i w_iᵀ (S × S) over groups of points sharing a first node.

    The points are sorted by their first node (index column 0); each run of equal nodes is cut
    into groups of at most T points, T = min(``max_group``, the mean points per occupied node
    rounded up), each group is zero-padded to T rows and the groups' Gram matrices are one
    batched product (G, S, T) @ (G, T, S). Batches hold at most ``max_entries`` S × S entries.
    A node may appear in several groups (and batches); the sums over them are the caller's.
    """
    base, weight = rows.index[:, 0], rows.weight
    n, S = weight.shape
    if n == 0:
        return
    order = torch.argsort(base)
    base, weight = base[order], weight[order]
    new_cell = torch.ones(n, dtype=torch.bool, device=base.device)
    new_cell[1:] = base[1:] != base[:-1]
    cell_start = torch.nonzero(new_cell)[:, 0]
    T = max(1, min(max_group, -(-n // cell_start.numel())))
    rank = torch.arange(n, device=base.device) - cell_start[torch.cumsum(new_cell, 0) - 1]
    new_group = new_cell | (rank % T == 0)
    group_start = torch.nonzero(new_group)[:, 0]
    group_id = torch.cumsum(new_group, 0) - 1
    position = torch.arange(n, device=base.device) - group_start[group_id]
    bounds = torch.cat([group_start, group_start.new_tensor([n])])
    per_batch = max(1, max_entries // (S * S))
    for g0 in range(0, group_start.numel(), per_batch):
        g1 = min(g0 + per_batch, group_start.numel())
        lo, hi = int(bounds[g0]), int(bounds[g1])
        padded = weight.new_zeros(g1 - g0, T, S)
        padded[group_id[lo:hi] - g0, position[lo:hi]] = weight[lo:hi]
        yield base[group_start[g0:g1]], padded.mT @ padded


@dataclass(frozen=True)
class GramStencil:
    """WᵀW (m, m) as a stencil: ``coef[g, i, c] = (WᵀW)[i, i + off(g, c)]``.

    The q^d offsets (q = 2s − 1) are grouped by all but the last dimension (g, q^(d−1) groups)
    and the last-dimension offset c ∈ 0..q−1, so each group's product reads one contiguous window.
    Cost per product O(m q^d k); memory q^d m floats (the CSR values without the column indices).

    Attributes:
        coef: (q^(d−1), m, q) float64.
        sizes: grid sizes (m_1..m_d).
        support: s.
    """

    coef: Tensor
    sizes: tuple[int, ...]
    support: int

    @property
    def num_grid(self) -> int:
        return math.prod(self.sizes)

    def _group_offsets(self) -> list[int]:
        """Linear offset of each group's first window entry (last-dimension offset −(s−1))."""
        q, d = 2 * self.support - 1, len(self.sizes)
        strides = [math.prod(self.sizes[j + 1:]) for j in range(d)]
        combos = torch.cartesian_prod(*[torch.arange(q)] * (d - 1)).reshape(-1, d - 1) \
            if d > 1 else torch.zeros(1, 0, dtype=torch.long)
        return [int(sum((int(c) - self.support + 1) * strides[k] for k, c in enumerate(row)))
                - (self.support - 1) for row in combos]

    def matmul(self, v: Tensor) -> Tensor:
        """WᵀW v for v (m,) or (m, k), in v's dtype."""
        single = v.dim() == 1
        V = v[:, None] if single else v
        m, q = self.num_grid, 2 * self.support - 1
        offsets = self._group_offsets()
        pad = max(abs(o) for o in offsets) + q
        Vp = torch.nn.functional.pad(V.T, (pad, pad)).T  # (m + 2 pad, k)
        windows = Vp.unfold(0, q, 1)  # (m + 2 pad − q + 1, k, q)
        coef = self.coef.to(V.dtype)
        out = torch.zeros_like(V)
        for g, off in enumerate(offsets):
            out += torch.einsum("mkc,mc->mk", windows[pad + off: pad + off + m], coef[g])
        return out[:, 0] if single else out

    def to_dense(self) -> Tensor:
        """Dense WᵀW (m, m); for tests only."""
        return self.matmul(torch.eye(self.num_grid, dtype=self.coef.dtype))

    def to_csr(self) -> Tensor:
        """WᵀW as a torch sparse CSR tensor (the stored nonzeros only)."""
        m, q = self.num_grid, 2 * self.support - 1
        rows, cols, vals = [], [], []
        base = torch.arange(m)
        for g, off in enumerate(self._group_offsets()):
            for c in range(q):
                keep = self.coef[g, :, c] != 0
                rows.append(base[keep])
                cols.append(base[keep] + off + c)
                vals.append(self.coef[g, keep, c])
        coo = torch.sparse_coo_tensor(torch.stack([torch.cat(rows), torch.cat(cols)]),
                                      torch.cat(vals), (m, m), check_invariants=False).coalesce()
        with warnings.catch_warnings():  # "sparse CSR support is in beta": expected, not news
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support")
            return coo.to_sparse_csr()

    def add_(self, rows: Interpolation, pairs: Tensor, block: int = 0) -> GramStencil:
        """Accumulate Σ_i w_i w_iᵀ of ``rows`` in place (float64).

        ``pairs`` is :func:`pair_offsets`. Points are grouped by their first node (the cell
        they lie in: all its points share the S = s^d target entries, shifted by the cell), the
        S × S sums of each group are batched matrix products (:func:`cell_blocks`), and one
        scatter-add per group puts them into the stencil: O(n S²) flops but only S² scattered
        values per group of up to 64 points instead of S² per point. ``block`` caps the groups
        per batch (default: 2²² S × S entries per batch).
        """
        for cells, blocks in cell_blocks(rows, max_entries=block * pairs.numel() or 2**22):
            self.add_blocks_(cells, blocks, pairs)
        return self

    def add_blocks_(self, cells: Tensor, blocks: Tensor, pairs: Tensor) -> GramStencil:
        """Add (S, S) blocks B_c = Σ_{i in c} w_i w_iᵀ of points whose first node is ``cells``.

        ``cells`` (u,) may repeat; ``blocks`` (u, S, S) float64.
        """
        q = 2 * self.support - 1
        target = (cells * q)[:, None] + self._block_targets(pairs).reshape(1, -1)
        self.coef.view(-1).index_add_(0, target.reshape(-1), blocks.reshape(-1))
        return self

    def _block_targets(self, pairs: Tensor) -> Tensor:
        """(S, S) flat coef position of local pair (a, b) for a point whose first node is 0.

        The pair's stencil id p = g q + c (c the last-dimension offset) is stored at
        coef[g, i, c], flat position (g m + i) q + c with i = local[a] the pair's row node;
        a point with first node k adds k q to every position.
        """
        m, q = self.num_grid, 2 * self.support - 1
        d, s = len(self.sizes), self.support
        strides = [math.prod(self.sizes[j + 1:]) for j in range(d)]
        local = torch.cartesian_prod(*[torch.arange(s)] * d).reshape(-1, d) \
            @ torch.tensor(strides)  # (S,) linear offset of each local node from the first
        g, c = pairs // q, pairs % q
        return (g * m + local[:, None].to(pairs.device)) * q + c

    @classmethod
    def zeros(cls, sizes: Sequence[int], support: int, device=None) -> GramStencil:
        q, d = 2 * support - 1, len(sizes)
        coef = torch.zeros(q ** (d - 1), math.prod(sizes), q, dtype=_F64, device=device)
        return cls(coef, tuple(int(m) for m in sizes), support)


def _profile(name: str, r2: Tensor) -> Tensor:
    """Stationary profile φ at squared scaled distance r² (GPyTorch's conventions)."""
    if name == "rbf":
        return torch.exp(-0.5 * r2)
    pos = r2 > 0
    r = torch.where(pos, torch.sqrt(torch.where(pos, r2, torch.ones_like(r2))), 0.0)
    if name == "matern12":
        return torch.exp(-r)
    if name == "matern32":
        r = math.sqrt(3.0) * r
        return (1 + r) * torch.exp(-r)
    if name == "matern52":
        r = math.sqrt(5.0) * r
        return (1 + r + r * r / 3) * torch.exp(-r)
    raise ValueError(f"unknown kernel profile {name!r}; valid: {', '.join(PROFILES)}")


@dataclass(frozen=True)
class GridKernel:
    """K_G on a grid: ``outputscale · ⊗_j T_j`` (``kron``) or multilevel Toeplitz (``bttb``).

    Attributes:
        sizes: (m_1..m_d).
        structure: ``'kron'`` or ``'bttb'``.
        spectra: circulant-embedding spectra: per dimension (m_j + 1,) for kron; one tensor
            (2m_1, …, 2m_{d−1}, m_d + 1) for bttb (the rfftn half spectrum); float64 or complex.
        outputscale: scalar s (float64), applied once.
        local: (q^d,) kernel values at local offsets {−(s−1)..s−1}^d (for w_*ᵀ K_G w_*).
    """

    sizes: tuple[int, ...]
    structure: str
    spectra: tuple[Tensor, ...]
    outputscale: Tensor
    local: Tensor

    @property
    def num_grid(self) -> int:
        return math.prod(self.sizes)

    def matmul(self, v: Tensor) -> Tensor:
        """K_G v for v (m,) or (m, k) by FFTs: O(m log m) per column; differentiable."""
        single = v.dim() == 1
        V = (v[:, None] if single else v).to(_F64)
        k = V.shape[1]
        X = V.T.reshape(k, *self.sizes)
        if self.structure == "kron":
            for j, m_j in enumerate(self.sizes):
                X = X.movedim(j + 1, -1)
                F = torch.fft.rfft(X, n=2 * m_j)
                X = torch.fft.irfft(F * self.spectra[j], n=2 * m_j)[..., :m_j]
                X = X.movedim(-1, j + 1)
        else:
            dims = tuple(range(1, len(self.sizes) + 1))
            shape = [2 * m for m in self.sizes]
            F = torch.fft.rfftn(X, s=shape, dim=dims)
            X = torch.fft.irfftn(F * self.spectra[0], s=shape, dim=dims)
            X = X[(slice(None),) + tuple(slice(0, m) for m in self.sizes)]
        out = self.outputscale * X.reshape(k, -1).T
        return out[:, 0] if single else out

    def to_dense(self) -> Tensor:
        """Dense K_G (m, m) by products with the identity; for tests and small m."""
        return self.matmul(torch.eye(self.num_grid, dtype=_F64))

    def interp_quad(self, rows: Interpolation, pairs: Tensor) -> Tensor:
        """w_iᵀ K_G w_i per row (n,): all s^d nodes of a row are within the local offsets."""
        K_loc = self.local[pairs]  # (S, S)
        return torch.einsum("ns,st,nt->n", rows.weight, K_loc, rows.weight)


def _embedding_column(t: Tensor) -> Tensor:
    """Circulant embedding [t_0..t_{M−1}, 0, t_{M−1}..t_1] (2M,) of a symmetric Toeplitz column."""
    return torch.cat([t, t.new_zeros(1), t[1:].flip(0)])


def grid_kernel(grid: Grid, profile: str, lengthscale: Tensor, outputscale: Tensor,
                structure: str | None = None) -> GridKernel:
    """K_G of ``outputscale · φ(‖(x − x')/ℓ‖²)`` on ``grid``; differentiable in ℓ and s.

    Args:
        grid: the grid.
        profile: one of :data:`PROFILES` (GPyTorch's RBF and Matérn ν = ½, 3/2, 5/2).
        lengthscale: (d,) or scalar ℓ.
        outputscale: scalar s.
        structure: ``'kron'`` (exact for RBF, or any profile when d = 1) or ``'bttb'`` (exact for
            any stationary profile); default: kron where it is exact, else bttb.

    Raises:
        ValueError: an unknown profile or structure, or ``'kron'`` for a non-product kernel.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown kernel profile {profile!r}; valid: {', '.join(PROFILES)}")
    d = grid.num_dims
    separable = profile == "rbf" or d == 1
    structure = structure or ("kron" if separable else "bttb")
    if structure not in ("kron", "bttb"):
        raise ValueError(f"unknown K_G structure {structure!r}; valid: kron, bttb")
    if structure == "kron" and not separable:
        raise ValueError(f"the {profile} kernel is not a product over dimensions for d = {d}; "
                         "use structure='bttb'")
    ell = lengthscale.to(_F64).reshape(-1).expand(d)
    scale = outputscale.to(_F64).reshape(())
    q = 2 * grid.support - 1
    delta = torch.arange(q, dtype=_F64) - (grid.support - 1)
    local_axes = [(delta * grid.spacing[j] / ell[j]) ** 2 for j in range(d)]
    local_r2 = sum(torch.meshgrid(*local_axes, indexing="ij")) if d > 1 else local_axes[0]
    local = scale * _profile(profile, local_r2).reshape(-1)
    if structure == "kron":
        spectra = []
        for j, m_j in enumerate(grid.sizes):
            lag = torch.arange(m_j, dtype=_F64) * grid.spacing[j] / ell[j]
            t = _profile("rbf", lag**2) if d > 1 else _profile(profile, lag**2)
            spectra.append(torch.fft.rfft(_embedding_column(t)).real)
        return GridKernel(grid.sizes, "kron", tuple(spectra), scale, local)
    axes = []
    for j, m_j in enumerate(grid.sizes):
        p = torch.arange(2 * m_j)
        lag = torch.where(p <= m_j, p, p - 2 * m_j).to(_F64) * grid.spacing[j] / ell[j]
        axes.append(lag**2)
    r2 = sum(torch.meshgrid(*axes, indexing="ij"))
    column = _profile(profile, r2)
    # The wrap-around entries (index m_j in some dimension) never meet an un-padded input.
    spectrum = torch.fft.rfftn(column).real
    return GridKernel(grid.sizes, "bttb", (spectrum,), scale, local)
