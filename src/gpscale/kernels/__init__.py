"""The one boundary between gpscale and GPyTorch kernels.

Only this module may know about ``ScaleKernel``, lazy evaluation or private kernel methods.

``make_kernel`` builds the kernels the CLI and estimators name by string: one of
:data:`KERNELS`, or an expression composing kernels on groups of inputs
(:mod:`gpscale.kernels.algebra`, built by :mod:`gpscale.kernels.compose`). ``kernel_matrix`` and
``kernel_diag`` evaluate densely; ``kernel_matmul`` computes ``K(x1, x2) @ rhs`` matrix-free, in
row chunks, holding at most ``chunk_size × n2`` kernel entries at a time in the forward and in the
backward pass (blocks are recomputed there; see :mod:`gpscale.linalg.chunked`).

Backends of ``kernel_matmul`` (all compute the same numbers up to rounding):

============  ================================  ====================================================
backend       kernels                           how
============  ================================  ====================================================
``eager``     any GPyTorch kernel               ``kernel(x2, x1c)ᵀ @ rhs`` (centred on x2)
``fused``     [Scale](RBF, Matérn ½, 3/2, 5/2)  distance → profile → product, plain PyTorch
``compiled``  as ``fused``                      the same, its elementwise part by ``torch.compile``
``keops``     as ``fused``                      pykeops (``pip install gpscale[keops]``)
``native``    as ``fused``, CPU                 C row kernels (:mod:`gpscale.linalg.native`)
``triton``    as ``fused``, CUDA                Triton kernels (:mod:`gpscale.linalg.triton`)
``composed``  sums of scaled products of RBF /  CPU: ``native``'s C panels; else a tile built
              Matérn on column groups           once, one GEMM (:mod:`gpscale.linalg.composed`)
============  ================================  ====================================================

`native` covers the block-sparse products of CaGP-Opt (``kernel_block_sparse_matmul``, and the
rectangular one without gradients) and, where nothing needs a gradient, the dense product
(:func:`gpscale.linalg.native.dense_product`: C panels of kernel values multiplied at once by
vector micro-kernels, each off-diagonal tile of K(x, x) used for its rows and its columns);
with gradients it runs `compiled`.

``backend='auto'`` resolves by :func:`select_backend`'s rule. Every product and
``kernel_matrix`` takes its distances within reach (:mod:`gpscale.linalg.reach`): a point of
either set beyond the kernel's reach of the other gets exactly 0 and moves no other.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import gpytorch
import torch
from gpytorch.kernels import InducingPointKernel, Kernel, MaternKernel, RBFKernel, ScaleKernel

from gpscale.kernels.algebra import KernelSyntaxError, parse_kernel
from gpscale.kernels.compose import build_kernel, composed_terms
from gpscale.linalg import fused, native, products, reach, triton
from gpscale.linalg.chunked import autograd_rule, chunked_product, default_chunk_size
from gpscale.linalg.composed import composed_matmul
from gpscale.linalg.operators.block_sparse import BlockSparseActions, symmetric_kernel_product
from gpscale.linalg.operators.block_sparse_rect import rectangular_kernel_product
from gpscale.linalg.stationary import stationary_matrix
from gpscale.typing import Float, Tensor

__all__ = ["AUTO_COMPILE_MIN_ENTRIES", "BACKENDS", "KERNELS", "KernelHyperparameters",
           "KernelSyntaxError", "build_kernel", "is_expression", "parse_kernel",
           "dense_kernel_matrix", "inducing_factor", "kernel_block_sparse_matmul",
           "kernel_block_sparse_rect_matmul", "kernel_diag", "kernel_hyperparameters",
           "kernel_matmul", "kernel_matrix", "make_kernel", "select_backend"]

_BASE_KERNELS = {
    "rbf": gpytorch.kernels.RBFKernel,
    "matern12": lambda **kw: gpytorch.kernels.MaternKernel(nu=0.5, **kw),
    "matern32": lambda **kw: gpytorch.kernels.MaternKernel(nu=1.5, **kw),
    "matern52": lambda **kw: gpytorch.kernels.MaternKernel(nu=2.5, **kw),
}
KERNELS = tuple(_BASE_KERNELS)

BACKENDS = ("auto", "eager", "fused", "compiled", "keops", "native", "triton", "composed")

AUTO_COMPILE_MIN_ENTRIES = 2**22
"""``auto`` compiles only products with at least this many kernel entries (n1·n2 per batch):
below it the one-off compilation (seconds) costs more than it saves."""

_NO_BATCH = torch.Size()
_MATERN_PROFILES = {0.5: "matern12", 1.5: "matern32", 2.5: "matern52"}


def is_expression(name: Any) -> bool:
    """Whether a ``kernel`` option is an expression rather than one of :data:`KERNELS` (or a
    kernel object)."""
    return isinstance(name, str) and name not in _BASE_KERNELS


def make_kernel(name: str = "matern32", num_dims: int = 1, *, ard: bool = True,
                batch_shape: torch.Size = _NO_BATCH) -> Kernel:
    """A scaled stationary kernel ``ScaleKernel(base(ard_num_dims=num_dims if ard))``, or the
    composition an expression describes (:func:`~gpscale.kernels.compose.build_kernel`; its
    leaves have their own ARD lengthscales, ``ard`` does not apply).

    Args:
        name: one of ``KERNELS``, or a kernel expression (:mod:`gpscale.kernels.algebra`).
        num_dims: input dimension d (one lengthscale per dimension when ``ard``).
        ard: automatic relevance determination (a lengthscale per input dimension).
        batch_shape: kernel batch shape, e.g. ``torch.Size([C])`` for C independent GPs.

    Raises:
        KernelSyntaxError: an expression that does not parse (a ``ValueError``).
        ValueError: columns outside the inputs.
    """
    if is_expression(name):
        return build_kernel(parse_kernel(name), num_dims, batch_shape=batch_shape)
    base = _BASE_KERNELS[name](ard_num_dims=num_dims if ard else None, batch_shape=batch_shape)
    return gpytorch.kernels.ScaleKernel(base, batch_shape=batch_shape)


def kernel_matrix(kernel: Kernel, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """Dense kernel matrix K(x1, x2) as a plain tensor (..., n1, n2), differentiable.

    A kernel :func:`kernel_hyperparameters` recognises: one autograd node
    (:func:`~gpscale.linalg.stationary.stationary_matrix`) on inputs centred within reach
    (:func:`~gpscale.linalg.reach.centre`), so no row changes another's values.
    Others: GPyTorch with ``x2`` first (it centres on its first argument; x2 is the reference
    set, training or inducing points, in this package's calls)."""
    hp = kernel_hyperparameters(kernel)
    if hp is None or x1.dim() < 2 or x2.dim() < 2:
        return kernel(x1, x2).to_dense() if x1 is x2 else kernel(x2, x1).to_dense().mT
    z1, z2, _, batch, keep1, keep2 = _scaled_inputs(hp, x1, x2, x1[..., :1])
    z1, z2, exact = fused.exact_last(z1, z2)
    K = stationary_matrix(z1, z2, hp.outputscale.expand(batch).reshape(-1), hp.profile,
                          exact=exact, symmetric=x1 is x2)  # (B, n1, n2)
    if keep1 is not None:  # pairs beyond reach: exactly 0
        K = K * (keep1[:, :, None] & keep2[:, None, :])
    return K.reshape(*batch, *K.shape[-2:])


def dense_kernel_matrix(kernel: Kernel, x: Float[Tensor, "n d"],
                        rows: int = 512) -> Float[Tensor, "n n"]:
    """K(x, x) as a plain (n, n) tensor, without gradients: in C on the CPU where
    :func:`~gpscale.linalg.native.suits_dense`, else row blocks of the fused profiles written
    into the result (compiled for large n on the CPU), or through GPyTorch for kernels
    :func:`kernel_hyperparameters` does not recognise. Never a second n × n temporary."""
    hp = kernel_hyperparameters(kernel)
    n = x.shape[-2]
    with torch.no_grad():
        if hp is None or x.dim() != 2 or hp.outputscale.dim() != 0:
            return torch.cat([kernel_matrix(kernel, x[r:r + rows], x)
                              for r in range(0, n, rows)], dim=-2)
        z1, z2, _, _, _, _ = _scaled_inputs(hp, x, x, x[:, :1])
        if native.suits_dense(x):
            return native.kernel_matrix(hp.profile, z1[0]).mul_(hp.outputscale)
        z1, z2, exact = fused.exact_last(z1, z2)
        value = fused.PROFILES[hp.profile][0]
        if x.device.type == "cpu" and n * n >= AUTO_COMPILE_MIN_ENTRIES:
            value = fused.compiled_profile(value)  # the tiles' compiled function, shared
        sq = fused.sq_norms(z2, exact)  # (1, n)
        K = x.new_empty(n, n)
        for r in range(0, n, rows):
            block = K[r:r + rows].unsqueeze(0)  # (1, c, n), a view written in place
            fused.inner_products(z1[:, r:r + rows], z2, block, exact)
            value(block, sq[:, r:r + rows, None], sq[:, None, :])
        return K.mul_(hp.outputscale)


def kernel_diag(kernel: Kernel, x: torch.Tensor) -> torch.Tensor:
    """Diagonal k(x_j, x_j) (n,) without forming the matrix."""
    return kernel(x, diag=True)


def inducing_factor(kernel: InducingPointKernel, x: Tensor) -> Tensor:
    """K(x, z) K_zz^{-1/2} (n, m) for GPyTorch's ``InducingPointKernel``: its cached inverse
    root of K_zz (the basis of its SGPR prediction caches), K(x, z) from :func:`kernel_matrix`
    (GPyTorch's own centres on x, the test batch)."""
    return kernel_matrix(kernel.base_kernel, x, kernel.inducing_points) @ kernel._inducing_inv_root


@dataclass(frozen=True)
class KernelHyperparameters:
    """A stationary kernel ``outputscale · φ(‖(x − x')/lengthscale‖²)`` in plain tensors.

    Attributes:
        profile: a key of :data:`gpscale.linalg.fused.PROFILES` ('rbf', 'matern12', ...).
        lengthscale: ``(*batch, 1, d)`` with ARD, else ``(*batch, 1, 1)``; differentiable.
        outputscale: ``(*batch,)``; ones for an unscaled base kernel; differentiable.
    """

    profile: str
    lengthscale: Tensor
    outputscale: Tensor


def kernel_hyperparameters(kernel: Kernel) -> KernelHyperparameters | None:
    """Profile, lengthscale and outputscale of ``[ScaleKernel](RBF | Matérn)``, else None.

    Only the exact GPyTorch classes qualify (subclasses may override ``forward``), without
    ``active_dims``.
    """
    outputscale = None
    if type(kernel) is ScaleKernel and kernel.active_dims is None:
        kernel, outputscale = kernel.base_kernel, kernel.outputscale
    if kernel.active_dims is not None:
        return None
    if type(kernel) is RBFKernel:
        profile = "rbf"
    elif type(kernel) is MaternKernel and kernel.nu in _MATERN_PROFILES:
        profile = _MATERN_PROFILES[kernel.nu]
    else:
        return None
    lengthscale = kernel.lengthscale
    if outputscale is None:
        outputscale = torch.ones(lengthscale.shape[:-2], dtype=lengthscale.dtype,
                                 device=lengthscale.device)
    return KernelHyperparameters(profile, lengthscale, outputscale)


def select_backend(kernel: Kernel, x1: Tensor, x2: Tensor, backend: str = "auto") -> str:
    """The backend ``kernel_matmul`` uses; resolves ``'auto'`` by a fixed rule.

    Rule for ``'auto'``: 'eager' when :func:`kernel_hyperparameters` does not recognise the
    kernel; otherwise on CUDA 'triton' where Triton is installed (it comes with torch's CUDA
    builds), else 'keops' when pykeops is installed, else 'compiled'; on the CPU,
    for a product of at least :data:`AUTO_COMPILE_MIN_ENTRIES` entries, 'native' where it is
    available and d ≤ :data:`~gpscale.linalg.native.DENSE_MAX_DIMS` (it runs 'compiled' when a
    gradient is needed), else 'compiled'; smaller CPU products 'fused'; other devices 'fused'. A
    failing ``torch.compile`` falls back to the uncompiled fused path with one warning.

    Args:
        kernel: any GPyTorch kernel.
        x1: (..., n1, d).
        x2: (..., n2, d).
        backend: one of :data:`BACKENDS`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if kernel_hyperparameters(kernel) is None:
        plain = x1.dim() == 2 and x2.dim() == 2 and composed_terms(kernel) is not None
        return "composed" if plain else "eager"
    if x1.device.type == "cuda":
        if triton.available(x1):
            return "triton"
        return "keops" if importlib.util.find_spec("pykeops") is not None else "compiled"
    if x1.device.type == "cpu" and x1.shape[-2] * x2.shape[-2] >= AUTO_COMPILE_MIN_ENTRIES:
        return "native" if native.suits_dense(x1) else "compiled"
    return "fused"


def kernel_matmul(kernel: Kernel, x1: Float[Tensor, "*b n1 d"], x2: Float[Tensor, "*b n2 d"],
                  rhs: Float[Tensor, "*b n2 k"] | Float[Tensor, " n2"], *,
                  chunk_size: int | None = None,
                  backend: str = "auto") -> Float[Tensor, "*b n1 k"] | Float[Tensor, "*b n1"]:
    """``K(x1, x2) @ rhs`` without forming K, differentiable in every input and hyperparameter.

    At most ``chunk_size × n2`` kernel entries (times the batch size) exist at a time, in the
    forward and in the backward pass. Batched kernels (``batch_shape`` (b,)) take ``rhs`` of
    shape (b, n2, k) or a broadcastable one.

    Args:
        kernel: a GPyTorch kernel; 'fused', 'compiled' and 'keops' need a kernel
            :func:`kernel_hyperparameters` recognises.
        x1: row inputs (..., n1, d).
        x2: column inputs (..., n2, d).
        rhs: right-hand sides (..., n2, k) or a vector (n2,).
        chunk_size: rows of ``x1`` per chunk. Default: 'eager' fills
            :data:`gpscale.linalg.chunked.DEFAULT_MAX_KERNEL_ENTRIES` entries per chunk; the
            fused paths take :func:`gpscale.linalg.fused.default_rows` rows and split the
            columns into tiles of at most :func:`gpscale.linalg.fused.tile_entries` entries
            (cache-sized on the CPU, larger on a GPU).
        backend: one of :data:`BACKENDS` (see the module docstring and :func:`select_backend`).

    Returns:
        (..., n1, k), or (..., n1) for a vector ``rhs``; dtype and device of the inputs.

    Raises:
        ValueError: mismatched shapes, an unknown backend, or a kernel the backend cannot run.
        ImportError: ``backend='keops'`` without pykeops installed.
    """
    vector = rhs.dim() == 1
    rhs = rhs.unsqueeze(-1) if vector else rhs
    if x1.shape[-1] != x2.shape[-1] or rhs.shape[-2] != x2.shape[-2]:
        raise ValueError(f"kernel_matmul needs x1 (..., n1, d), x2 (..., n2, d) and rhs "
                         f"(..., n2, k) or (n2,); got x1 {tuple(x1.shape)}, x2 "
                         f"{tuple(x2.shape)}, rhs {tuple(rhs.shape)}")
    name = select_backend(kernel, x1, x2, backend)
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2], rhs.shape[:-2], kernel.batch_shape)
    chunk = chunk_size or _default_chunk(name, x2.shape[-2] * batch.numel(), x1)
    out = _BACKENDS[name](kernel, x1, x2, rhs, chunk)
    return out.squeeze(-1) if vector else out


def _default_chunk(backend: str, num_entries_per_row: int, like: Tensor) -> int:
    if backend in ("fused", "compiled", "native"):  # these tile both axes: ≤ tile_entries at a time
        return fused.default_rows(like)
    return default_chunk_size(num_entries_per_row)


def _eager(kernel: Kernel, x1: Tensor, x2: Tensor, rhs: Tensor, chunk: int) -> Tensor:
    params = tuple(p for p in kernel.parameters() if p.requires_grad)
    rule = autograd_rule(lambda a, b, v: kernel(b, a).to_dense().mT @ v, params)
    return chunked_product(rule, x1, x2, rhs, chunk_size=chunk)


def _composed(kernel: Kernel, x1: Tensor, x2: Tensor, rhs: Tensor, chunk: int) -> Tensor:
    terms = composed_terms(kernel)
    if terms is None or x1.dim() != 2 or x2.dim() != 2 or rhs.dim() != 2:
        raise ValueError("backend 'composed' takes a sum of scaled products of RBF / Matérn "
                         "kernels on column groups (a kernel expression of stationary leaves) "
                         "and 2-D inputs; use backend='eager' or 'auto'")
    return composed_matmul(terms, x1, x2, rhs)


def _require_hyperparameters(kernel: Kernel, backend: str) -> KernelHyperparameters:
    if (hp := kernel_hyperparameters(kernel)) is None:
        raise ValueError(f"backend {backend!r} supports ScaleKernel(RBFKernel | MaternKernel) "
                         f"without active_dims; got {type(kernel).__name__}. Use "
                         "backend='eager' (any kernel) or 'auto'.")
    return hp


def _scaled_inputs(hp: KernelHyperparameters, x1: Tensor, x2: Tensor, rhs: Tensor):
    """:func:`gpscale.linalg.products.scaled_inputs` with the kernel's hyperparameters."""
    return products.scaled_inputs(hp.lengthscale, hp.outputscale.shape, x1, x2, rhs)


def _stationary(name: str):
    """The backend ``name`` of :func:`gpscale.linalg.products.stationary_matmul`."""
    def run(kernel: Kernel, x1: Tensor, x2: Tensor, rhs: Tensor, chunk: int) -> Tensor:
        hp = _require_hyperparameters(kernel, name)
        return products.stationary_matmul(name, hp.profile, hp.lengthscale, hp.outputscale,
                                          x1, x2, rhs, chunk)
    return run


def kernel_block_sparse_matmul(kernel: Kernel, x: Float[Tensor, "n d"],
                               actions: BlockSparseActions, *,
                               x_rows: Float[Tensor, "t d"] | None = None,
                               chunk_size: int | None = None,
                               backend: str = "auto") -> Float[Tensor, "t i"]:
    """``K(x_rows, x) @ S`` for block-sparse actions S (n, i), matrix-free and differentiable.

    With ``x_rows=None`` the training product K(x, x) S: for a kernel
    :func:`kernel_hyperparameters` recognises, on the CPU the native row kernels
    (:func:`gpscale.linalg.native.symmetric_block_sparse_product`: no tile stored, so
    faster than tiles that are), else
    :func:`~gpscale.linalg.operators.block_sparse.symmetric_kernel_product` (tiles of at most
    ``chunk_size²`` entries, each off-diagonal one used twice, recomputed in backward); on CUDA
    the Triton kernels (:func:`gpscale.linalg.triton.block_sparse_product`).
    With ``x_rows`` (prediction): :func:`kernel_block_sparse_rect_matmul`. Other
    kernels, or 'eager': row chunks of ``K(x_rows, x)`` (at most ``chunk_size × n`` entries,
    forward and backward) reduced block by block. No n × n tensor exists in any case.

    Args:
        kernel: a GPyTorch kernel without batch shape.
        x: (n, d) the inputs the actions act on (data order).
        actions: S, with ``actions.layout.num_points == n``.
        x_rows: (t, d) row inputs, or ``None`` for ``x`` itself (symmetric training product).
        chunk_size: rows per chunk (span); default :func:`gpscale.linalg.fused.span_rows`
            (``DEFAULT_SPAN_ROWS`` on the CPU) for the symmetric product,
            ``DEFAULT_MAX_KERNEL_ENTRIES / n`` rows otherwise.
        backend: one of :data:`BACKENDS`; 'keops' (no block reduction there) runs 'compiled',
            'eager' always takes the row-chunked GPyTorch path; 'auto' on the CPU 'native'
            where it is available.

    Returns:
        (t, i), or (n, i) for ``x_rows=None``, rows in data order.

    Raises:
        ValueError: shapes that do not match, a batched kernel, or an unknown backend.
    """
    if actions.transposed or actions.layout.num_points != x.shape[-2] or x.dim() != 2:
        raise ValueError(f"kernel_block_sparse_matmul needs x (n, d) and actions (n, i); got x "
                         f"{tuple(x.shape)} and actions {tuple(actions.shape)}")
    if kernel.batch_shape != _NO_BATCH:
        raise ValueError("kernel_block_sparse_matmul supports kernels without batch_shape; got "
                         f"{tuple(kernel.batch_shape)}")
    name = _block_sparse_backend(kernel, x, x, backend)
    if name == "eager":
        return _block_sparse_rows(kernel, x if x_rows is None else x_rows, x, actions,
                                  chunk_size)
    if x_rows is not None:  # prediction: fused rectangular tiles
        return kernel_block_sparse_rect_matmul(kernel, x, actions, x_rows=x_rows,
                                               chunk_size=chunk_size, backend=backend)
    hp = _require_hyperparameters(kernel, name)
    z, _, _, _, _, _ = _scaled_inputs(hp, x, x, x[..., :1])
    values = hp.outputscale * actions.values  # c Φ S = Φ (c S): n products, not n · i
    if name == "native":  # C row kernels; distances from differences, `exact` is moot
        zb = z[0][actions.index]
        return actions.to_data_order(native.symmetric_block_sparse_product(
            hp.profile, zb, values, actions.layout))
    z, _, exact = fused.exact_last(z, z)
    zb = z[0][actions.index]
    if name == "triton":  # one kernel entry per pair, the blocks reduced on chip
        out = triton.block_sparse_product(hp.profile, zb, zb, values, actions.layout, exact)
    else:
        out = symmetric_kernel_product(hp.profile, zb, values, actions.layout,
                                       compiled=name != "fused",
                                       chunk_size=chunk_size or fused.span_rows(z), exact=exact)
    return actions.to_data_order(out)  # from block order


def kernel_block_sparse_rect_matmul(kernel: Kernel, x: Float[Tensor, "n d"],
                                    actions: BlockSparseActions, *,
                                    rows: Tensor | None = None,
                                    x_rows: Float[Tensor, "t d"] | None = None,
                                    chunk_size: int | None = None,
                                    backend: str = "auto") -> Float[Tensor, "t i"]:
    """``K(x[rows], x) @ S`` or ``K(x_rows, x) @ S`` for block-sparse S, fused and matrix-free.

    For a shard of the training rows or for other points. A kernel
    :func:`kernel_hyperparameters` recognises runs
    :func:`~gpscale.linalg.operators.block_sparse_rect.rectangular_kernel_product` (tiles of at
    most ``chunk_size²`` entries, reduced block by block, recomputed in backward; t · n kernel
    evaluations); with ``rows`` a row's distance to its own column is exactly 0. Otherwise
    ('eager') GPyTorch row chunks as in :func:`kernel_block_sparse_matmul`. No t × n tensor.

    Args:
        kernel: a GPyTorch kernel without batch shape.
        x: (n, d) the inputs the actions act on (data order).
        actions: S, with ``actions.layout.num_points == n``.
        rows: (t,) integer indices of rows of ``x`` (data order); or
        x_rows: (t, d) row inputs. Exactly one of the two.
        chunk_size: rows per chunk and columns per span; default
            :func:`gpscale.linalg.fused.span_rows` on the fused paths,
            ``DEFAULT_MAX_KERNEL_ENTRIES / n`` rows on the eager one.
        backend: one of :data:`BACKENDS`; 'keops' runs 'compiled'; 'auto' as
            :func:`select_backend` decides for the (t, n) product.

    Returns:
        (t, i), gradients flow to ``x``, ``x_rows``, the kernel hyperparameters and the values.

    Raises:
        ValueError: not exactly one of ``rows``/``x_rows``, mismatched shapes, a batched kernel,
            or an unknown backend.
    """
    if (rows is None) == (x_rows is None):
        raise ValueError("kernel_block_sparse_rect_matmul needs exactly one of rows (t,) "
                         "indices into x or x_rows (t, d)")
    if actions.transposed or x.dim() != 2 or actions.layout.num_points != x.shape[-2]:
        raise ValueError(f"kernel_block_sparse_rect_matmul needs x (n, d) and actions (n, i); "
                         f"got x {tuple(x.shape)} and actions {tuple(actions.shape)}")
    if kernel.batch_shape != _NO_BATCH:
        raise ValueError("kernel_block_sparse_rect_matmul supports kernels without batch_shape;"
                         f" got {tuple(kernel.batch_shape)}")
    if rows is not None and (rows.dim() != 1 or rows.is_floating_point()):
        raise ValueError(f"rows must be a 1-D integer tensor; got {rows.dtype} {rows.shape}")
    if x_rows is not None and (x_rows.dim() != 2 or x_rows.shape[-1] != x.shape[-1]):
        raise ValueError(f"x_rows must be (t, {x.shape[-1]}); got {tuple(x_rows.shape)}")
    points = x[rows] if x_rows is None else x_rows
    name = _block_sparse_backend(kernel, points, x, backend)
    if name == "eager":
        return _block_sparse_rows(kernel, points, x, actions, chunk_size)
    hp = _require_hyperparameters(kernel, name)
    z_rows, z, _, _, keep_rows, keep = _scaled_inputs(hp, points, x, x[..., :1])
    values = actions.values if keep is None else actions.values * keep[0][actions.index]
    if name == "native":
        if not (torch.is_grad_enabled() and any(
                t.requires_grad for t in (z_rows, z, actions.values))):
            out = native.block_sparse_forward(
                hp.profile, z[0][rows] if rows is not None else z_rows[0],
                z[0][actions.index], values, actions.layout)
            return hp.outputscale * reach.within_reach(out[None], keep_rows)[0]
        name = "compiled"  # the native rectangular product has no adjoint
    z_rows, z, exact = fused.exact_last(z_rows, z)
    if name == "triton" and rows is None:  # other points (prediction)
        out = triton.block_sparse_product(hp.profile, z_rows[0], z[0][actions.index], values,
                                          actions.layout, exact)
        return hp.outputscale * reach.within_reach(out[None], keep_rows)[0]
    position = None if rows is None else actions.inverse_index()[rows]  # block-order rows
    if rows is not None:
        z_rows = z[:, rows]  # the very same numbers as the columns (D² = 0 exactly on the pair)
    out = rectangular_kernel_product(hp.profile, z_rows[0], z[0][actions.index], values,
                                     actions.layout, rows_in_z=position,
                                     compiled=name != "fused",
                                     chunk_size=chunk_size or fused.span_rows(z), exact=exact)
    return hp.outputscale * reach.within_reach(out[None], keep_rows)[0]


def _block_sparse_backend(kernel: Kernel, x1: Tensor, x2: Tensor, backend: str) -> str:
    """:func:`select_backend` for the block-sparse products: on the CPU 'auto' takes 'native'
    where :func:`gpscale.linalg.native.suits_block_sparse` (else as ``select_backend``); 'native'
    where it is not available runs 'compiled' (after one warning saying why)."""
    name = select_backend(kernel, x1, x2, backend)
    if name == "composed":  # its block reduction is the row-chunked one
        return "eager"
    if backend == "auto" and name in ("fused", "compiled") and x1.device.type == "cpu":
        return "native" if native.suits_block_sparse(x1) else name
    if name == "native" and not native.available(x1):
        return "compiled"
    return name


def _block_sparse_rows(kernel: Kernel, x_rows: Tensor, x: Tensor, actions: BlockSparseActions,
                       chunk_size: int | None) -> Tensor:
    """Row chunks of K(x_rows, x[index]) reduced block by block (any kernel)."""
    layout = actions.layout
    params = tuple(p for p in kernel.parameters() if p.requires_grad)
    rule = autograd_rule(
        lambda a, b, v: layout.segment_sum(kernel(b, a).to_dense().mT * v[:, 0]), params)
    return chunked_product(rule, x_rows, x[actions.index], actions.values[:, None],
                           chunk_size=chunk_size or default_chunk_size(x.shape[-2]))


_BACKENDS = {"eager": _eager, "composed": _composed,
             **{name: _stationary(name) for name in products.BACKENDS}}

