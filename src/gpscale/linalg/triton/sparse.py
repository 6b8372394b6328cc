r"""The block-sparse product :math:`\Phi(z_1, z_2) S` of CaGP-Opt by the Triton kernels of
:mod:`gpscale.linalg.triton.block_sparse`, behind one autograd function.

:func:`block_sparse_product` takes ``z2`` and the action values in block order, as
:func:`~gpscale.linalg.operators.block_sparse.symmetric_kernel_product` (``z1 is z2``) and
:func:`~gpscale.linalg.operators.block_sparse_rect.rectangular_kernel_product` (other rows) do,
and returns the same (n1, i). A launch that fails warns once (as the dense product's) and those
PyTorch tiles, compiled, compute this and every later product.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from gpscale.linalg.operators.block_sparse import BlockLayout

__all__ = ["block_sparse_product"]

BLOCKS_PER_PROGRAM = 32
"""Blocks (columns of S) one forward program reduces into on a GPU (16 in the interpreter)."""


def _tiles(like: Tensor, d: int) -> dict[str, int]:
    from gpscale.linalg.triton import tiles

    t = tiles(like, d, 1)
    small = like.device.type != "cuda"
    return {"BM": t["BM"], "BN": t["BN"], "DPAD": t["DPAD"], "BJ": 16 if small else
            BLOCKS_PER_PROGRAM}


def _layout_tensors(layout: BlockLayout, device: torch.device) -> tuple[Tensor, Tensor]:
    """(n,) block id of each position and (i + 1,) the blocks' start positions."""
    sizes = torch.tensor(layout.sizes(), device=device)
    starts = torch.zeros(layout.num_blocks + 1, dtype=torch.int64, device=device)
    starts[1:] = sizes.cumsum(0)
    return layout.block_ids(device), starts


def _common(profile: str, z1: Tensor, exact: int, symmetric: bool) -> dict:
    from gpscale.linalg.triton import _precision
    from gpscale.linalg.triton import stationary as kern

    d = z1.shape[1]
    t = _tiles(z1, d)
    return dict(PROFILE=kern.PROFILE_CODES[profile], DDOT=d - exact, EXACT=exact,
                DPAD=t["DPAD"], BM=t["BM"], BN=t["BN"], SYMMETRIC=symmetric,
                PRECISION=_precision(z1)), t


def _launch_forward(profile, z1, z2, values, layout, exact, symmetric) -> Tensor:
    from gpscale.linalg.triton import _cdiv
    from gpscale.linalg.triton import block_sparse as kern

    common, t = _common(profile, z1, exact, symmetric)
    bids, starts = _layout_tensors(layout, z1.device)
    n1, i = z1.shape[0], layout.num_blocks
    out = z1.new_empty(n1, i)
    grid = (_cdiv(n1, t["BM"]), _cdiv(i, t["BJ"]))
    kern.forward[grid](z1, z2, values, bids, starts, out, n1, z2.shape[0], i, z1.stride(0),
                       z2.stride(0), out.stride(0), BJ=t["BJ"], **common)
    return out


def _launch_backward(profile, z1, z2, values, layout, grad, exact, symmetric, needs):
    from gpscale.linalg.triton import _cdiv
    from gpscale.linalg.triton import block_sparse as kern

    common, t = _common(profile, z1, exact, symmetric)
    bids, _ = _layout_tensors(layout, z1.device)
    n1, n2 = z1.shape[0], z2.shape[0]
    grad_z1 = grad_z2 = grad_s = None
    if needs[0]:
        grad_z1 = torch.empty_like(z1)
        kern.backward_rows[(_cdiv(n1, t["BM"]),)](
            z1, z2, values, bids, grad, grad_z1, n1, n2, z1.stride(0), z2.stride(0),
            grad.stride(0), grad_z1.stride(0), DFULL=t["DPAD"], **common)
    if needs[1] or needs[2]:
        grad_z2 = torch.empty_like(z2) if needs[1] else z2.new_empty(1, 1)
        grad_s = torch.empty_like(values) if needs[2] else values.new_empty(1)
        kern.backward_cols[(_cdiv(n2, t["BN"]),)](
            z1, z2, values, bids, grad, grad_z2, grad_s, n1, n2, z1.stride(0), z2.stride(0),
            grad.stride(0), grad_z2.stride(0), DFULL=t["DPAD"], NEED_Z=needs[1],
            NEED_S=needs[2], **common)
    return grad_z1, grad_z2 if needs[1] else None, grad_s if needs[2] else None


def _tiles_product(profile, z1, z2, values, layout, exact, symmetric) -> Tensor:
    """The same product by the compiled PyTorch tiles (the fallback)."""
    from gpscale.linalg.operators.block_sparse import symmetric_kernel_product
    from gpscale.linalg.operators.block_sparse_rect import rectangular_kernel_product

    if symmetric:
        return symmetric_kernel_product(profile, z2, values, layout, compiled=True, exact=exact)
    return rectangular_kernel_product(profile, z1, z2, values, layout, compiled=True,
                                      exact=exact)


class _BlockSparseProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, profile, z1, z2, values, layout, exact, symmetric):
        from gpscale.linalg import triton as package

        z1, z2, values = (t.contiguous() for t in (z1, z2, values))
        ctx.args = (profile, layout, exact, symmetric)
        ctx.save_for_backward(z1, z2, values)
        if not package._FAILED:
            try:
                return _launch_forward(profile, z1, z2, values, layout, exact, symmetric)
            except Exception as err:  # noqa: BLE001 - any launch failure: warn, use the tiles
                package._fallback(err)
        return _tiles_product(profile, z1, z2, values, layout, exact, symmetric)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        from gpscale.linalg import triton as package

        z1, z2, values = ctx.saved_tensors
        profile, layout, exact, symmetric = ctx.args
        needs = tuple(ctx.needs_input_grad[1:4])
        if not package._FAILED:
            try:
                grads = _launch_backward(profile, z1, z2, values, layout, grad.contiguous(),
                                         exact, symmetric, needs)
                return None, *grads, None, None, None
            except Exception as err:  # noqa: BLE001 - as in forward
                package._fallback(err)
        if symmetric:  # the tiles differentiate in their one z: all of it goes to z2
            needs = (False, needs[0] or needs[1], needs[2])
        with torch.enable_grad():  # the tiles' own backward, through autograd
            leaves = [t.detach().requires_grad_(need) for t, need in zip((z1, z2, values),
                                                                         needs, strict=True)]
            out = _tiles_product(profile, *leaves, layout, exact, symmetric)
            wanted = [t for t in leaves if t.requires_grad]
            found = iter(torch.autograd.grad(out, wanted, grad))
        grads = [next(found) if need else None for need in needs]
        if symmetric and ctx.needs_input_grad[1]:
            grads[0] = torch.zeros_like(z1)
        return None, *grads, None, None, None


def block_sparse_product(profile: str, z1: Tensor, z2: Tensor, values: Tensor,
                         layout: BlockLayout, exact: int = 0) -> Tensor:
    r""":math:`\Phi(z_1, z_2) S` (n1, i) for block-sparse S; differentiable in z1, z2, values.

    Args:
        profile: ``'rbf'``, ``'matern12'``, ``'matern32'`` or ``'matern52'``.
        z1: (n1, d) scaled row inputs; pass ``z2`` itself for the symmetric training product
            (a point's distance to itself is then exactly 0).
        z2: (n2, d) scaled inputs in block order.
        values: (n2,) the actions' entries in block order.
        layout: their :class:`~gpscale.linalg.operators.block_sparse.BlockLayout`.
        exact: the last ``exact`` dimensions enter D² as squared differences.
    """
    if z1.dim() != 2 or z2.dim() != 2 or z1.shape[1] != z2.shape[1] \
            or values.shape != (z2.shape[0],) or layout.num_points != z2.shape[0]:
        raise ValueError(f"block_sparse_product needs z1 (n1, d), z2 (n2, d), values (n2,) and "
                         f"a layout of n2 points; got {tuple(z1.shape)}, {tuple(z2.shape)}, "
                         f"{tuple(values.shape)}, {layout.num_points}")
    return _BlockSparseProduct.apply(profile, z1, z2, values, layout, exact, z1 is z2)
