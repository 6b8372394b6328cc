r"""Block-sparse actions S (n, i) and the kernel product K S that exploits them (CaGP-Opt).

Wenger et al. (2024), "Computation-Aware Gaussian Processes: Model Selection and Linear-Time
Inference", NeurIPS 2024, arXiv:2411.01036, Sec. 4.2, Eq. (14): S = blockdiag(s'_1, …, s'_i) up
to a row permutation, one dense block of about k = n/i entries per column, nnz(S) = n.

Layout (:class:`BlockLayout`). Rows are visited in *block order*: ``index`` (n,) lists the data
points block after block, so block j covers ``index[offset_j : offset_j + size_j]``. With
k = ⌊n/i⌋ and ρ = n mod i, blocks 0 … ρ−1 have k + 1 points and blocks ρ … i−1 have k, so every
training point is in exactly one block and none is dropped. ``values`` (n,) holds the non-zero
entries in block order: S[index[p], block(p)] = values[p].

Costs (:class:`BlockSparseActions`): S V and Sᵀ M are O(n k) gathers and segment sums, SᵀS is the
diagonal of squared block norms, O(n).

:func:`symmetric_kernel_product` computes Φ S for Φ = φ(‖z_p − z_q‖²), the kernel profile on
scaled inputs, without forming Φ. Row spans of whole blocks (≤ ``chunk_size`` rows) tile Φ; only
tiles on and above the diagonal are evaluated, and an off-diagonal tile Φ_RC feeds both
Z[R, blocks(C)] = Φ_RC S_C and Z[C, blocks(R)] = Φ_RCᵀ S_R, which halves the kernel evaluations.
Each tile is reduced against its blocks by reshaping (c, w) → (c, #blocks, k): O(c w) work, no GEMM
with zeros. The backward pass recomputes each tile and forms, per tile,
Ḡ_pq = Z̄[p, b(q)] s_q + Z̄[q, b(p)] s_p (the adjoint of the symmetric entry), then the fused profile
derivative H = Ḡ ⊙ φ'(D²) of :mod:`gpscale.linalg.fused` gives z̄ (GEMMs with d columns), and
s̄_q = Σ_p Φ_pq Z̄[p, b(q)] another segment reduction. The per-tile elementwise work (profile,
reductions, adjoint) is one function, ``torch.compile``d on request. Memory: O(n i) for Z and Z̄
plus a few tile-sized temporaries of ``chunk_size²`` entries; no n × n tensor, forward or backward.
Cost: ≈ n²/2 kernel evaluations and (2d + 4) n²/2 flops forward, about three times that backward.

:func:`~gpscale.linalg.operators.block_sparse_rect.rectangular_kernel_product` is the
rectangular twin for t other rows.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from linear_operator.operators import LinearOperator
from torch.autograd.function import once_differentiable

from gpscale.linalg import fused
from gpscale.linalg.ops import permute_rows
from gpscale.typing import Float, Int, Tensor

__all__ = [
    "DEFAULT_SPAN_ROWS",
    "BlockLayout",
    "BlockSparseActions",
    "Span",
    "symmetric_kernel_product",
]

DEFAULT_SPAN_ROWS = math.isqrt(fused.TILE_ENTRIES)
"""Rows per span of :func:`symmetric_kernel_product`: tiles of at most TILE_ENTRIES entries."""


@dataclass(frozen=True)
class Span:
    """Consecutive whole blocks of one size: rows ``start:stop``, blocks ``first:first + count``."""

    start: int
    stop: int
    first: int
    count: int
    size: int

    @property
    def rows(self) -> slice:
        return slice(self.start, self.stop)

    @property
    def blocks(self) -> slice:
        return slice(self.first, self.first + self.count)


@dataclass(frozen=True)
class BlockLayout:
    """n points in i contiguous blocks (in block order): ρ = n mod i blocks of k+1, then k."""

    num_points: int
    num_blocks: int

    def __post_init__(self):
        if not 1 <= self.num_blocks <= self.num_points:
            raise ValueError(f"need 1 ≤ num_blocks ≤ num_points; got {self.num_blocks} blocks "
                             f"for {self.num_points} points")

    @property
    def size(self) -> int:
        """k = ⌊n / i⌋, the size of the small blocks."""
        return self.num_points // self.num_blocks

    @property
    def num_large(self) -> int:
        """ρ = n mod i, the number of blocks with k + 1 points (they come first)."""
        return self.num_points % self.num_blocks

    @property
    def split(self) -> int:
        """Position where the k-point blocks start."""
        return self.num_large * (self.size + 1)

    def sizes(self) -> list[int]:
        """Block sizes (i,)."""
        return [self.size + 1] * self.num_large + [self.size] * (self.num_blocks - self.num_large)

    def block_ids(self, device: torch.device | None = None) -> Tensor:
        """(n,) the block of each position in block order."""
        sizes = torch.tensor(self.sizes(), device=device)
        return torch.repeat_interleave(torch.arange(self.num_blocks, device=device), sizes)

    def segment_sum_rows(self, t: Float[Tensor, "n k"]) -> Float[Tensor, "i k"]:
        """Sums of the rows of ``t`` over each block (block order): contiguous reductions."""
        return torch.cat([view.sum(1) for view in self.blocks_of_rows(t)])

    def blocks_of_rows(self, t: Float[Tensor, "n k"]) -> list[Tensor]:
        """``t``'s rows (block order) as (blocks, block size, k) views, one per block size."""
        return [t[: self.split].unflatten(0, (self.num_large, self.size + 1)),
                t[self.split:].unflatten(0, (self.num_blocks - self.num_large, self.size))]

    def spread_rows(self, t: Float[Tensor, "i k"]) -> Float[Tensor, "n k"]:
        """Row j of ``t`` repeated over block j's positions (block order): the adjoint of
        :meth:`segment_sum_rows`, by broadcast copies rather than a gather."""
        L, k = self.num_large, t.shape[1]
        out = t.new_empty(self.num_points, k)
        for view, part in zip(self.blocks_of_rows(out), (t[:L], t[L:]), strict=True):
            view.copy_(part[:, None, :].expand_as(view))
        return out

    def segment_sum(self, t: Float[Tensor, "*b n"]) -> Float[Tensor, "*b i"]:
        """Sums of ``t`` over each block along the last axis (block order)."""
        big, small = t[..., : self.split], t[..., self.split:]
        parts = [big.unflatten(-1, (self.num_large, self.size + 1)).sum(-1),
                 small.unflatten(-1, (self.num_blocks - self.num_large, self.size)).sum(-1)]
        return torch.cat(parts, -1)

    def spans(self, max_rows: int) -> list[Span]:
        """Spans of whole, equally sized blocks with at most ``max_rows`` rows (≥ one block).

        Within each block size the spans are balanced (their block counts differ by at most
        one), so that few distinct tile shapes occur (fewer ``torch.compile`` specialisations).
        """
        spans = []
        regions = ((0, 0, self.num_large, self.size + 1),
                   (self.split, self.num_large, self.num_blocks - self.num_large, self.size))
        for start, first, count, size in regions:
            if count == 0:
                continue
            num_spans = -(-count // max(1, max_rows // size))  # ceil
            base, extra = divmod(count, num_spans)
            j = 0
            for t in range(num_spans):
                c = base + (t < extra)
                spans.append(Span(start + j * size, start + (j + c) * size, first + j, c, size))
                j += c
        return spans


class BlockSparseActions(LinearOperator):
    """S (n, i) with one dense block per column (or Sᵀ with ``transposed=True``).

    S V costs O(n k') for V (i, k'), Sᵀ M costs O(n k') for M (n, k'); SᵀS is diagonal.

    Args:
        values: (n,) non-zero entries in block order (differentiable).
        index: (n,) the data points in block order (a permutation of 0 … n−1).
        num_blocks: i, the number of actions.
        transposed: represent Sᵀ (i, n) instead.

    Example:
        >>> S = BlockSparseActions(torch.ones(5), torch.arange(5), num_blocks=2)
        >>> S.to_dense()
        tensor([[1., 0.],
                [1., 0.],
                [1., 0.],
                [0., 1.],
                [0., 1.]])
    """

    def __init__(self, values: Float[Tensor, " n"], index: Int[Tensor, " n"], *,
                 num_blocks: int, transposed: bool = False):
        if values.shape != index.shape or values.dim() != 1:
            raise ValueError(f"values and index must both be (n,); got {tuple(values.shape)} "
                             f"and {tuple(index.shape)}")
        super().__init__(values, index, num_blocks=num_blocks, transposed=transposed)
        self.values, self.index, self.transposed = values, index, transposed
        self.layout = BlockLayout(values.shape[0], num_blocks)

    def _size(self) -> torch.Size:
        n, i = self.layout.num_points, self.layout.num_blocks
        return torch.Size((i, n) if self.transposed else (n, i))

    def _transpose_nonbatch(self) -> BlockSparseActions:
        return BlockSparseActions(self.values, self.index, num_blocks=self.layout.num_blocks,
                                  transposed=not self.transposed)

    def matmul(self, other):
        """S V or Sᵀ M through plain autograd on :meth:`_matmul` (O(n k') forward and backward);
        ``LinearOperator.matmul``'s generic backward re-runs the product to differentiate in
        the values, a noticeable share of a CaGP-Opt epoch."""
        if not isinstance(other, Tensor) or other.dim() > 2:
            return super().matmul(other)
        if other.shape[0] != self.shape[-1]:
            raise ValueError(f"cannot multiply {tuple(self.shape)} by {tuple(other.shape)}")
        return self._matmul(other)

    def _matmul(self, rhs: Tensor) -> Tensor:
        vector = rhs.dim() == 1
        rhs = rhs.unsqueeze(-1) if vector else rhs
        if self.transposed:  # Sᵀ M: (i, k') = segment sums of s_p M[index[p]]
            out = _TransposedProduct.apply(self.values, rhs, self.index, self.layout)
        else:  # S V: row index[p] gets s_p V[block(p)]
            rows = self.values[:, None] * rhs[self.layout.block_ids(rhs.device)]  # (n, k')
            out = rows.new_zeros(rows.shape).index_copy(0, self.index, rows)
        return out.squeeze(-1) if vector else out

    def squared_norms(self) -> Float[Tensor, " i"]:
        """‖s'_j‖² per block: the diagonal of SᵀS (blocks are disjoint)."""
        return self.layout.segment_sum(self.values.square())

    def inverse_index(self) -> Int[Tensor, " n"]:
        """(n,) the block-order position of each data point (``index``'s inverse)."""
        return torch.argsort(self.index)

    def to_data_order(self, t: Float[Tensor, "n k"]) -> Float[Tensor, "n k"]:
        """Rows of ``t`` from block order to data order (:func:`~gpscale.linalg.ops.permute_rows`:
        a gather in the backward pass too)."""
        return permute_rows(t, self.inverse_index(), self.index)


class _TransposedProduct(torch.autograd.Function):
    """Sᵀ M for block-sparse S and M (n, k'): one gather of M's rows into block order and
    contiguous segment sums forward; backward, the adjoint gather of M̄ = S Ḡ and the values'
    s̄_p = ⟨Ḡ[block(p)], M[index[p]]⟩, without the n × k' zero fills and strided copies that
    autograd's slices and transposes of the same product take (a CaGP-Opt epoch's Sᵀ K S)."""

    @staticmethod
    def forward(ctx, values: Tensor, M: Tensor, index: Tensor, layout: BlockLayout) -> Tensor:
        rows = M.index_select(0, index)
        ctx.save_for_backward(values, rows, index)  # M's rows in block order
        ctx.layout, ctx.dtype = layout, M.dtype
        return layout.segment_sum_rows(rows * values[:, None])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        values, rows, index = ctx.saved_tensors
        layout, L = ctx.layout, ctx.layout.num_large
        grad_values = grad_M = None
        if ctx.needs_input_grad[0]:  # per block, the rows times Ḡ[j]: a batched product
            views, parts = layout.blocks_of_rows(rows), (grad[:L], grad[L:])
            grad_values = torch.cat([(view @ part[:, :, None].to(view.dtype)).reshape(-1)
                                     for view, part in zip(views, parts, strict=True)])
            grad_values = grad_values.to(values.dtype)
        if ctx.needs_input_grad[1]:
            spread = layout.spread_rows(grad)  # (n, k') block order
            spread.mul_(values[:, None])
            grad_M = spread.index_select(0, torch.argsort(index)).to(ctx.dtype)
        return grad_values, grad_M, None, None


def symmetric_kernel_product(profile: str, z: Float[Tensor, "n d"], values: Float[Tensor, " n"],
                             layout: BlockLayout, *, compiled: bool = False,
                             chunk_size: int = DEFAULT_SPAN_ROWS,
                             exact: int = 0) -> Float[Tensor, "n i"]:
    """Φ S with Φ_pq = φ(‖z_p − z_q‖²), everything in block order (see the module docstring).

    Args:
        profile: a key of :data:`gpscale.linalg.fused.PROFILES`.
        z: (n, d) scaled inputs in block order; differentiable.
        values: (n,) action entries in block order; differentiable.
        layout: the block layout of ``values``.
        compiled: run the per-tile functions (profile, block reductions, adjoint) through
            ``torch.compile``, one fused pass per tile.
        chunk_size: rows per span; tiles hold at most ``chunk_size²`` entries (a span is never
            smaller than one block).
        exact: the last ``exact`` dimensions of z enter D² exactly
            (:func:`gpscale.linalg.fused.inner_products`).

    Returns:
        (n, i) with rows in block order.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer; got {chunk_size}")
    value, value_vjp = fused.PROFILES[profile]
    steps = (_forward_tile, _adjoint_tile, _action_adjoint_tile)
    if compiled:
        steps = tuple(fused._compiled(step) for step in steps)
    steps = (functools.partial(steps[0], value), functools.partial(steps[1], value_vjp),
             functools.partial(steps[2], value))
    return _SymmetricProduct.apply(z, values, layout, steps, int(chunk_size), int(exact))


def _forward_tile(value, P: Tensor, sq1: Tensor, sq2: Tensor, s_C: Tensor,
                  s_R: Tensor) -> tuple[Tensor, Tensor]:
    """From inner products P (1, c, w): Φ_RC S_C (c, #C) and Φ_RCᵀ S_R (w, #R).

    ``s_C`` (#C, k_C) and ``s_R`` (#R, k_R) are the spans' action entries, one row per block.
    """
    Phi = P.clone()  # see _backward_tile
    value(Phi, sq1, sq2)  # Φ_RC
    Phi = Phi[0]
    row = (Phi.unflatten(1, s_C.shape) * s_C).sum(-1)  # Σ_{q ∈ block} Φ_pq s_q
    col = (Phi.unflatten(0, s_R.shape) * s_R[..., None]).sum(1)  # (#R, w)
    return row, col.mT


def _adjoint_tile(value_vjp, P: Tensor, sq1: Tensor, sq2: Tensor, g_RC: Tensor, g_CR: Tensor,
                  s_C: Tensor, s_R: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """H = Ḡ ⊙ φ'(D²) (1, c, w) and its row and column sums, from inner products P (1, c, w).

    Ḡ_pq = Z̄[p, b(q)] s_q + Z̄[q, b(p)] s_p with g_RC = Z̄[R, blocks(C)] (c, #C) and
    g_CR = Z̄[C, blocks(R)] (w, #R) (zeros on a diagonal tile).
    """
    H = ((g_RC[:, :, None] * s_C).flatten(1)
         + (s_R[:, :, None] * g_CR.mT[:, None, :]).flatten(0, 1))[None]  # Ḡ (1, c, w)
    # A copy, not P itself: torch 2.13's Inductor fails (KeyError 'buf0') on an input that is
    # mutated in place and then feeds two reductions; on a copy it fuses the same way.
    H_rows, H_cols = value_vjp(P.clone(), sq1, sq2, H)  # H ← Ḡ ⊙ φ'(D²)
    return H, H_rows, H_cols


def _action_adjoint_tile(value, P: Tensor, sq1: Tensor, sq2: Tensor, g_RC: Tensor,
                         g_CR: Tensor, s_C: Tensor, s_R: Tensor) -> tuple[Tensor, Tensor]:
    """s̄ for the spans C (#C, k_C) and R (#R, k_R): s̄_q = Σ_p Φ_pq Z̄[p, b(q)], and mirrored.

    A function of its own: Inductor fuses it with :func:`_adjoint_tile` into a slower kernel.
    """
    Phi = P.clone()  # see _adjoint_tile
    value(Phi, sq1, sq2)
    Phi = Phi[0]
    grad_s_C = (Phi.unflatten(1, s_C.shape) * g_RC[:, :, None]).sum(0)
    grad_s_R = (Phi.unflatten(0, s_R.shape) * g_CR.mT[:, None, :]).sum(-1)
    return grad_s_C, grad_s_R


def _tiles(layout: BlockLayout, chunk_size: int):
    """Yield (R, C) span pairs on and above the block diagonal."""
    spans = layout.spans(chunk_size)
    for j, R in enumerate(spans):
        for C in spans[j:]:
            yield R, C


class _Tile:
    """Inner products z_R z_Cᵀ between two spans, written into one reused buffer."""

    def __init__(self, z: Tensor, values: Tensor, chunk_size: int, layout: BlockLayout,
                 exact: int):
        rows = max(s.stop - s.start for s in layout.spans(chunk_size))
        self.z, self.values, self.exact = z, values, exact  # (n, d), (n,)
        self.sq = fused.sq_norms(z, exact)  # (n,)
        self.buffer = z.new_empty(rows * rows)

    def inner(self, R: Span, C: Span) -> Tensor:
        P = self.buffer[: (R.stop - R.start) * (C.stop - C.start)]
        P = P.view(1, R.stop - R.start, C.stop - C.start)
        fused.inner_products(self.z[None, R.rows], self.z[None, C.rows], P, self.exact)
        if R.start == C.start:  # D²_pp = ‖z_p‖² + ‖z_p‖² − 2‖z_p‖² = 0 exactly, not rounding
            P[0].diagonal().copy_(self.sq[R.rows])
        return P

    def norms(self, R: Span, C: Span) -> tuple[Tensor, Tensor]:
        return self.sq[None, R.rows, None], self.sq[None, None, C.rows]

    def actions(self, S: Span) -> Tensor:
        return self.values[S.rows].view(S.count, S.size)


class _SymmetricProduct(torch.autograd.Function):
    """Autograd function behind :func:`symmetric_kernel_product` (saves z and values only)."""

    @staticmethod
    def forward(ctx, z: Tensor, values: Tensor, layout: BlockLayout, steps, chunk_size: int,
                exact: int):
        ctx.layout, ctx.steps, ctx.chunk_size, ctx.exact = layout, steps, chunk_size, exact
        ctx.save_for_backward(z, values)
        out = z.new_zeros(layout.num_points, layout.num_blocks)  # (n, i)
        tile = _Tile(z.detach(), values.detach(), chunk_size, layout, exact)
        for R, C in _tiles(layout, chunk_size):
            row, col = steps[0](tile.inner(R, C), *tile.norms(R, C), tile.actions(C),
                                tile.actions(R))
            out[R.rows, C.blocks] += row
            if C.start != R.start:  # the mirrored tile Φ_CR = Φ_RCᵀ
                out[C.rows, R.blocks] += col
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        z, values = ctx.saved_tensors
        layout, (_, adjoint_tile, action_adjoint_tile) = ctx.layout, ctx.steps
        grad_z, grad_s = torch.zeros_like(z), torch.zeros_like(values)
        tile = _Tile(z, values, ctx.chunk_size, layout, ctx.exact)
        for R, C in _tiles(layout, ctx.chunk_size):
            g_RC = grad_out[R.rows, C.blocks]  # (c, #C) = Z̄[p, b(q)]
            g_CR = grad_out[C.rows, R.blocks]  # (w, #R) = Z̄[q, b(p)]
            if C.start == R.start:
                g_CR = torch.zeros_like(g_CR)  # a diagonal tile holds every ordered pair once
            args = (tile.inner(R, C), *tile.norms(R, C), g_RC, g_CR, tile.actions(C),
                    tile.actions(R))
            grad_s_C, grad_s_R = action_adjoint_tile(*args)
            grad_s[C.rows] += grad_s_C.flatten()
            grad_s[R.rows] += grad_s_R.flatten()
            if ctx.needs_input_grad[0]:  # z̄ = 2(diag(H1) z_R − H z_C), and mirrored
                H, H_rows, H_cols = adjoint_tile(*args)
                zR, zC = z[R.rows], z[C.rows]
                grad_z[R.rows] += 2.0 * (H_rows[0, :, None] * zR - H[0] @ zC)
                grad_z[C.rows] += 2.0 * (H_cols[0, :, None] * zC - H[0].mT @ zR)
        return grad_z, grad_s, None, None, None, None
