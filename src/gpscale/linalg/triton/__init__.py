r"""GPU kernels in Triton: the fused stationary product :math:`\Phi(z_1, z_2) V` and its
backward (:mod:`gpscale.linalg.triton.stationary`), behind one autograd function.

:func:`available` says whether they can run on tensors like ``like``: Triton installed and either
a CUDA tensor or Triton's interpreter switched on (``TRITON_INTERPRET=1``, CPU tensors: how the
tests run them without a GPU). :func:`stationary_product` takes the scaled, centred inputs of
:func:`gpscale.linalg.fused.stationary_rule` — ``z1`` (B, n1, d), ``z2`` (B, n2, d), ``V``
(B, n2, k), the last ``exact`` dimensions summed as differences — and returns (B, n1, k).

Launch shapes. :func:`tiles` picks them per device. The interpreter gets the smallest legal
ones (``tl.dot`` needs 16). A GPU gets :data:`FORWARD_SHAPE` and :data:`BACKWARD_SHAPE` and at
most 64 right-hand sides per program; larger k runs as more programs, each recomputing its
tiles. The shapes were chosen by compiling for sm_90 on the CPU and reading registers, spills
and shared memory off the machine code (:mod:`gpscale.linalg.triton.resources`), not yet by
timing them on a card: ``scripts/gpu-check.sh tune`` (:func:`gpscale.benchmarks.kernels_gpu.sweep`)
is the check for a lent GPU, and ``GPSCALE_TRITON_TILES`` / ``GPSCALE_TRITON_BACKWARD_TILES``,
``GPSCALE_TRITON_PRECISION`` and ``GPSCALE_TRITON_DISTANCE`` are its settings.

Accuracy. Each program sums its columns in chunks of :data:`CHUNK_COLUMNS`, and the chunk sums
enter the result compensated (Kahan): a plain running sum over n = 200,000 columns gave a
relative error of 1.7·10⁻⁵ on an H200, about √n ulps; the chunked, compensated sum keeps it at a
few ulps (the product with V in float64 as reference).

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

CHUNK_COLUMNS = 1024
"""Columns summed into one partial sum before it enters the compensated total (GPU; 32 in the
interpreter, so that the tests cross chunk boundaries)."""

DIFFERENCE_MAX_DIMS = 16
"""Inputs this narrow may take every dimension as a difference (``GPSCALE_TRITON_DISTANCE``)."""

_WARPS, _STAGES = (1, 2, 4, 8, 16), (1, 2, 3, 4, 5, 6)


def available(like: Tensor) -> bool:
    """Whether the Triton kernels can run on tensors like ``like``."""
    if importlib.util.find_spec("triton") is None or like.dtype not in (torch.float32,
                                                                         torch.float64):
        return False
    return like.device.type == "cuda" or (os.environ.get("TRITON_INTERPRET") == "1"
                                          and like.device.type == "cpu")


def _pow2(n: int, low: int = 16) -> int:
    return max(low, 1 << max(0, n - 1).bit_length())


FORWARD_SHAPE = {"BM": 128, "BN": 32, "W": 8, "S": 3}
"""The forward's launch shape on a GPU in float32 (float64 takes half the rows): compiled for
sm_90 it keeps every value in registers (:mod:`~gpscale.linalg.triton.resources`), where the
earlier 128 × 32 with 4 warps spilled 328 bytes per thread."""

BACKWARD_SHAPE = {"BM": 64, "BN": 16, "W": 4, "S": 1}
"""The symmetric backward's launch shape on a GPU in float32 (float64: half the rows): the
largest of those tried that compiles for sm_90 without spills."""


def tiles(like: Tensor, d: int, k: int, backward: bool = False) -> dict[str, int]:
    """Launch shape: rows BM of ``z1``, columns BN of ``z2``, right-hand sides BK per step, the
    padded input width DPAD (≥ 16, a power of two), the padded k of V's gradient KPAD, warps W
    and pipeline stages S per program, and CHUNK columns per partial sum. ``backward``: the
    symmetric backward's (:data:`BACKWARD_SHAPE`, ``GPSCALE_TRITON_BACKWARD_TILES``)."""
    small = like.device.type != "cuda"
    bk = min(_pow2(k), MAX_K_PER_PROGRAM)
    shape = dict(BACKWARD_SHAPE if backward else FORWARD_SHAPE)
    if like.dtype == torch.float64:
        shape["BM"] = max(16, shape["BM"] // 2)
    if small:
        shape.update(BM=16, BN=16)
    found = {**shape, "BK": bk, "DPAD": _pow2(d), "KPAD": bk,
             "CHUNK": 32 if small else CHUNK_COLUMNS} | _tile_override(backward)
    found["CHUNK"] = max(found["CHUNK"], found["BM"], found["BN"])  # a multiple of both
    return found


def _tile_override(backward: bool = False) -> dict[str, int]:
    """``GPSCALE_TRITON_TILES="BM=64,BN=64,W=8,S=2,CHUNK=2048"`` (the symmetric backward:
    ``GPSCALE_TRITON_BACKWARD_TILES``): the launch shape for a tuning sweep on a GPU
    (:func:`gpscale.benchmarks.kernels_gpu.sweep`); tiles and CHUNK powers of two ≥ 16, W
    (warps) 1–16, S (stages) 1–6."""
    variable = "GPSCALE_TRITON_BACKWARD_TILES" if backward else "GPSCALE_TRITON_TILES"
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return {}
    out = {}
    for part in raw.split(","):
        name, _, value = (t.strip() for t in part.partition("="))
        number = int(value) if value.isdigit() else -1
        legal = (number in _WARPS if name == "W" else number in _STAGES if name == "S"
                 else name in ("BM", "BN", "CHUNK") and number >= 16
                 and not number & (number - 1))
        if not legal:
            raise ValueError(f"{variable} takes BM, BN, CHUNK (powers of two ≥ 16), "
                             f"W (1–16 warps) and S (1–6 stages); got {raw!r}")
        out[name] = number
    return out


def _launch_options(t: dict[str, int], like: Tensor) -> dict:
    """num_warps / num_stages on a GPU (the interpreter takes neither)."""
    return {} if like.device.type != "cuda" else {"num_warps": t["W"], "num_stages": t["S"]}


def _all_differences(like: Tensor, d: int) -> bool:
    """Whether D² takes every dimension as a difference (``GPSCALE_TRITON_DISTANCE=diff``, or
    the default :data:`stationary.DISTANCE` on a GPU) rather than the norm expansion."""
    from gpscale.linalg.triton import stationary as kern

    chosen = os.environ.get("GPSCALE_TRITON_DISTANCE", "").strip() or kern.DISTANCE
    if chosen not in ("expand", "diff"):
        raise ValueError(f"GPSCALE_TRITON_DISTANCE must be expand or diff; got {chosen!r}")
    return chosen == "diff" and d <= DIFFERENCE_MAX_DIMS


def _launch_forward(profile: str, z1: Tensor, z2: Tensor, v: Tensor, exact: int) -> Tensor:
    """Φ(z1, z2) V by :func:`stationary.forward` (``z2 is z1``: the symmetric product)."""
    from gpscale.linalg.triton import stationary as kern

    B, n1, d = z1.shape
    n2, k = z2.shape[1], v.shape[2]
    t = tiles(z1, d, k)
    exact = d if _all_differences(z1, d) else exact
    out = z1.new_empty(B, n1, k)
    grid = (_cdiv(n1, t["BM"]), _cdiv(k, t["BK"]), B)
    kern.forward[grid](z1, z2, v, out, n1, n2, k, z1.stride(0), z1.stride(1), z2.stride(0),
                       z2.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
                       PROFILE=kern.PROFILE_CODES[profile], DDOT=d - exact, EXACT=exact,
                       DPAD=t["DPAD"], BM=t["BM"], BN=t["BN"], BK=t["BK"], CHUNK=t["CHUNK"],
                       SYMMETRIC=z2 is z1, **_precision_args(z1), **_launch_options(t, z1))
    return out


def _precisions(like: Tensor) -> tuple[str, str]:
    """``tl.dot``'s precision for the inner products of D² and for the products with V: float64
    IEEE; float32 :data:`stationary.PRODUCT_PRECISION`, or ``GPSCALE_TRITON_PRECISION`` — one
    of ``ieee`` / ``tf32x3`` for both, or ``"ieee,tf32x3"`` for each (a tuning sweep; plain
    TF32 is refused)."""
    from gpscale.linalg.triton import stationary as kern

    if like.dtype != torch.float32:
        return "ieee", "ieee"
    chosen = os.environ.get("GPSCALE_TRITON_PRECISION", "").strip() or kern.PRODUCT_PRECISION
    parts = [p.strip() for p in chosen.split(",")]
    if len(parts) not in (1, 2) or any(p not in ("ieee", "tf32x3") for p in parts):
        raise ValueError(f"GPSCALE_TRITON_PRECISION must be ieee or tf32x3, or two of them "
                         f"(distances, products) (tf32 is too coarse for GP solves); got "
                         f"{chosen!r}")
    return parts[0], parts[-1]


def _precision(like: Tensor) -> str:
    """The precision of the distances' inner products (:func:`_precisions`)."""
    return _precisions(like)[0]


def _precision_args(like: Tensor) -> dict[str, str]:
    distances, products = _precisions(like)
    return {"PREC_D": distances, "PREC_V": products}


def _backward_precision_args(like: Tensor) -> dict[str, str]:
    """The symmetric backward's: its 2k-wide products always split-precision in float32
    (IEEE FMAs over 2k = 128 spill every register there), the distances as set."""
    distances, _ = _precisions(like)
    return {"PREC_D": distances, "PREC_V": "ieee" if like.dtype != torch.float32 else "tf32x3"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _launch_backward(profile: str, z1: Tensor, z2: Tensor, v: Tensor, grad: Tensor, exact: int,
                     needs: tuple[bool, bool, bool]) -> tuple[Tensor | None, ...]:
    """Gradients of (z1, z2, V) where ``needs`` asks for them: z1's by row tiles; z2's and V's
    by column tiles, in one launch where k ≤ KPAD, else z2's over all of k and V's in slices of
    KPAD right-hand sides (each launch writes its own slice, through strided views)."""
    from gpscale.linalg.triton import stationary as kern

    B, n1, d = z1.shape
    n2, k = z2.shape[1], v.shape[2]
    t = tiles(z1, d, k)
    exact = d if _all_differences(z1, d) else exact
    common = dict(PROFILE=kern.PROFILE_CODES[profile], DDOT=d - exact, EXACT=exact,
                  DPAD=t["DPAD"], DFULL=t["DPAD"], BM=t["BM"], BN=t["BN"], BK=t["BK"],
                  CHUNK=t["CHUNK"], **_precision_args(z1), **_launch_options(t, z1))
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

    grad_z2 = torch.empty_like(z2) if needs[1] else None
    grad_v = torch.empty_like(v) if needs[2] else None
    if k <= t["KPAD"] and (needs[1] or needs[2]):  # one pass for both
        columns(v, grad, grad_z2, grad_v)
        return grad_z1, grad_z2, grad_v
    if needs[1]:
        columns(v, grad, grad_z2, None)
    if needs[2]:
        for k0 in range(0, k, t["KPAD"]):
            part = slice(k0, min(k, k0 + t["KPAD"]))
            columns(v[..., part], grad[..., part], None, grad_v[..., part])
    return grad_z1, grad_z2, grad_v


def _launch_backward_symmetric(profile: str, z: Tensor, v: Tensor, grad: Tensor, exact: int,
                               need_v: bool) -> tuple[Tensor, Tensor | None]:
    """The gradients of Φ(z, z) V (k ≤ :data:`MAX_K_PER_PROGRAM`): z's in one pass
    (:func:`stationary.backward_symmetric`), V's = Φ Ȳ by the forward."""
    from gpscale.linalg.triton import stationary as kern

    B, n, d = z.shape
    k = v.shape[2]
    t = tiles(z, d, k, backward=True)
    exact_all = d if _all_differences(z, d) else exact
    grad_z = torch.empty_like(z)
    kern.backward_symmetric[(_cdiv(n, t["BM"]), B)](
        z, v, grad, grad_z, n, k, z.stride(0), z.stride(1), v.stride(0), v.stride(1),
        grad.stride(0), grad.stride(1), grad_z.stride(0), grad_z.stride(1),
        PROFILE=kern.PROFILE_CODES[profile], DDOT=d - exact_all, EXACT=exact_all,
        DPAD=t["DPAD"], DFULL=t["DPAD"], BM=t["BM"], BN=t["BN"], K2PAD=_pow2(2 * k),
        CHUNK=t["CHUNK"], **_backward_precision_args(z), **_launch_options(t, z))
    return grad_z, (_launch_forward(profile, z, z, grad, exact) if need_v else None)


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
        same = z2 is z1
        z1, z2, v = (t.contiguous() for t in (z1, z2, v))
        z2 = z1 if same else z2  # kept one object: the forward's symmetric branch
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


class _SymmetricProduct(torch.autograd.Function):
    """Φ(z, z) V: the forward of :class:`_StationaryProduct`, and a backward that takes z's two
    roles in one pass (:func:`_launch_backward_symmetric`) where k allows."""

    @staticmethod
    def forward(ctx, profile: str, z: Tensor, v: Tensor, exact: int) -> Tensor:
        return _StationaryProduct.forward(ctx, profile, z, z, v, exact)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        z, _, v = ctx.saved_tensors
        need_z, need_v = ctx.needs_input_grad[1:3]
        grad = grad.contiguous()
        if not _FAILED:
            try:
                if not need_z:  # V's gradient alone: Φ Ȳ, the forward with Ȳ for V
                    return None, None, _launch_forward(ctx.profile, z, z, grad, ctx.exact), None
                if v.shape[2] <= MAX_K_PER_PROGRAM:
                    grad_z, grad_v = _launch_backward_symmetric(ctx.profile, z, v, grad,
                                                                ctx.exact, need_v)
                else:
                    g1, g2, grad_v = _launch_backward(ctx.profile, z, z, v, grad, ctx.exact,
                                                      (True, True, need_v))
                    grad_z = g1 + g2
                return None, grad_z, grad_v, None
            except Exception as err:  # noqa: BLE001 - as in _StationaryProduct
                _fallback(err)
        g1, g2, grad_v = _rule(ctx.profile, ctx.exact).vjp(z, z, v, grad,
                                                           (need_z, need_z, need_v))
        return None, (g1 + g2 if need_z else None), grad_v, None


def _rule(profile: str, exact: int):
    from gpscale.linalg.fused import stationary_rule

    return stationary_rule(profile, compiled=True, exact=exact)


def stationary_product(profile: str, z1: Tensor, z2: Tensor, v: Tensor,
                       exact: int = 0, symmetric: bool = False) -> Tensor:
    """:math:`\\Phi(z_1, z_2) V` (B, n1, k) by the Triton kernels; differentiable in all three.

    Args:
        profile: ``'rbf'``, ``'matern12'``, ``'matern32'`` or ``'matern52'``.
        z1: (B, n1, d) scaled, centred row inputs.
        z2: (B, n2, d) column inputs.
        v: (B, n2, k) right-hand sides.
        exact: the last ``exact`` dimensions enter D² as squared differences.
        symmetric: ``z2`` is ``z1`` (K(X, X) V): the backward takes both roles of z in one pass,
            and the gradient flows to ``z1`` alone.
    """
    if z1.dim() != 3 or z2.shape[0] != z1.shape[0] or v.shape[:2] != z2.shape[:2] \
            or z2.shape[2] != z1.shape[2]:
        raise ValueError(f"stationary_product needs z1 (B, n1, d), z2 (B, n2, d), v (B, n2, k); "
                         f"got {tuple(z1.shape)}, {tuple(z2.shape)}, {tuple(v.shape)}")
    _precisions(z1), _all_differences(z1, z1.shape[2])  # the settings fail here, not in a launch
    tiles(z1, 1, 1), tiles(z1, 1, 1, backward=True)
    if symmetric:
        if z2 is not z1:
            raise ValueError("stationary_product(symmetric=True) takes z1 itself as z2: the "
                             "backward gives z1 the gradient of both roles")
        return _SymmetricProduct.apply(profile, z1, v, exact)
    return _StationaryProduct.apply(profile, z1, z2, v, exact)


def block_sparse_product(profile: str, z1: Tensor, z2: Tensor, values: Tensor, layout,
                         exact: int = 0) -> Tensor:
    """CaGP-Opt's block-sparse product
    (:func:`gpscale.linalg.triton.sparse.block_sparse_product`)."""
    from gpscale.linalg.triton.sparse import block_sparse_product as product

    return product(profile, z1, z2, values, layout, exact)
