r"""Matrix-free products with a composed stationary kernel: a sum of terms, each an output scale
times a product of RBF / Matérn profiles on groups of input columns,

.. math::
    K(x, x') = \sum_t s_t \prod_{l \in t} φ_l\big(‖(x_{c_l} − x'_{c_l}) / ℓ_l‖²\big).

GPyTorch evaluates such a kernel term by term, each a dense block of its own, then sums them;
here every tile of K is built once — one inner product per leaf on its columns, its profile
applied in place, the products and the weighted sum formed in the tile — and multiplied into
the right-hand sides by one GEMM, so the cost over a single kernel on all the columns is the
extra profiles, not extra GEMMs. K is never stored: tiles of at most
:func:`~gpscale.linalg.fused.tile_entries` entries. Gradients (inputs, right-hand sides,
lengthscales, output scales) recompute each chunk of rows under autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.linalg import fused
from gpscale.linalg.chunked import ChunkRule, autograd_rule, chunked_product

__all__ = ["ComposedLeaf", "ComposedTerm", "composed_matmul"]


@dataclass(frozen=True)
class ComposedLeaf:
    """One profile on some columns: ``profile`` (a key of :data:`fused.PROFILES`), the column
    indices ``dims`` and the lengthscale (1, len(dims)) or (1, 1)."""

    profile: str
    dims: Tensor
    lengthscale: Tensor


@dataclass(frozen=True)
class ComposedTerm:
    """An output scale (scalar) times the product of its leaves."""

    outputscale: Tensor
    leaves: tuple[ComposedLeaf, ...]


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


def _tile(terms: tuple[ComposedTerm, ...], a: Tensor, b: Tensor) -> Tensor:
    """K(a, b) (c, w) of the composed kernel."""
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
                    chunk: int | None = None) -> Tensor:
    """K(x1, x2) @ rhs for the composed kernel ``terms`` (module docstring).

    Args:
        terms: the kernel's terms.
        x1, x2, rhs: (n1, d), (n2, d), (n2, k).
        chunk: rows of x1 per chunk (default :func:`fused.default_rows`); the forward tiles
            the columns, the backward recomputes at most ``fused.tile_entries`` entries at a
            time.
    """
    if x1.dim() != 2 or x2.dim() != 2 or rhs.dim() != 2:
        raise ValueError("composed_matmul takes 2-D inputs and right-hand sides (no batch)")
    params = tuple(t for term in terms for t in (term.outputscale,
                                                 *(leaf.lengthscale for leaf in term.leaves))
                   if t.requires_grad)

    def product(a: Tensor, b: Tensor, v: Tensor) -> Tensor:
        return _tile(terms, a, b) @ v

    recompute = autograd_rule(product, params)
    step = max(1, fused.tile_entries(x1) // max(1, x2.shape[0]))  # rows a recompute holds

    def vjp(a: Tensor, b: Tensor, v: Tensor, grad_out: Tensor, needs: tuple[bool, ...]):
        total: list[Tensor | None] = [None] * len(needs)
        rows_grads = []
        for start in range(0, a.shape[0], step):
            part = recompute.vjp(a[start:start + step], b, v, grad_out[start:start + step],
                                 needs)
            rows_grads.append(part[0])
            for i in range(1, len(needs)):
                if part[i] is not None:
                    total[i] = part[i] if total[i] is None else total[i] + part[i]
        total[0] = torch.cat(rows_grads) if needs[0] else None
        return tuple(total)

    rule = ChunkRule(forward=lambda a, b, v: _fused_forward(terms, a, b, v), vjp=vjp,
                     params=recompute.params)
    return chunked_product(rule, x1, x2, rhs, chunk_size=chunk or fused.default_rows(x1))


def _fused_forward(terms: tuple[ComposedTerm, ...], a: Tensor, b: Tensor, v: Tensor) -> Tensor:
    """K(a, b) @ v tile by tile: per leaf one inner-product GEMM on its scaled columns and its
    profile in place (the compiled functions of :mod:`gpscale.linalg.fused`), the products and
    the weighted sum formed in place, then one GEMM with the right-hand sides."""
    with torch.no_grad():
        leaves = [(leaf, float(term.outputscale) if j == 0 else None)
                  for term in terms for j, leaf in enumerate(term.leaves)]
        scaled = []
        for leaf, _ in leaves:
            ell = leaf.lengthscale.detach().reshape(-1)
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
