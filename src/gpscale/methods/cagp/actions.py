"""CaGP's operations on its actions S, dense or block-sparse (one function per layout):
float64 copies, the action Gram SᵀS and the kernel product K S; and learned actions carried
to more rows (:func:`grown_actions`)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from gpscale.kernels import kernel_block_sparse_matmul, kernel_matmul
from gpscale.linalg.operators.block_sparse import BlockSparseActions
from gpscale.linalg.ops import safe_cholesky, upcast
from gpscale.linalg.policies.block_sparse import grow_blocks
from gpscale.methods.cagp.calibration import held_after_growing

__all__ = ["upcast_actions", "action_gram", "kernel_times", "grown_actions"]


@functools.singledispatch
def upcast_actions(S: Tensor) -> Tensor:
    """The actions in float64 (differentiable: gradients reach the float32 values)."""
    return upcast(S)


@upcast_actions.register
def _(S: BlockSparseActions) -> BlockSparseActions:
    return BlockSparseActions(upcast(S.values), S.index, num_blocks=S.layout.num_blocks,
                              transposed=S.transposed)


@functools.singledispatch
def action_gram(S: Tensor) -> tuple[Tensor, Tensor]:
    """(SᵀS, log det SᵀS) in float64 for dense actions (through a Cholesky factor)."""
    D = upcast(S.mT @ S)
    return D, 2 * safe_cholesky(D, name="action Gram SᵀS").diagonal().log().sum()


@action_gram.register
def _(S: BlockSparseActions) -> tuple[Tensor, Tensor]:
    norms = upcast(S.squared_norms())  # ‖s'_j‖², SᵀS is diagonal
    return torch.diag(norms), norms.log().sum()  # Eq. (11): Σ_j log ‖s'_j‖²


@functools.singledispatch
def kernel_times(S: Tensor, kernel, x: Tensor, x_rows: Tensor | None, chunk_size: int | None,
                  backend: str) -> Tensor:
    """K(x_rows, x) S matrix-free (x_rows=None: K(x, x) S) for dense actions."""
    rows = x if x_rows is None else x_rows
    return kernel_matmul(kernel, rows, x, S, chunk_size=chunk_size, backend=backend)


@kernel_times.register
def _(S: BlockSparseActions, kernel, x: Tensor, x_rows: Tensor | None, chunk_size: int | None,
      backend: str) -> Tensor:
    return kernel_block_sparse_matmul(kernel, x, S, x_rows=x_rows, chunk_size=chunk_size,
                                      backend=backend)


def grown_actions(trained: dict[str, Tensor], policy, x: Tensor, kept: Tensor, added: Tensor, *,
                  hold: bool, seed: int) -> dict[str, Tensor]:
    """``trained``, the parameters of CaGP-Opt with ``policy`` on the rows ``kept`` of ``x``,
    with its actions grown to the rows ``kept`` then ``added``
    (:func:`~gpscale.linalg.policies.block_sparse.grow_blocks`). Entries it held start at
    zero; with ``hold``, the grown actions hold added rows (never trained on:
    :func:`~gpscale.methods.cagp.calibration.held_after_growing`)."""
    values = trained["policy.values"].masked_fill(policy.held.to(trained["policy.values"].device),
                                                  0.0)
    order, values = grow_blocks(x[kept], policy.index, values, policy.layout.num_blocks, x[added])
    rows = torch.cat([kept, added]).to(order.device)
    held = held_after_growing(order, kept.numel(), seed) if hold else \
        torch.zeros(order.shape[0], dtype=torch.bool)
    return {**trained, "policy.values": values, "policy.index": rows[order],
            "policy.held": held.to(policy.held.device)}
