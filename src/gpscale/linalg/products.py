r"""The stationary kernel products :math:`s \cdot \Phi(x_1/\ell, x_2/\ell) V` by backend.

:func:`stationary_matmul` takes the plain hyperparameters (profile name, lengthscale,
outputscale) that :func:`gpscale.kernels.kernel_hyperparameters` reads off a GPyTorch kernel.
It scales and centres the inputs within the kernel's reach (:mod:`gpscale.linalg.reach`), runs
one backend, and zeroes the rows and columns beyond reach:

| backend    | how                                                                   |
|------------|-----------------------------------------------------------------------|
| `fused`    | tiles of distance → profile → product in PyTorch (:mod:`.fused`)      |
| `compiled` | the same, elementwise part ``torch.compile``\ d                       |
| `native`   | C on the CPU without gradients (:mod:`.native`); else `compiled`      |
| `keops`    | one pykeops reduction (:mod:`.keops`)                                 |
| `triton`   | fused Triton kernels, forward and backward (:mod:`.triton`); on CUDA, |
|            | or on the CPU under ``TRITON_INTERPRET=1``; else `compiled`           |

Every backend computes the same numbers up to rounding and is differentiable in the inputs, V
and both hyperparameters (`native` only where nothing needs a gradient).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpscale.linalg import fused, keops, native, reach, triton
from gpscale.linalg.chunked import chunked_product

__all__ = ["BACKENDS", "scaled_inputs", "stationary_matmul"]

BACKENDS = ("fused", "compiled", "native", "keops", "triton")


def scaled_inputs(lengthscale: Tensor, batch_shape: torch.Size, x1: Tensor, x2: Tensor,
                  rhs: Tensor):
    """:func:`gpscale.linalg.reach.batched`: (B, n, d) inputs centred within reach, rhs, the
    batch shape and the within-reach masks (the caller zeroes the rest: ``within_reach``)."""
    if lengthscale.shape[-1] not in (1, x1.shape[-1]):
        raise ValueError(f"the kernel has {lengthscale.shape[-1]} lengthscales (ARD) but the "
                         f"inputs have {x1.shape[-1]} features")
    return reach.batched(x1, x2, rhs, lengthscale, batch_shape)


def stationary_matmul(backend: str, profile: str, lengthscale: Tensor, outputscale: Tensor,
                      x1: Tensor, x2: Tensor, rhs: Tensor, chunk: int) -> Tensor:
    """``outputscale · Φ(x1, x2) @ rhs`` (..., n1, k) by ``backend`` (see the module table).

    Args:
        backend: one of :data:`BACKENDS`.
        profile: ``'rbf'``, ``'matern12'``, ``'matern32'`` or ``'matern52'``.
        lengthscale: (..., 1, d) or (..., 1, 1).
        outputscale: (...) the kernel's batch shape.
        x1, x2, rhs: (..., n1, d), (..., n2, d), (..., n2, k).
        chunk: rows of ``x1`` per chunk of the tiled PyTorch backends.
    """
    if backend == "native" and not _native_applies(x1, x2, rhs, lengthscale, outputscale):
        backend = "compiled"  # the native product has no adjoint
    if backend == "triton" and not triton.available(x1):
        backend = "compiled"
    z1, z2, rhs3, batch, keep1, keep2 = scaled_inputs(lengthscale, outputscale.shape, x1, x2, rhs)
    rhs3 = reach.within_reach(rhs3, keep2)
    if backend == "native":  # x1 is x2 selects the symmetric product
        symmetric = x1 is x2
        out = torch.stack([native.dense_product(profile, z2[b] if symmetric else z1[b],
                                                None if symmetric else z2[b], rhs3[b])
                           for b in range(rhs3.shape[0])])
    elif backend == "keops":  # KeOps tiles on its own
        out = keops.product(profile, z1, z2, rhs3)
    else:
        z1, z2, exact = fused.exact_last(z1, z2)
        if backend == "triton":  # x1 is x2: one backward pass for both roles of z
            out = triton.stationary_product(profile, z1, z1 if x1 is x2 else z2, rhs3, exact,
                                            symmetric=x1 is x2)
        else:
            rule = fused.stationary_rule(profile, compiled=backend == "compiled", exact=exact)
            out = chunked_product(rule, z1, z2, rhs3, chunk_size=chunk)
    out = reach.within_reach(out, keep1)  # (B, n1, k)
    return outputscale[..., None, None] * out.reshape(*batch, *out.shape[-2:])


def _native_applies(x1: Tensor, x2: Tensor, rhs: Tensor, *params: Tensor) -> bool:
    """Whether the native C product can run: CPU float inputs of one dtype, where no input or
    hyperparameter needs a gradient."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x1, x2, rhs, *params))
    return (not needs_grad and native.available(x1) and x2.dtype == x1.dtype
            and rhs.dtype == x1.dtype)
