r"""The stencil WᵀW of a grid interpolation (notes/002 §4, Claim 2).

- :class:`GramStencil`: WᵀW = Σ_i w_i w_iᵀ as a d-dimensional stencil. WᵀW is nonzero only at
  offsets o ∈ {−(s−1)..s−1}^d (Claim 2: 7^d for cubic, 3^d for linear), so it is stored as one
  m-vector of coefficients per offset, ``coef[o, i] = (WᵀW)[i, i + off(o)]``, and applied as a sum
  of shifted products, O(m (2s−1)^d), grouped by the last dimension so that each group is one
  contiguous window (``unfold``). :meth:`GramStencil.to_csr` gives the same matrix in torch CSR.
  Accumulation uses the stencil (index-free, one scatter-add); for the products, torch CSR
  is faster on the CPU (its sparse kernels beat the shifted,
  grouped products), so ``ggp`` defaults to CSR.
- :func:`pair_offsets`: the stencil id of each pair of a row's local nodes;
  :func:`cell_blocks`: the batched Σ w_i w_iᵀ of points sharing a grid cell, which accumulation
  scatters into the stencil.

The rows W come from :func:`gpscale.linalg.interpolation.interpolate`; the coefficients are float64.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from gpscale.linalg.interpolation import Interpolation

__all__ = ["MAX_GROUP", "GramStencil", "cell_blocks", "pair_offsets"]

_F64 = torch.float64


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
        return self.matmul(torch.eye(self.num_grid, dtype=self.coef.dtype,
                                     device=self.coef.device))

    def to_csr(self) -> Tensor:
        """WᵀW as a torch sparse CSR tensor (the stored nonzeros only)."""
        m, q = self.num_grid, 2 * self.support - 1
        rows, cols, vals = [], [], []
        base = torch.arange(m, device=self.coef.device)
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
