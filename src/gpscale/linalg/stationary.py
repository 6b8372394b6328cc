r"""Dense stationary kernel matrices :math:`s\,\varphi(D^2)` in one autograd node.

:math:`D^2_{ij} = \lVert z_{1i} - z_{2j}\rVert^2` for scaled, centred inputs (z = (x − c)/ℓ, see
:func:`gpscale.linalg.reach.centre`), from the inner products and norms of
:mod:`gpscale.linalg.fused` (the dimensions :func:`~gpscale.linalg.fused.exact_dims` picks enter
exactly), through the same profile functions as the matrix-free products. Nothing n1 × n2 is kept
for the backward pass: it recomputes the inner products and takes
:math:`H = (s\bar G) \odot \varphi'(D^2)` from the profile's vjp; then
:math:`\bar z_1 = 2(\operatorname{diag}(H 1) z_1 - H z_2)`,
:math:`\bar z_2 = 2(\operatorname{diag}(H^\top 1) z_2 - H^\top z_1)` and
:math:`\bar s = \langle \bar G, \varphi\rangle`.
Cost: O(n1 n2 d) in batched matrix products plus O(n1 n2) elementwise, each way, by row
blocks of :data:`ROW_BLOCK_ENTRIES` entries (memory: the result and a few blocks).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpscale.linalg import fused

__all__ = ["stationary_matrix"]


def stationary_matrix(z1: Tensor, z2: Tensor, outputscale: Tensor, profile: str, *,
                      exact: int = 0, symmetric: bool = False) -> Tensor:
    """``outputscale[b] · φ(‖z1[b, i] − z2[b, j]‖²)`` as (B, n1, n2), differentiable in all three.

    Args:
        z1: (B, n1, d) scaled rows, the ``exact`` dimensions last.
        z2: (B, n2, d) scaled columns, the same order.
        outputscale: (B,).
        profile: a key of :data:`gpscale.linalg.fused.PROFILES`.
        exact: how many trailing dimensions enter D² exactly (:func:`fused.inner_products`).
        symmetric: z1 and z2 are the same points: D²_ii is set to exactly 0.
    """
    return _StationaryMatrix.apply(z1, z2, outputscale, profile, exact, symmetric)


ROW_BLOCK_ENTRIES = 2**22
"""Entries (rows × n2) of the row blocks the profile and its backward work on: their
temporaries stay a few such blocks, not n1 × n2 each (with whole-matrix temporaries an exact GP's
loss with its backward held several n × n matrices at its peak)."""


def _row_blocks(n1: int, n2: int) -> list[slice]:
    step = max(1, ROW_BLOCK_ENTRIES // max(n2, 1))
    return [slice(r, min(n1, r + step)) for r in range(0, n1, step)]


class _StationaryMatrix(torch.autograd.Function):
    """s φ(D²) with the backward of the module docstring, both by row blocks."""

    @staticmethod
    def forward(ctx, z1: Tensor, z2: Tensor, s: Tensor, profile: str, exact: int,
                symmetric: bool) -> Tensor:
        value, _ = fused.PROFILES[profile]
        out = z1.new_empty(z1.shape[0], z1.shape[1], z2.shape[1])
        sq1, sq2 = _norms(z1, z2, exact)
        for rows in _row_blocks(z1.shape[1], z2.shape[1]):
            P = _inner(z1, z2, rows, exact, symmetric, sq1, sq2)
            value(P, sq1[:, rows], sq2)  # P ← φ(D²)
            out[:, rows] = P.mul_(s[..., None, None])
        ctx.save_for_backward(z1, z2, s)
        ctx.profile, ctx.exact, ctx.symmetric = profile, exact, symmetric
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        z1, z2, s = ctx.saved_tensors
        _, vjp = fused.PROFILES[ctx.profile]
        sq1, sq2 = _norms(z1, z2, ctx.exact)
        grad_z1 = torch.empty_like(z1)
        grad_z2 = torch.zeros_like(z2)
        grad_s = torch.zeros_like(s) if ctx.needs_input_grad[2] else None
        for rows in _row_blocks(z1.shape[1], z2.shape[1]):
            P = _inner(z1, z2, rows, ctx.exact, ctx.symmetric, sq1, sq2)
            G = grad[:, rows]
            H = G * s[..., None, None]
            row_sums, col_sums = vjp(P, sq1[:, rows], sq2, H)  # P ← φ, H ← (s Ḡ) ⊙ φ'(D²)
            if grad_s is not None:
                grad_s += (G * P).sum((-2, -1))
            grad_z1[:, rows] = 2 * torch.baddbmm(row_sums[..., None] * z1[:, rows], H, z2,
                                                 alpha=-1)
            grad_z2 += 2 * torch.baddbmm(col_sums[..., None] * z2, H.mT, z1[:, rows],
                                         alpha=-1)
        return grad_z1, grad_z2, grad_s, None, None, None


def _norms(z1: Tensor, z2: Tensor, exact: int) -> tuple[Tensor, Tensor]:
    """Squared norms (B, n1, 1) and (B, 1, n2) of :func:`fused.sq_norms`."""
    return fused.sq_norms(z1, exact)[..., None], fused.sq_norms(z2, exact)[..., None, :]


def _inner(z1: Tensor, z2: Tensor, rows: slice, exact: int, symmetric: bool, sq1: Tensor,
           sq2: Tensor) -> Tensor:
    """Inner products P (B, r, n2) of the rows ``rows`` of z1 with z2; with ``symmetric`` the
    diagonal entries (i, i) are set so that D²_ii = sq1_i + sq2_i − 2 P_ii = 0 exactly."""
    z1_rows = z1[:, rows]
    P = z1.new_empty(z1.shape[0], z1_rows.shape[1], z2.shape[1])
    fused.inner_products(z1_rows, z2, P, exact)
    if symmetric:
        diagonal = P.diagonal(offset=rows.start, dim1=-2, dim2=-1)  # entries (i, i)
        i = torch.arange(rows.start, rows.start + diagonal.shape[-1], device=P.device)
        diagonal.copy_(0.5 * (sq1[:, i, 0] + sq2[:, 0, i]))
    return P
