r"""Φ(z_rows, z) S for block-sparse actions S and t other rows (a rank's shard, test points).

The rectangular twin of :func:`gpscale.linalg.operators.block_sparse.symmetric_kernel_product`:
the same layout, fused profile functions and per-tile adjoints on (row chunk × block span) tiles,
without the mirrored half. t · n kernel evaluations, memory O(t i) plus tile temporaries.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

from gpscale.linalg import fused
from gpscale.linalg.operators.block_sparse import DEFAULT_SPAN_ROWS, BlockLayout, Span
from gpscale.typing import Float, Int, Tensor

__all__ = ["rectangular_kernel_product"]


def rectangular_kernel_product(profile: str, z_rows: Float[Tensor, "t d"],
                               z: Float[Tensor, "n d"], values: Float[Tensor, " n"],
                               layout: BlockLayout, *, rows_in_z: Int[Tensor, " t"] | None = None,
                               compiled: bool = False, chunk_size: int = DEFAULT_SPAN_ROWS,
                               exact: int = 0) -> Float[Tensor, "t i"]:
    """Φ(z_rows, z) S with Φ_pq = φ(‖z_rows,p − z_q‖²), without forming Φ; z, S in block order.

    The rectangular twin of :func:`symmetric_kernel_product` (for a subset of the training rows,
    e.g. one rank's shard, or for test points). Tiles pair a chunk of at most ``chunk_size``
    rows with a span of whole blocks of at most ``chunk_size`` columns; each tile is reduced
    against its blocks by reshaping, O(c w) work, and the backward pass recomputes it (the
    same per-tile adjoint as the symmetric product, without the mirrored half). Memory: the
    (t, i) output and its gradient plus a few tile-sized temporaries. Cost: t · n kernel
    evaluations and ≈ (2d + 4) t n flops forward, about three times that backward.

    Args:
        profile: a key of :data:`gpscale.linalg.fused.PROFILES`.
        z_rows: (t, d) scaled row inputs; differentiable.
        z: (n, d) scaled inputs in block order; differentiable.
        values: (n,) action entries in block order; differentiable.
        layout: the block layout of ``values``.
        rows_in_z: (t,) optional block-order positions with ``z_rows[p] == z[rows_in_z[p]]``
            (rows that are training points): their squared distance to themselves is then
            exactly 0, as on the diagonal of the symmetric product, rather than rounding.
        compiled: run the per-tile functions through ``torch.compile``.
        chunk_size: rows per chunk and columns per span (a span is never less than a block).
        exact: the last ``exact`` dimensions enter D² exactly
            (:func:`gpscale.linalg.fused.inner_products`).

    Returns:
        (t, i), rows in the order of ``z_rows``.

    Raises:
        ValueError: mismatched shapes or a non-positive ``chunk_size``.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer; got {chunk_size}")
    if (z_rows.dim() != 2 or z.dim() != 2 or z_rows.shape[-1] != z.shape[-1]
            or values.shape != (layout.num_points,) or z.shape[0] != layout.num_points):
        raise ValueError(f"rectangular_kernel_product needs z_rows (t, d), z (n, d) and values "
                         f"(n,) with n = {layout.num_points}; got {tuple(z_rows.shape)}, "
                         f"{tuple(z.shape)}, {tuple(values.shape)}")
    if rows_in_z is not None and rows_in_z.shape != z_rows.shape[:1]:
        raise ValueError(f"rows_in_z must be (t,) = ({z_rows.shape[0]},); got "
                         f"{tuple(rows_in_z.shape)}")
    value, value_vjp = fused.PROFILES[profile]
    steps = (_rect_forward_tile, _rect_adjoint_tile, _rect_action_adjoint_tile)
    if compiled:
        steps = tuple(fused._compiled(step) for step in steps)
    steps = (functools.partial(steps[0], value), functools.partial(steps[1], value_vjp),
             functools.partial(steps[2], value))
    return _RectangularProduct.apply(z_rows, z, values, layout, rows_in_z, steps,
                                     int(chunk_size), int(exact))


def _rect_forward_tile(value, P: Tensor, sq1: Tensor, sq2: Tensor, s_C: Tensor) -> Tensor:
    """Φ_RC S_C (c, #C) from inner products P (1, c, w); ``s_C`` (#C, k_C)."""
    Phi = P.clone()  # see _adjoint_tile
    value(Phi, sq1, sq2)
    return (Phi[0].unflatten(1, s_C.shape) * s_C).sum(-1)


def _rect_adjoint_tile(value_vjp, P: Tensor, sq1: Tensor, sq2: Tensor, g_RC: Tensor,
                       s_C: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """H = Ḡ ⊙ φ'(D²) (1, c, w) with Ḡ_pq = Z̄[p, b(q)] s_q, and H's row and column sums."""
    H = (g_RC[:, :, None] * s_C).flatten(1)[None]  # Ḡ (1, c, w)
    H_rows, H_cols = value_vjp(P.clone(), sq1, sq2, H)
    return H, H_rows, H_cols


def _rect_action_adjoint_tile(value, P: Tensor, sq1: Tensor, sq2: Tensor,
                              g_RC: Tensor, s_C: Tensor) -> Tensor:
    """s̄_q = Σ_p Φ_pq Z̄[p, b(q)] for the span C, shaped (#C, k_C)."""
    Phi = P.clone()
    value(Phi, sq1, sq2)
    return (Phi[0].unflatten(1, s_C.shape) * g_RC[:, :, None]).sum(0)


class _RectTiles:
    """Inner products between a row chunk and a column span, written into one reused buffer."""

    def __init__(self, z_rows: Tensor, z: Tensor, values: Tensor, rows_in_z: Tensor | None,
                 layout: BlockLayout, chunk_size: int, exact: int):
        self.spans = layout.spans(chunk_size)
        width = max(s.stop - s.start for s in self.spans)
        t = z_rows.shape[0]
        self.chunks = [slice(a, min(a + chunk_size, t)) for a in range(0, t, chunk_size)]
        self.z_rows, self.z, self.values, self.rows_in_z = z_rows, z, values, rows_in_z
        self.exact = exact
        self.sq_rows, self.sq = fused.sq_norms(z_rows, exact), fused.sq_norms(z, exact)
        self.buffer = z.new_empty(min(chunk_size, t) * width)

    def __iter__(self):
        for R in self.chunks:
            for C in self.spans:
                yield R, C

    def inner(self, R: slice, C: Span) -> Tensor:
        c, w = R.stop - R.start, C.stop - C.start
        P = self.buffer[: c * w].view(1, c, w)
        fused.inner_products(self.z_rows[None, R], self.z[None, C.rows], P, self.exact)
        if self.rows_in_z is not None:  # a row that is the column's own point: D² = 0 exactly
            pos = self.rows_in_z[R]
            hit = ((pos >= C.start) & (pos < C.stop)).nonzero()[:, 0]
            P[0, hit, pos[hit] - C.start] = self.sq_rows[R][hit]
        return P

    def norms(self, R: slice, C: Span) -> tuple[Tensor, Tensor]:
        return self.sq_rows[None, R, None], self.sq[None, None, C.rows]

    def actions(self, C: Span) -> Tensor:
        return self.values[C.rows].view(C.count, C.size)


class _RectangularProduct(torch.autograd.Function):
    """Autograd function behind :func:`rectangular_kernel_product` (saves inputs only)."""

    @staticmethod
    def forward(ctx, z_rows: Tensor, z: Tensor, values: Tensor, layout: BlockLayout,
                rows_in_z: Tensor | None, steps, chunk_size: int, exact: int):
        ctx.layout, ctx.rows_in_z, ctx.steps, ctx.chunk_size = layout, rows_in_z, steps, chunk_size
        ctx.exact = exact
        ctx.save_for_backward(z_rows, z, values)
        out = z.new_zeros(z_rows.shape[0], layout.num_blocks)  # (t, i)
        tiles = _RectTiles(z_rows.detach(), z.detach(), values.detach(), rows_in_z, layout,
                           chunk_size, exact)
        for R, C in tiles:
            out[R, C.blocks] = steps[0](tiles.inner(R, C), *tiles.norms(R, C), tiles.actions(C))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        z_rows, z, values = ctx.saved_tensors
        _, adjoint_tile, action_adjoint_tile = ctx.steps
        needs_z = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_rows, grad_z = torch.zeros_like(z_rows), torch.zeros_like(z)
        grad_s = torch.zeros_like(values)
        tiles = _RectTiles(z_rows, z, values, ctx.rows_in_z, ctx.layout, ctx.chunk_size,
                           ctx.exact)
        for R, C in tiles:
            g_RC = grad_out[R, C.blocks]  # (c, #C) = Z̄[p, b(q)]
            P, norms, s_C = tiles.inner(R, C), tiles.norms(R, C), tiles.actions(C)
            if ctx.needs_input_grad[2]:
                grad_s[C.rows] += action_adjoint_tile(P, *norms, g_RC, s_C).flatten()
            if needs_z:  # z̄_R = 2(diag(H1) z_R − H z_C), z̄_C = 2(diag(Hᵀ1) z_C − Hᵀ z_R)
                H, H_rows, H_cols = adjoint_tile(P, *norms, g_RC, s_C)
                zR, zC = z_rows[R], z[C.rows]
                grad_rows[R] += 2.0 * (H_rows[0, :, None] * zR - H[0] @ zC)
                grad_z[C.rows] += 2.0 * (H_cols[0, :, None] * zC - H[0].mT @ zR)
        return grad_rows, grad_z, grad_s, None, None, None, None, None
