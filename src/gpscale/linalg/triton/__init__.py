r"""GPU kernels in Triton: the fused stationary product :math:`\Phi(z_1, z_2) V` and its
backward (:mod:`gpscale.linalg.triton.stationary`), behind one autograd function.

:func:`available` says whether they can run on tensors like ``like``: Triton installed and either
a CUDA tensor or Triton's interpreter switched on (``TRITON_INTERPRET=1``, CPU tensors: how the
tests run them without a GPU). :func:`stationary_product` takes the scaled, centred inputs of
:func:`gpscale.linalg.fused.stationary_rule` — ``z1`` (B, n1, d), ``z2`` (B, n2, d), ``V``
(B, n2, k), the last ``exact`` dimensions summed as differences — and returns (B, n1, k).

Tile sizes. :func:`tiles` picks them per device. The interpreter gets the smallest legal ones
(``tl.dot`` needs 16). A GPU gets 128 × 32 tiles of ``z1`` × ``z2`` and at most 64 right-hand
sides per program; larger k runs as more programs, each recomputing its tiles. These are
starting points, not tuned figures: 128 × 32 is what a throwaway kernel of the same plan ran at
0.50 of the fp32 roofline with on one H100 (issue #43; there 64 × 128 tiles fell to 0.01,
probably register spills); float64 takes 64 rows (twice the registers per value). Tuning them
is for a lent GPU.

A launch that fails (no compiler for this device, too little shared memory) warns once and the
compiled PyTorch tiles of :mod:`gpscale.linalg.fused` compute this and every later product, so
a default path never ends in a Triton traceback.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["available", "block_sparse_product", "stationary_product", "tiles"]

MAX_K_PER_PROGRAM = 64
"""Right-hand sides per program of the forward and of ``V``'s gradient."""


def available(like: Tensor) -> bool:
    """Whether the Triton kernels can run on tensors like ``like``."""
    if importlib.util.find_spec("triton") is None or like.dtype not in (torch.float32,
                                                                         torch.float64):
        return False
    return like.device.type == "cuda" or (os.environ.get("TRITON_INTERPRET") == "1"
                                          and like.device.type == "cpu")


def _pow2(n: int, low: int = 16) -> int:
    return max(low, 1 << max(0, n - 1).bit_length())


def tiles(like: Tensor, d: int, k: int) -> dict[str, int]:
    """Tile sizes: rows BM of ``z1``, columns BN of ``z2``, right-hand sides BK per step, the
    padded input width DPAD (≥ 16, a power of two) and the padded k of V's gradient KPAD."""
    small = like.device.type != "cuda"
    bk = min(_pow2(k), MAX_K_PER_PROGRAM)
    rows = 16 if small else 64 if like.dtype == torch.float64 else 128
    found = {"BM": rows, "BN": 16 if small else 32, "BK": bk, "DPAD": _pow2(d), "KPAD": bk}
    return found | _tile_override()


def _tile_override() -> dict[str, int]:
    """``GPSCALE_TRITON_TILES="BM=64,BN=64"``: tile sizes for a tuning sweep on a GPU
    (:func:`gpscale.benchmarks.kernels_gpu.sweep`); powers of two ≥ 16."""
    raw = os.environ.get("GPSCALE_TRITON_TILES", "").strip()
    if not raw:
        return {}
    out = {}
    for part in raw.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in ("BM", "BN") or not value.strip().isdigit() \
                or int(value) < 16 or int(value) & (int(value) - 1):
            raise ValueError(f"GPSCALE_TRITON_TILES takes BM=<2^k>,BN=<2^k> (≥ 16); got {raw!r}")
        out[name.strip()] = int(value)
    return out


def _launch_forward(profile: str, z1: Tensor, z2: Tensor, v: Tensor, exact: int) -> Tensor:
    from gpscale.linalg.triton import stationary as kern

    B, n1, d = z1.shape
    n2, k = z2.shape[1], v.shape[2]
    t = tiles(z1, d, k)
    out = z1.new_empty(B, n1, k)
    grid = (_cdiv(n1, t["BM"]), _cdiv(k, t["BK"]), B)
    kern.forward[grid](z1, z2, v, out, n1, n2, k, z1.stride(0), z1.stride(1), z2.stride(0),
                       z2.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
                       PROFILE=kern.PROFILE_CODES[profile], DDOT=d - exact, EXACT=exact,
                       DPAD=t["DPAD"], BM=t["BM"], BN=t["BN"], BK=t["BK"],
                       PRECISION=_precision(z1))
    return out


def _precision(like: Tensor) -> str:
    """``tl.dot``'s precision: float64 IEEE; float32 :data:`stationary.PRODUCT_PRECISION`, or
    ``GPSCALE_TRITON_PRECISION=tf32x3`` (a tuning sweep; plain TF32 is refused)."""
    from gpscale.linalg.triton import stationary as kern

    if like.dtype != torch.float32:
        return "ieee"
    chosen = os.environ.get("GPSCALE_TRITON_PRECISION", "").strip() or kern.PRODUCT_PRECISION
    if chosen not in ("ieee", "tf32x3"):
        raise ValueError(f"GPSCALE_TRITON_PRECISION must be ieee or tf32x3 (tf32 is too coarse "
                         f"for GP solves); got {chosen!r}")
    return chosen


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _launch_backward(profile: str, z1: Tensor, z2: Tensor, v: Tensor, grad: Tensor, exact: int,
                     needs: tuple[bool, bool, bool]) -> tuple[Tensor | None, ...]:
    """Gradients of (z1, z2, V) where ``needs`` asks for them: z1's by row tiles, z2's by
    column tiles over all of k, V's by column tiles in slices of KPAD right-hand sides (each
    launch writes its own slice, through strided views)."""
    from gpscale.linalg.triton import stationary as kern

    B, n1, d = z1.shape
    n2, k = z2.shape[1], v.shape[2]
    t = tiles(z1, d, k)
    common = dict(PROFILE=kern.PROFILE_CODES[profile], DDOT=d - exact, EXACT=exact,
                  DPAD=t["DPAD"], DFULL=t["DPAD"], BM=t["BM"], BN=t["BN"], BK=t["BK"],
                  PRECISION=_precision(z1))
    grad_z1 = grad_z2 = grad_v = None
    if needs[0]:
        grad_z1 = torch.empty_like(z1)
        kern.backward_rows[(_cdiv(n1, t["BM"]), B)](
            z1, z2, v, grad, grad_z1, n1, n2, k, z1.stride(0), z1.stride(1), z2.stride(0),
            z2.stride(1), v.stride(0), v.stride(1), grad.stride(0), grad.stride(1),
            grad_z1.stride(0), grad_z1.stride(1), **common)
    dummy = z2.new_empty(1, 1, 1)

    def columns(vs: Tensor, gs: Tensor, gz: Tensor | None, gv: Tensor | None) -> None:
        gz_t, gv_t = (dummy if gz is None else gz), (dummy if gv is None else gv)
        kern.backward_cols[(_cdiv(n2, t["BN"]), B)](
            z1, z2, vs, gs, gz_t, gv_t, n1, n2, vs.shape[2], z1.stride(0), z1.stride(1),
            z2.stride(0), z2.stride(1), vs.stride(0), vs.stride(1), gs.stride(0), gs.stride(1),
            gz_t.stride(0), gz_t.stride(1), gv_t.stride(0), gv_t.stride(1), KPAD=t["KPAD"],
            NEED_Z=gz is not None, NEED_V=gv is not None, **common)

    if needs[1]:
        grad_z2 = torch.empty_like(z2)
        columns(v, grad, grad_z2, None)
    if needs[2]:
        grad_v = torch.empty_like(v)
        for k0 in range(0, k, t["KPAD"]):
            part = slice(k0, min(k, k0 + t["KPAD"]))
            columns(v[..., part], grad[..., part], None, grad_v[..., part])
    return grad_z1, grad_z2, grad_v


_FAILED: list[str] = []  # the first launch error, after which the PyTorch tiles take over


def _fallback(err: Exception) -> None:
    """Warn once that the Triton kernels failed (a compiler or a device they do not support)
    and that the compiled PyTorch tiles compute the products from now on."""
    if not _FAILED:
        _FAILED.append(f"{type(err).__name__}: {' '.join(str(err).split())[:300]}")
        warnings.warn(f"the Triton kernel product failed ({_FAILED[0]}); computing kernel "
                      "products with the compiled PyTorch tiles instead (backend='compiled')",
                      RuntimeWarning, stacklevel=4)


class _StationaryProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, profile: str, z1: Tensor, z2: Tensor, v: Tensor, exact: int) -> Tensor:
        z1, z2, v = (t.contiguous() for t in (z1, z2, v))
        ctx.profile, ctx.exact = profile, exact
        ctx.save_for_backward(z1, z2, v)
        if not _FAILED:
            try:
                return _launch_forward(profile, z1, z2, v, exact)
            except Exception as err:  # noqa: BLE001 - any launch failure: warn, use the tiles
                _fallback(err)
        return _rule(profile, exact).forward(z1, z2, v)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        z1, z2, v = ctx.saved_tensors
        needs = tuple(ctx.needs_input_grad[1:4])
        grads = None
        if not _FAILED:
            try:
                grads = _launch_backward(ctx.profile, z1, z2, v, grad.contiguous(), ctx.exact,
                                         needs)
            except Exception as err:  # noqa: BLE001 - as in forward
                _fallback(err)
        if grads is None:
            grads = _rule(ctx.profile, ctx.exact).vjp(z1, z2, v, grad, (*needs,))
        return None, *grads, None


def _rule(profile: str, exact: int):
    from gpscale.linalg.fused import stationary_rule

    return stationary_rule(profile, compiled=True, exact=exact)


def stationary_product(profile: str, z1: Tensor, z2: Tensor, v: Tensor,
                       exact: int = 0) -> Tensor:
    """:math:`\\Phi(z_1, z_2) V` (B, n1, k) by the Triton kernels; differentiable in all three.

    Args:
        profile: ``'rbf'``, ``'matern12'``, ``'matern32'`` or ``'matern52'``.
        z1: (B, n1, d) scaled, centred row inputs.
        z2: (B, n2, d) column inputs.
        v: (B, n2, k) right-hand sides.
        exact: the last ``exact`` dimensions enter D² as squared differences.
    """
    if z1.dim() != 3 or z2.shape[0] != z1.shape[0] or v.shape[:2] != z2.shape[:2] \
            or z2.shape[2] != z1.shape[2]:
        raise ValueError(f"stationary_product needs z1 (B, n1, d), z2 (B, n2, d), v (B, n2, k); "
                         f"got {tuple(z1.shape)}, {tuple(z2.shape)}, {tuple(v.shape)}")
    return _StationaryProduct.apply(profile, z1, z2, v, exact)


def block_sparse_product(profile: str, z1: Tensor, z2: Tensor, values: Tensor, layout,
                         exact: int = 0) -> Tensor:
    """CaGP-Opt's block-sparse product
    (:func:`gpscale.linalg.triton.sparse.block_sparse_product`)."""
    from gpscale.linalg.triton.sparse import block_sparse_product as product

    return product(profile, z1, z2, values, layout, exact)
