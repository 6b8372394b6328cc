r"""The convolutional kernel and its inducing patches (inter-domain features).

Convolutional GP (van der Wilk, Rasmussen & Hensman 2017; notes/004_solvegp.md §2.12): a patch
GP g ~ GP(0, k_g) on patch vectors, and f(x) = Σ_p w_p g(x^[p]) over the P patches of image x with
learned weights w. Its inducing variables are values of g at inducing patches z (a different
domain from the images), so that

- K_uu[i, j] = k_g(z_i, z_j),
- K_uf[i, j] = Cov[g(z_i), f(x_j)] = Σ_p w_p k_g(z_i, x_j^[p]),
- K_ff[j, j] = Σ_{p,p'} w_p w_p' k_g(x_j^[p], x_j^[p']).

With ``location_kernel`` (TICK, Dutordoir, van der Wilk, Artemev & Hensman 2020, as SOLVE-GP's
CIFAR-10 runs) g also takes the patch's location l on the grid of patch positions, with
k((z, l), (z', l')) = k_g(z, z') · k_ℓ(l, l'), k_ℓ a Matérn-3/2 kernel of its own lengthscale; an
inducing input is then a patch and a location, and every sum above gains the factor k_ℓ. A
translated digit keeps most of its evidence (k_ℓ is near 1 for nearby positions) while the
model still knows where in the image a patch lies.

Memory. K_uf needs k_g at every (inducing patch, image patch) pair, m·b·P numbers for a batch of
b images, and K_ff's double sum b·P² numbers; both are computed in blocks of images sized so
that a block holds at most :data:`BLOCK_ENTRIES` kernel values, and, under autograd, each block
is recomputed in the backward pass instead of kept (``torch.utils.checkpoint``), so memory does
not grow with the batch. The patch kernel itself goes through :func:`gpscale.kernels.kernel_matrix`
(one fused node for the stationary profiles).
"""

from __future__ import annotations

from collections.abc import Callable

import gpytorch
import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from gpscale.kernels import kernel_matrix
from gpscale.methods.solvegp.images import PatchGeometry

__all__ = ["BLOCK_ENTRIES", "ConvKernel"]

BLOCK_ENTRIES = 1 << 23
"""Most kernel values one block of images holds (64 MiB in float64)."""
FLOAT32_SAFE = 1e18
"""Patches larger than this in float32 are compared in float64: the squared distances of the
kernel's matrix products would overflow to inf − inf."""


def _safe(patches: Tensor) -> Tensor:
    """``patches`` in a dtype whose squared distances stay finite."""
    if patches.dtype == torch.float32 and bool(patches.abs().amax() > FLOAT32_SAFE):
        return patches.double()
    return patches


class ConvKernel(nn.Module):
    """The (weighted, optionally translation-insensitive) convolutional kernel on flattened
    images, with the covariances of its inducing patches.

    Args:
        patch_kernel: GPyTorch kernel on patch vectors (C·patch² numbers), e.g.
            ``ScaleKernel(RBFKernel())``.
        geometry: how images are cut into patches.
        location_kernel: ``True`` for TICK: a Matérn-3/2 kernel on patch locations multiplies
            the patch kernel, and inducing inputs carry a location in their last two columns.
        location_lengthscale: initial lengthscale of the location kernel, in patch positions.

    Inducing inputs ``w`` are (L, m, q) with q = C·patch² (+ 2 with TICK).
    """

    def __init__(self, patch_kernel: gpytorch.kernels.Kernel, geometry: PatchGeometry, *,
                 location_kernel: bool = False, location_lengthscale: float = 3.0):
        super().__init__()
        self.patch_kernel = patch_kernel
        self.geometry = geometry
        P = geometry.num_patches
        self.weights = nn.Parameter(torch.full((P,), 1.0 / P))
        self.location_kernel = None
        if location_kernel:
            self.location_kernel = gpytorch.kernels.MaternKernel(nu=1.5)
            self.location_kernel.lengthscale = location_lengthscale

    @property
    def inducing_dims(self) -> int:
        """q: numbers per inducing input (a patch, and a location with TICK)."""
        return self.geometry.patch_dims + (2 if self.location_kernel is not None else 0)

    # -- the three covariances of the inter-domain model -----------------------------------------
    def inducing_covariance(self, w: Tensor) -> Tensor:
        """K_uu (L, m, m) of inducing inputs ``w`` (L, m, q)."""
        z, loc = self._split(w)
        K = kernel_matrix(self.patch_kernel, z, z)
        if loc is not None:
            K = K * kernel_matrix(self.location_kernel, loc, loc)
        return K

    def cross_covariance(self, w: Tensor, x: Tensor) -> Tensor:
        """K_uf (L, m, b) between inducing inputs ``w`` (L, m, q) and images ``x`` (b, d)."""
        z, loc = self._split(w)
        per_image = z.shape[-2] * self.geometry.num_patches * z.shape[0]
        return self._blocks(lambda xb: self._cross_block(z, loc, xb), x, per_image, dim=-1)

    def prior_variance(self, x: Tensor) -> Tensor:
        """diag K_ff (b,) of images ``x`` (b, d): the double sum over patch pairs."""
        P = self.geometry.num_patches
        return self._blocks(self._diag_block, x, P * P, dim=0)

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        """K_ff (b1, b2) between two sets of images: Σ_{p,p'} w_p w_p' k(x1^[p], x2^[p'])
        (× k_ℓ with TICK). Dense, for tests and small problems; the model never needs it."""
        g = self.geometry
        p1, p2 = g.patches(x1), g.patches(x2)
        b1, b2, P = p1.shape[0], p2.shape[0], g.num_patches
        K = kernel_matrix(self.patch_kernel, p1.reshape(b1 * P, -1), p2.reshape(b2 * P, -1))
        W = self._pair_weights(p1)
        return torch.einsum("apbq,pq->ab", K.reshape(b1, P, b2, P).to(W.dtype), W)

    # -- helpers ------------------------------------------------------------------------------
    def _split(self, w: Tensor) -> tuple[Tensor, Tensor | None]:
        if w.shape[-1] != self.inducing_dims:
            what = "patch and location" if self.location_kernel is not None else "patch"
            raise ValueError(f"inducing inputs of {w.shape[-1]} numbers; this kernel's have "
                             f"{self.inducing_dims} ({what})")
        if self.location_kernel is None:
            return w, None
        return w[..., :-2], w[..., -2:]

    def _cross_block(self, z: Tensor, loc: Tensor | None, x: Tensor) -> Tensor:
        g = self.geometry
        patches = g.patches(x).to(z.dtype)  # (b, P, p)
        b, P = patches.shape[:2]
        flat = patches.reshape(1, b * P, -1).expand(z.shape[0], b * P, patches.shape[-1])
        K = kernel_matrix(self.patch_kernel, z, flat).reshape(*z.shape[:-1], b, P)
        weights = self.weights.to(K.dtype)
        if loc is None:
            return K @ weights  # (L, m, b)
        weighted = kernel_matrix(self.location_kernel, loc,
                                 g.locations(z).expand(loc.shape[0], P, 2)) * weights  # (L, m, P)
        return (K @ weighted[..., None])[..., 0]

    def _pair_weights(self, like: Tensor) -> Tensor:
        """W (P, P) with diag K_ff[j] = Σ_{p,p'} k_g(x_j^[p], x_j^[p']) W[p, p']: the outer
        product of the weights (times k_ℓ between patch locations with TICK), shared by all
        images, so that each image's double sum is one inner product with its patch Gram."""
        w = self.weights
        W = w[:, None] * w[None, :]
        if self.location_kernel is not None:
            locs = self.geometry.locations(like)
            W = W * kernel_matrix(self.location_kernel, locs, locs).to(w.dtype)
        return W

    def _diag_block(self, x: Tensor) -> Tensor:
        patches = _safe(self.geometry.patches(x).to(self.weights.dtype))  # (b, P, p)
        K = kernel_matrix(self.patch_kernel, patches, patches)  # (b, P, P)
        W = self._pair_weights(patches)
        return K.to(W.dtype).flatten(1) @ W.flatten()

    def _blocks(self, compute: Callable[[Tensor], Tensor], x: Tensor, per_image: int,
                dim: int) -> Tensor:
        """``compute`` on blocks of the images, concatenated along ``dim``; under autograd each
        block is recomputed in the backward pass rather than kept."""
        size = max(1, BLOCK_ENTRIES // max(per_image, 1))
        parts = []
        for start in range(0, x.shape[0], size):
            block = x[start:start + size]
            if torch.is_grad_enabled():
                parts.append(checkpoint(compute, block, use_reentrant=False))
            else:
                parts.append(compute(block))
        if not parts:
            return compute(x)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim)
