r"""Matrix-free products with a composed stationary kernel: a sum of terms, each an output scale
times a product of RBF / Matérn profiles on groups of input columns,

.. math::
    K(x, x') = \sum_t s_t \prod_{l \in t} φ_l\big(‖(x_{c_l} − x'_{c_l}) / ℓ_l‖²\big).

GPyTorch evaluates such a kernel term by term, each a dense block of its own, then sums them;
here every tile of K is built once — each leaf's distances on its columns, its profile, the
products and the weighted sum formed in the tile — and multiplied into the right-hand sides at
once, so the cost over a single kernel on all the columns is the extra profiles, not extra
products. K is never stored. The forward runs

- natively (:func:`gpscale.linalg.native.composed_product`) on CPU float32/float64 inputs when
  the C kernels are available and the leaves' columns number at most
  :data:`~gpscale.linalg.native.DENSE_MAX_DIMS` in all: each leaf's scaled columns gathered side
  by side, C panels of kernel values multiplied into the right-hand sides by vector
  micro-kernels, all rows in one call (symmetric, each off-diagonal pair evaluated once, for
  ``x1 is x2``);
- otherwise as compiled tiles of at most :func:`~gpscale.linalg.fused.tile_entries` entries:
  one inner-product GEMM per leaf, its profile in place, then one GEMM with the right-hand
  sides.

Gradients (inputs, right-hand sides, lengthscales, output scales) are a hand-written
vector-Jacobian product (:func:`gpscale.linalg.composed_grad.composed_vjp`), tile by tile,
whichever forward ran: the right-hand sides' by this forward with rows and columns swapped,
the rest from the adjoint of each tile of K. :func:`dense_tile` is the dense twin, K(a, b)
differentiable under autograd, that the tests hold the product and its gradients to.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from gpscale.linalg import composed_grad, fused, native
from gpscale.linalg.chunked import ChunkRule, chunked_product
from gpscale.linalg.composed_grad import ComposedLeaf, ComposedTerm

__all__ = ["ComposedLeaf", "ComposedTerm", "composed_matmul", "dense_tile", "native_applies"]


EXACT_DIMS = 3
"""Groups of at most this many columns take their distances from differences (exact, 0 at
coincident points, as the profiles' kinks at 0 need); wider ones from one GEMM."""


def _sqdist(a: Tensor, b: Tensor) -> Tensor:
    """‖a_i − b_j‖² (c, w), clamped at 0."""
    if a.shape[-1] <= EXACT_DIMS:
        sq = (a[:, None, 0] - b[None, :, 0]).square()
        for j in range(1, a.shape[-1]):
            sq = sq + (a[:, None, j] - b[None, :, j]).square()
        return sq
    sq = (a * a).sum(-1)[:, None] + (b * b).sum(-1)[None, :] - 2.0 * a @ b.T
    return sq.clamp_min(0.0)


_VALUES = {
    "rbf": lambda d2: torch.exp(-0.5 * d2),
    "matern12": lambda d2: torch.exp(-d2.clamp_min(1e-30).sqrt()),
    "matern32": lambda d2: (1.0 + (r := 3.0**0.5 * d2.clamp_min(1e-30).sqrt())) * torch.exp(-r),
    "matern52": lambda d2: ((1.0 + (r := 5.0**0.5 * d2.clamp_min(1e-30).sqrt()) + r * r / 3.0)
                            * torch.exp(-r)),
}
"""φ(D²) of each profile, differentiable (D² kept away from 0 under the square roots, whose
derivative there is infinite while the profile's is finite)."""


def dense_tile(terms: tuple[ComposedTerm, ...], a: Tensor, b: Tensor) -> Tensor:
    """K(a, b) (c, w) of the composed kernel, formed densely and differentiable under autograd:
    the dense twin of :func:`composed_matmul` and its gradients."""
    total = None
    for term in terms:
        part = None
        for leaf in term.leaves:
            ell = leaf.lengthscale.reshape(-1)
            value = _VALUES[leaf.profile](_sqdist(a[:, leaf.dims] / ell, b[:, leaf.dims] / ell))
            part = value if part is None else part * value
        part = term.outputscale * part
        total = part if total is None else total + part
    return total


def composed_matmul(terms: tuple[ComposedTerm, ...], x1: Tensor, x2: Tensor, rhs: Tensor,
                    chunk: int | None = None, *, native_forward: bool = True) -> Tensor:
    """K(x1, x2) @ rhs for the composed kernel ``terms`` (module docstring).

    Args:
        terms: the kernel's terms.
        x1, x2, rhs: (n1, d), (n2, d), (n2, k).
        chunk: rows of x1 per chunk of the forward (default: all rows on the native path,
            :func:`fused.default_rows` on the tiles, which also tile the columns); the backward
            forms at most ``fused.tile_entries`` entries of each tile it needs at a time.
        native_forward: run the forward in C where :func:`native_applies`; False keeps the
            compiled tiles.
    """
    if x1.dim() != 2 or x2.dim() != 2 or rhs.dim() != 2:
        raise ValueError("composed_matmul takes 2-D inputs and right-hand sides (no batch)")
    params, slots = composed_grad.parameters(terms)
    if native_forward and native_applies(terms, x1, x2, rhs):
        symmetric = x1 is x2  # one chunk of all rows then takes the symmetric C product

        def forward(a: Tensor, b: Tensor, v: Tensor) -> Tensor:
            whole = symmetric and a.shape[0] == x1.shape[0]
            return _native_forward(terms, a, None if whole else b, v)

        def transpose(a: Tensor, b: Tensor, g: Tensor) -> Tensor:  # K(b, a) @ g
            whole = symmetric and a.shape[0] == x1.shape[0]
            return _native_forward(terms, a, None, g) if whole else _native_forward(
                terms, b, a, g)

        chunk = chunk or max(1, x1.shape[0])
    else:
        forward = partial(_fused_forward, terms)

        def transpose(a: Tensor, b: Tensor, g: Tensor) -> Tensor:  # K(b, a) @ g
            return _fused_forward(terms, b, a, g)

        chunk = chunk or fused.default_rows(x1)
    vjp = partial(composed_grad.composed_vjp, terms, slots, transpose, exact_dims=EXACT_DIMS)
    rule = ChunkRule(forward=forward, vjp=vjp, params=params)
    return chunked_product(rule, x1, x2, rhs, chunk_size=chunk)


def native_applies(terms: tuple[ComposedTerm, ...], x1: Tensor, x2: Tensor, rhs: Tensor) -> bool:
    """Whether the forward can run in C: CPU float32/float64 inputs, right-hand sides and
    hyperparameters of one dtype, the native kernels available, and the leaves' columns at most
    :data:`~gpscale.linalg.native.DENSE_MAX_DIMS` in all."""
    params = [t for term in terms for t in (term.outputscale,
                                            *(leaf.lengthscale for leaf in term.leaves))]
    width = sum(leaf.dims.numel() for term in terms for leaf in term.leaves)
    return (len(terms) > 0 and width <= native.DENSE_MAX_DIMS and native.available(x1)
            and all(t.dtype == x1.dtype and t.device == x1.device for t in (x2, rhs, *params)))


def _gathered(terms: tuple[ComposedTerm, ...], x: Tensor) -> Tensor:
    """Each leaf's columns of x divided by its lengthscales, side by side in leaf order
    (n, Σ_l |c_l|): the layout of :func:`gpscale.linalg.native.composed_product`."""
    return torch.cat([x[:, leaf.dims] / leaf.lengthscale.detach().reshape(-1).to(x.dtype)
                      for term in terms for leaf in term.leaves], dim=-1)


def _native_forward(terms: tuple[ComposedTerm, ...], a: Tensor, b: Tensor | None,
                    v: Tensor) -> Tensor:
    """K(a, b) @ v by the C panel product (``b=None``: K(a, a) @ v, symmetric)."""
    with torch.no_grad():
        spec = [(float(term.outputscale),
                 [(leaf.profile, leaf.dims.numel()) for leaf in term.leaves]) for term in terms]
        z1 = _gathered(terms, a)
        z2 = None if b is None else _gathered(terms, b)
        return native.composed_product(spec, z1, z2, v)


def _fused_forward(terms: tuple[ComposedTerm, ...], a: Tensor, b: Tensor, v: Tensor) -> Tensor:
    """K(a, b) @ v tile by tile: per leaf one inner-product GEMM on its scaled columns and its
    profile in place (the compiled functions of :mod:`gpscale.linalg.fused`), the products and
    the weighted sum formed in place, then one GEMM with the right-hand sides."""
    with torch.no_grad():
        leaves = [(leaf, float(term.outputscale) if j == 0 else None)
                  for term in terms for j, leaf in enumerate(term.leaves)]
        scaled = []
        for leaf, _ in leaves:
            ell = leaf.lengthscale.detach().reshape(-1).to(a.dtype)  # float64 ℓ, float32 x
            z1, z2 = (a[:, leaf.dims] / ell)[None], (b[:, leaf.dims] / ell)[None]
            if z1.shape[-1] <= EXACT_DIMS:  # differences, as _sqdist: 0 at coincident points
                exact = z1.shape[-1]
            else:
                z1, z2, exact = fused.exact_last(z1, z2)
            value, _ = fused.PROFILES[leaf.profile]
            scaled.append((z1, z2, exact, fused.sq_norms(z1, exact).unsqueeze(-1),
                           fused.compiled_profile(value)))
        c, n2 = a.shape[0], b.shape[0]
        out = a.new_zeros(c, v.shape[-1])
        for cols in fused._tiles(n2, c, fused.tile_entries(a)):
            total = part = None
            for (_, scale), (z1, z2, exact, sq1, value) in zip(leaves, scaled, strict=True):
                z2t = z2[:, cols]
                P = a.new_empty(1, c, cols.stop - cols.start)
                fused.inner_products(z1, z2t, P, exact)
                value(P, sq1, fused.sq_norms(z2t, exact).unsqueeze(-2))  # P ← φ(D²)
                if scale is not None:  # the first leaf of a term: close the previous term
                    total = _add(total, part)
                    part = P.mul_(scale)
                else:
                    part.mul_(P)
            total = _add(total, part)
            out.addmm_(total[0], v[cols])
        return out


def _add(total: Tensor | None, part: Tensor | None) -> Tensor | None:
    if part is None:
        return total
    return part if total is None else total.add_(part)
