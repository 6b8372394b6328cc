"""Kernel products from held distances, differentiable in the hyperparameters.

A kernel-learning round evaluates K_θ(X, X) V for the same X and V under many θ (each L-BFGS
trial). For a shared isotropic stationary kernel k = s φ(‖x − x'‖ / ℓ) the distances do not
depend on θ: they are computed once (n × n) and each product is an elementwise pass per block
of rows and a GEMM, instead of n² kernel evaluations in d dimensions (MNIST: d = 784). Where a
gradient is wanted the same pass also forms (∂K/∂ℓ) V, so the backward pass is two inner
products. V is a constant (no gradient flows to it).

From :data:`FLOAT32_MIN_ROWS` points the distances, profiles and GEMMs run in float32: float64
GEMMs are 2.4x slower on this machine, and the products' rounding (~1e-7 relative) is far below
the Monte Carlo error of the variational objective they serve. θ and the results stay in the
caller's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from gpscale.kernels import AUTO_COMPILE_MIN_ENTRIES, kernel_hyperparameters
from gpscale.linalg import fused

__all__ = ["FLOAT32_MIN_ROWS", "held_distance_matmul"]

_SQRT3, _SQRT5 = math.sqrt(3), math.sqrt(5)
FLOAT32_MIN_ROWS = 2048
"""From this many points the products run in float32."""


def _held_rbf(d: Tensor, ell: Tensor) -> tuple[Tensor, Tensor]:
    u = d / ell
    phi = torch.exp(-0.5 * u * u)
    return phi, -u * u * phi


def _held_matern12(d: Tensor, ell: Tensor) -> tuple[Tensor, Tensor]:
    u = d / ell
    e = torch.exp(-u)
    return e, -u * e


def _held_matern32(d: Tensor, ell: Tensor) -> tuple[Tensor, Tensor]:
    u = _SQRT3 * d / ell
    e = torch.exp(-u)
    return (1 + u) * e, -u * u * e


def _held_matern52(d: Tensor, ell: Tensor) -> tuple[Tensor, Tensor]:
    u = _SQRT5 * d / ell
    e = torch.exp(-u)
    return (1 + u + u * u / 3) * e, -(u * u / 3) * (1 + u) * e


_HELD_PROFILES = {"rbf": _held_rbf, "matern12": _held_matern12, "matern32": _held_matern32,
                  "matern52": _held_matern52}
"""Profile → (d, ℓ) ↦ (φ(u), u φ'(u)) at the distances d, u = a d / ℓ (the :mod:`~gpscale.linalg.
fused` profiles' a): ∂K/∂ℓ = −(s / ℓ) u φ'(u). One elementwise pass each when compiled."""


class _HeldDistanceProduct(torch.autograd.Function):
    """s φ(D / ℓ) V from held distances D, a block of rows at a time; with ``slopes`` the
    forward also forms (∂K/∂ℓ) V, so the backward is two inner products (no n × n work)."""

    @staticmethod
    def forward(ctx, lengthscale, outputscale, D, V, name, rows, slopes):
        # D and V may be float32 (:meth:`LatentKernel.learning_matmul`); θ and results not
        out = V.new_empty(D.shape[0], V.shape[1])
        d_ell = torch.empty_like(out) if slopes else None
        profile = _HELD_PROFILES[name]
        if D.device.type == "cpu" and D.numel() >= AUTO_COMPILE_MIN_ENTRIES:
            profile = fused.compiled_profile(profile)  # one pass over each block
        ell = lengthscale.to(D.dtype)
        for r in range(0, D.shape[0], rows):
            phi, slope_u = profile(D[r:r + rows], ell)
            out[r:r + rows] = phi @ V
            if slopes:
                d_ell[r:r + rows] = slope_u @ V
        out = outputscale * out.to(outputscale.dtype)
        if slopes:  # ∂K/∂ℓ = −(s / ℓ) u φ'(u)
            d_ell = (-outputscale / lengthscale) * d_ell.to(outputscale.dtype)
        ctx.save_for_backward(out, d_ell, outputscale)
        return out

    @staticmethod
    def backward(ctx, grad):
        out, d_ell, outputscale = ctx.saved_tensors
        if d_ell is None:
            raise RuntimeError("the held-distance product was formed without its slopes")
        return ((grad * d_ell).sum(), (grad * out).sum() / outputscale, None, None, None,
                None, None)



def held_distance_matmul(kernel: Kernel, x: Tensor, rows: int = 1024
                         ) -> Callable[[Tensor], Tensor] | None:
    """V (L, n, k) ↦ K_θ(x, x) V with one shared kernel for the L blocks, from distances held
    for the call's lifetime; ``None`` unless ``kernel`` is a scaled isotropic RBF/Matérn
    (:func:`~gpscale.kernels.kernel_hyperparameters`) with one lengthscale, so never for a
    kernel expression (a composition, whose leaves carry ``active_dims``). Memory: the n × n
    distances (float32 from :data:`FLOAT32_MIN_ROWS` points) and one block of ``rows``."""
    hp = kernel_hyperparameters(kernel)
    if hp is None or hp.lengthscale.numel() != 1 or hp.outputscale.numel() != 1:
        return None
    n = x.shape[0]
    work = torch.float32 if n >= FLOAT32_MIN_ROWS else x.dtype
    with torch.no_grad():
        D = torch.cdist(x, x, compute_mode="use_mm_for_euclid_dist").fill_diagonal_(0).to(work)

    def product(V: Tensor) -> Tensor:
        L, _, k = V.shape
        now = kernel_hyperparameters(kernel)  # θ as it is at this call
        ell, scale = now.lengthscale.reshape(()), now.outputscale.reshape(())
        slopes = torch.is_grad_enabled() and (ell.requires_grad or scale.requires_grad)
        flat = V.detach().to(work).permute(1, 0, 2).reshape(n, L * k)
        out = _HeldDistanceProduct.apply(ell, scale, D, flat, now.profile, rows, slopes)
        return out.to(V.dtype).reshape(n, L, k).permute(1, 0, 2)

    return product
