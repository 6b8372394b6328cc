r"""Structured kernel interpolation of an additive kernel: one grid per group of inputs.

An additive kernel k(x, x') = Σ_g k_g(x_{S_g}, x'_{S_g}) over groups S_g of at most three inputs
is interpolated group by group: W_g (n, m_g) onto the g-th grid, K_g on that grid. Stacked,
W = [W_1 … W_G] (n, M) and K_B = blockdiag(K_1 … K_G) (M = Σ_g m_g) give

.. math::
    K̃ = Σ_g W_g K_g W_gᵀ + σ² I = W K_B Wᵀ + σ² I,

the single-grid model's form, so every solver of the single grid — the factorized CG of
:mod:`gpscale.linalg.factorized`, the whitened solve of :mod:`gpscale.linalg.whitened` — runs
unchanged on (K_B, B = WᵀW). What differs:

- WᵀW has off-diagonal blocks W_gᵀW_h between groups: dense m_g × m_h (the joint histogram of
  two groups' inputs, interpolated), so B is held dense, M × M (:func:`accumulate_gram`);
- the whitened solve's preconditioner is block diagonal, each block the single grid's
  Kronecker preconditioner of that group (:class:`BlockPreconditioner`): the groups' coupling
  is left to CG (block Jacobi). Between groups of independent inputs it is nearly of rank one
  per pair (a constant moved from one part to another), which costs CG a few iterations;
- a test point's rows, prior variances and products are sums over the groups
  (:class:`AdditiveRows`, :class:`BlockGridKernel`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.linalg.interpolation import Grid, Interpolation, interpolate
from gpscale.linalg.toeplitz import GridKernel
from gpscale.linalg.whitened import KroneckerPreconditioner, WhitenedSystem, kron_sqrt_factors

__all__ = ["AdditiveRows", "BlockGridKernel", "BlockPreconditioner", "BlockWhitenedSystem",
           "accumulate_gram", "additive_rows", "block_marginal_grams", "mirror_blocks"]

_F64 = torch.float64


def _split(V: Tensor, sizes: list[int]) -> tuple[Tensor, ...]:
    return torch.split(V, sizes, dim=0)


@dataclass(frozen=True)
class AdditiveRows:
    """W = [W_1 … W_G] (n, M) as the groups' interpolation rows.

    Attributes:
        groups: each group's :class:`Interpolation` (indices local to its grid).
    """

    groups: tuple[Interpolation, ...]

    @property
    def sizes(self) -> list[int]:
        return [rows.num_grid for rows in self.groups]

    @property
    def num_grid(self) -> int:
        return sum(self.sizes)

    def matmul(self, v: Tensor) -> Tensor:
        """W v = Σ_g W_g v_g for v (M,) or (M, k)."""
        parts = _split(v, self.sizes)
        out = self.groups[0].matmul(parts[0])
        for rows, part in zip(self.groups[1:], parts[1:], strict=True):
            out = out + rows.matmul(part)
        return out

    def rmatmul(self, u: Tensor) -> Tensor:
        """Wᵀ u = [W_1ᵀu; …; W_Gᵀu] for u (n,) or (n, k)."""
        return torch.cat([rows.rmatmul(u) for rows in self.groups], 0)

    def global_index(self) -> tuple[Tensor, Tensor]:
        """(n, S) column indices into 0..M−1 and their weights, S = Σ_g s^{d_g}."""
        offsets, start = [], 0
        for rows in self.groups:
            offsets.append(rows.index + start)
            start += rows.num_grid
        return torch.cat(offsets, 1), torch.cat([rows.weight for rows in self.groups], 1)

    def quad(self, matrix: Tensor) -> Tensor:
        """w_iᵀ A w_i per row for a dense A (M, M): S² entries gathered per row."""
        index, weight = self.global_index()
        block = matrix[index[:, :, None], index[:, None, :]]  # (n, S, S)
        w = weight.to(matrix.dtype)
        return torch.einsum("ns,nst,nt->n", w, block, w)

    def columns(self) -> Tensor:
        """Dense Wᵀ (M, n) of a few rows."""
        index, weight = self.global_index()
        cols = torch.zeros(index.shape[0], self.num_grid, dtype=_F64, device=weight.device)
        return cols.scatter_add_(1, index, weight.to(_F64)).T


def additive_rows(grids: list[Grid], columns: list[list[int]], x: Tensor) -> AdditiveRows:
    """The rows of x (n, d) on each group's grid (``columns[g]``: the inputs of group g)."""
    return AdditiveRows(tuple(interpolate(grid, x[:, cols])
                              for grid, cols in zip(grids, columns, strict=True)))


def accumulate_gram(gram: Tensor, rows: AdditiveRows, block_rows: int | None = None) -> None:
    """gram (M, M) += WᵀW of ``rows``: the blocks W_gᵀW_h with g ≤ h only, each summed as a
    small dense histogram (cache-sized, where scattering into all of M × M is not); the blocks
    below the diagonal are filled by :func:`mirror_blocks` once all rows are in. Rows go in
    blocks whose scattered pairs stay below ~16 million values."""
    sizes = rows.sizes
    starts = [sum(sizes[:g]) for g in range(len(sizes))]
    S = sum(r.index.shape[1] for r in rows.groups)
    step = block_rows or max(1, (1 << 24) // (S * S // 2 + 1))
    n = rows.groups[0].index.shape[0]
    for start in range(0, n, step):
        part = [(r.index[start:start + step], r.weight[start:start + step].to(_F64))
                for r in rows.groups]
        for g, (ig, wg) in enumerate(part):
            for h in range(g, len(part)):
                ih, wh = part[h]
                m_g, m_h = sizes[g], sizes[h]
                cells = (ig[:, :, None] * m_h + ih[:, None, :]).reshape(-1)
                values = (wg[:, :, None] * wh[:, None, :]).reshape(-1)
                block = torch.bincount(cells, weights=values, minlength=m_g * m_h)
                gram[starts[g]:starts[g] + m_g, starts[h]:starts[h] + m_h] += \
                    block.view(m_g, m_h)


def mirror_blocks(gram: Tensor, sizes: list[int]) -> None:
    """Fill the blocks of WᵀW below the diagonal from those above (:func:`accumulate_gram`)."""
    starts = [sum(sizes[:g]) for g in range(len(sizes))]
    for g, (a, m_g) in enumerate(zip(starts, sizes, strict=True)):
        for b, m_h in zip(starts[g + 1:], sizes[g + 1:], strict=True):
            gram[b:b + m_h, a:a + m_g] = gram[a:a + m_g, b:b + m_h].T


def block_marginal_grams(gram: Tensor, grids: list[Grid]) -> list[list[Tensor]]:
    """Per group, the 1-D Grams of its inputs from its diagonal block of WᵀW: the block
    summed over every other input of the group (exact: each input's weights sum to one)."""
    out, start = [], 0
    for grid in grids:
        m, d = grid.num_points, grid.num_dims
        block = gram[start:start + m, start:start + m].reshape(*grid.sizes, *grid.sizes)
        grams = []
        for j in range(d):
            rest = [a for a in range(d) if a != j]
            B_j = block.sum(dim=rest + [d + a for a in rest]) if rest else block
            grams.append(0.5 * (B_j + B_j.T))
        out.append(grams)
        start += m
    return out


@dataclass(frozen=True)
class BlockGridKernel:
    """K_B = blockdiag(K_1 … K_G) on the stacked grids; differentiable in each group's
    hyperparameters.

    Attributes:
        kernels: each group's :class:`GridKernel`.
    """

    kernels: tuple[GridKernel, ...]

    @property
    def sizes(self) -> list[int]:
        return [k.num_grid for k in self.kernels]

    @property
    def num_grid(self) -> int:
        return sum(self.sizes)

    @property
    def kronecker(self) -> bool:
        """Every block is a Kronecker product (the whitened solve applies)."""
        return all(k.structure == "kron" for k in self.kernels)

    def matmul(self, v: Tensor) -> Tensor:
        single = v.dim() == 1
        V = v[:, None] if single else v
        out = torch.cat([k.matmul(part) for k, part in
                         zip(self.kernels, _split(V, self.sizes), strict=True)], 0)
        return out[:, 0] if single else out

    def to_dense(self) -> Tensor:
        return torch.block_diag(*[k.to_dense() for k in self.kernels])

    def interp_quad(self, rows: AdditiveRows, pairs: list[Tensor]) -> Tensor:
        """w_*ᵀ K_B w_* = Σ_g w_{g,*}ᵀ K_g w_{g,*} per row."""
        return sum(k.interp_quad(r, p) for k, r, p in
                   zip(self.kernels, rows.groups, pairs, strict=True))


@dataclass(frozen=True)
class BlockPreconditioner:
    """P = blockdiag(P_1 … P_G), each block a group's :class:`KroneckerPreconditioner`
    (the :class:`~gpscale.linalg.preconditioners.Preconditioner` protocol)."""

    blocks: tuple[KroneckerPreconditioner, ...]
    sizes: tuple[int, ...]

    def _each(self, R: Tensor, name: str) -> Tensor:
        return torch.cat([getattr(b, name)(r) for b, r in
                          zip(self.blocks, _split(R, list(self.sizes)), strict=True)], 0)

    def solve(self, R: Tensor) -> Tensor:
        return self._each(R, "solve")

    def inv_sqrt_matmul(self, V: Tensor) -> Tensor:
        return self._each(V, "inv_sqrt_matmul")

    def logdet(self) -> Tensor:
        return sum(b.logdet() for b in self.blocks)

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        return torch.cat([b.sample(num_samples, generator) for b in self.blocks], 0)


@dataclass(frozen=True)
class BlockWhitenedSystem(WhitenedSystem):
    """Â = σ²I + L B L with L = blockdiag(L_g), L_g² = K_g, B the full WᵀW, and the block
    diagonal preconditioner (module docstring); the solves of :class:`WhitenedSystem`."""

    groups: tuple[WhitenedSystem, ...] = ()
    sizes: tuple[int, ...] = ()

    @classmethod
    def build_blocks(cls, GK: BlockGridKernel, B, grams: list[list[Tensor]], noise: float,
                     n: int) -> BlockWhitenedSystem:
        """From Kronecker blocks, ``V ↦ WᵀW V``, :func:`block_marginal_grams`, σ² and n."""
        groups = []
        for kernel, group_grams in zip(GK.kernels, grams, strict=True):
            factors = kron_sqrt_factors(kernel)
            scale = float(kernel.outputscale)
            P = KroneckerPreconditioner.build(factors, scale, group_grams, noise, n)
            groups.append(WhitenedSystem(factors, scale ** 0.5, B, noise, P))
        sizes = tuple(GK.sizes)
        P = BlockPreconditioner(tuple(g.preconditioner for g in groups), sizes)
        return cls([], 1.0, B, noise, P, tuple(groups), sizes)

    def L(self, V: Tensor) -> Tensor:
        return torch.cat([g.L(part) for g, part in
                          zip(self.groups, _split(V, list(self.sizes)), strict=True)], 0)
