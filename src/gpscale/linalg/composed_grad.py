r"""The vector-Jacobian product of the composed kernel product
(:func:`gpscale.linalg.composed.composed_matmul`), by hand, tile by tile.

For one chunk of rows ``a`` (c, d), all columns ``b`` (n2, d), right-hand sides V (n2, k) and
the output's adjoint Ȳ (c, k), with per tile of rows i and columns j

| symbol      | meaning                                                   | variable     |
|-------------|-----------------------------------------------------------|--------------|
| M           | Ȳ Vᵀ, the adjoint of the tile of K                         | ``M``        |
| μ           | the column means of ``b`` (a shift that leaves K as it is) | ``shift``    |
| z_a, z_b    | (a − μ)_{c_l} / ℓ_l, (b − μ)_{c_l} / ℓ_l, leaf l's columns  | ``za, zb``   |
| D²_l        | ‖z_{a,i} − z_{b,j}‖²                                       | in ``P``     |
| φ_l, φ'_l   | the profile and its derivative dφ/dD² (table in ``fused``) | ``P``, ``S`` |
| P_t         | Π_{l∈t} φ_l, term t's product of profiles                  |              |
| W_l         | s_t M ⊙ Π_{l'∈t, l'≠l} φ_{l'} ⊙ φ'_l                       | ``W``        |

the gradients are

.. math::
    \bar V = K(b, a)\,\bar Y, \qquad \bar s_t = \textstyle\sum_{ij} M_{ij} P_{t,ij},

    \bar z_a = 2(\operatorname{diag}(W 1) z_a - W z_b), \qquad
    \bar z_b = 2(\operatorname{diag}(W^\top 1) z_b - W^\top z_a),

    \bar a_{c_l} \mathrel{+}= \bar z_a / ℓ_l, \qquad \bar b_{c_l} \mathrel{+}= \bar z_b / ℓ_l,
    \qquad \bar ℓ_l = -\big(\textstyle\sum_i z_a \odot \bar z_a
    + \sum_j z_b \odot \bar z_b\big) / ℓ_l
    = -\tfrac{2}{ℓ^3} \textstyle\sum_{ij} W_{ij} (a_{ik} - b_{jk})^2,

summed over the columns for a shared (1, 1) lengthscale. :math:`\bar V` is the forward product
with rows and columns swapped (:func:`composed_matmul` passes it in: native C or the compiled
tiles). For the rest, each tile of at most :func:`fused.tile_entries` entries takes one GEMM
for M, per leaf the distances as the forward's tiles take them (:func:`fused.inner_products`:
differences for groups of at most :data:`~gpscale.linalg.composed.EXACT_DIMS` columns, so
coincident points have D² = 0 exactly), φ and φ' (or W at once, for a term of one leaf) in one
compiled elementwise pass, and two thin GEMMs with the leaf's columns augmented by a column of
ones, :math:`W [z_b, 1]` and :math:`W^\top [z_a, 1]`, which give the products and the row and
column sums at once; these accumulate over the tiles (held transposed, as (|c_l| + 1)-row
results: a GEMM with that few output rows streams W at the memory's speed, one with that few
output columns does not), and :math:`\bar z` is formed from them once per chunk. K is never
stored. Centring on μ keeps the differences of products in :math:`\bar z` and :math:`\bar ℓ`
free of the cancellation an offset in the inputs would cause.

Coincident points. dφ/dD² is −e^{−r}/(2r) for Matérn-½, infinite at D² = 0; the dense twin
(:func:`gpscale.linalg.composed.dense_tile`) keeps D² ≥ 1e-30 under the square roots, so
autograd gives the Matérn profiles a zero derivative below that (the clamp passes no
gradient). Here φ'(D²) = 0 below :data:`TINY_SQDIST` for the Matérn profiles likewise, and
−φ/2 for RBF (unclamped in both): a coincident pair adds nothing to any gradient (the
subgradient 0, as ``torch.cdist`` and :mod:`gpscale.linalg.fused` take it), and the gradients
equal the dense twin's to rounding. In groups of more than ``EXACT_DIMS`` columns D² comes
from the norm expansion, in the dense twin as here, so a coincident pair has a D² of rounding
size ε‖z‖² instead of 0: Matérn-½ is 1 − O(√ε) there with a φ' of order 1/√ε, and that pair's
share of the gradients is of order √ε relative, differently in the two.

Cost per tile of c × w entries: 2 c w (k + Σ_l (3 |c_l| + 2)) flops in GEMMs and one
elementwise pass per leaf (plus a few per term of several leaves), then the forward's cost
again for V̄.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.linalg import fused
from gpscale.linalg.reach import FAR_SQDIST

__all__ = ["ComposedLeaf", "ComposedTerm", "TINY_SQDIST", "composed_vjp", "parameters"]


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


TINY_SQDIST = 1e-30
"""D² below which the Matérn profiles' derivative is taken as 0 (the dense twin's clamp)."""

_SQRT3, _SQRT5 = 3.0**0.5, 5.0**0.5


def _sqdist(P: Tensor, sq1: Tensor, sq2: Tensor) -> Tensor:
    return (sq1 + sq2 - 2.0 * P).clamp(0.0, FAR_SQDIST)  # (1, c, w)


# φ(D²) and φ'(D²) of each profile (module docstring); φ' is 0 below TINY_SQDIST for Matérn.
def _rbf(D2: Tensor) -> tuple[Tensor, Tensor]:
    K = torch.exp(-0.5 * D2)
    return K, -0.5 * K


def _matern12(D2: Tensor) -> tuple[Tensor, Tensor]:
    r = D2.sqrt()
    K = torch.exp(-r)
    return K, torch.where(D2 >= TINY_SQDIST, -0.5 * K / r.clamp_min(TINY_SQDIST), 0.0)


def _matern32(D2: Tensor) -> tuple[Tensor, Tensor]:
    r = _SQRT3 * D2.sqrt()
    e = torch.exp(-r)
    return (1.0 + r) * e, torch.where(D2 >= TINY_SQDIST, -1.5 * e, 0.0)


def _matern52(D2: Tensor) -> tuple[Tensor, Tensor]:
    r = _SQRT5 * D2.sqrt()
    e = torch.exp(-r)
    return ((1.0 + r + r * r / 3.0) * e,
            torch.where(D2 >= TINY_SQDIST, (-5.0 / 6.0) * (1.0 + r) * e, 0.0))


# Two in-place functions per profile, each its own code object so that torch.compile keeps a
# cache per function: ``parts(P, sq1, sq2, S)`` overwrites the inner products P with φ(D²) and S
# with φ'(D²) (a leaf of a product term); ``alone(P, sq1, sq2, M, scale)`` overwrites P with
# W = s M ⊙ φ'(D²) and returns Σ M ⊙ φ (a term of one leaf, in one pass).
def _rbf_parts(P: Tensor, sq1: Tensor, sq2: Tensor, S: Tensor) -> None:
    K, slope = _rbf(_sqdist(P, sq1, sq2))
    P.copy_(K)
    S.copy_(slope)


def _matern12_parts(P: Tensor, sq1: Tensor, sq2: Tensor, S: Tensor) -> None:
    K, slope = _matern12(_sqdist(P, sq1, sq2))
    P.copy_(K)
    S.copy_(slope)


def _matern32_parts(P: Tensor, sq1: Tensor, sq2: Tensor, S: Tensor) -> None:
    K, slope = _matern32(_sqdist(P, sq1, sq2))
    P.copy_(K)
    S.copy_(slope)


def _matern52_parts(P: Tensor, sq1: Tensor, sq2: Tensor, S: Tensor) -> None:
    K, slope = _matern52(_sqdist(P, sq1, sq2))
    P.copy_(K)
    S.copy_(slope)


def _rbf_alone(P: Tensor, sq1: Tensor, sq2: Tensor, M: Tensor, scale: Tensor) -> Tensor:
    K, slope = _rbf(_sqdist(P, sq1, sq2))
    P.copy_(scale * M * slope)
    return (M * K).sum()


def _matern12_alone(P: Tensor, sq1: Tensor, sq2: Tensor, M: Tensor, scale: Tensor) -> Tensor:
    K, slope = _matern12(_sqdist(P, sq1, sq2))
    P.copy_(scale * M * slope)
    return (M * K).sum()


def _matern32_alone(P: Tensor, sq1: Tensor, sq2: Tensor, M: Tensor, scale: Tensor) -> Tensor:
    K, slope = _matern32(_sqdist(P, sq1, sq2))
    P.copy_(scale * M * slope)
    return (M * K).sum()


def _matern52_alone(P: Tensor, sq1: Tensor, sq2: Tensor, M: Tensor, scale: Tensor) -> Tensor:
    K, slope = _matern52(_sqdist(P, sq1, sq2))
    P.copy_(scale * M * slope)
    return (M * K).sum()


_FUNCTIONS: dict[str, tuple[Callable, Callable]] = {
    "rbf": (_rbf_parts, _rbf_alone),
    "matern12": (_matern12_parts, _matern12_alone),
    "matern32": (_matern32_parts, _matern32_alone),
    "matern52": (_matern52_parts, _matern52_alone),
}
"""Profile name → (``parts``, ``alone``), the keys of :data:`fused.PROFILES`."""


def parameters(terms: Sequence[ComposedTerm]) -> tuple[tuple[Tensor, ...],
                                                       tuple[tuple[int, int], ...]]:
    """The hyperparameters that need gradients, in term order (each term's output scale, then
    its leaves' lengthscales), and where each sits: ``(t, -1)`` the output scale of term t,
    ``(t, l)`` the lengthscale of its leaf l."""
    found = [(tensor, (t, l)) for t, term in enumerate(terms)
             for l, tensor in [(-1, term.outputscale),
                               *enumerate(leaf.lengthscale for leaf in term.leaves)]
             if tensor.requires_grad]
    return tuple(tensor for tensor, _ in found), tuple(slot for _, slot in found)


class _Leaf:
    """One leaf on a chunk: its centred, scaled columns z_a (c, m), z_b (n2, m), their layout
    for the distances (:func:`fused.exact_last`) and, where gradients flow through W, the
    accumulators A = Σ W [z_b, 1] (c, m+1) and B = Σ Wᵀ [z_a, 1] (n2, m+1), both held
    transposed: a GEMM whose result has m + 1 rows runs at the memory's speed, where one with
    m + 1 columns does not."""

    def __init__(self, leaf: ComposedLeaf, a: Tensor, b: Tensor, shift: Tensor, exact_dims: int,
                 accumulate: bool):
        self.profile, self.dims = leaf.profile, leaf.dims.to(a.device)
        self.shape, self.dtype = leaf.lengthscale.shape, leaf.lengthscale.dtype
        self.ell = leaf.lengthscale.detach().reshape(-1).to(a.dtype)  # (m,) or (1,)
        self.za = (a[:, self.dims] - shift[self.dims]) / self.ell  # (c, m)
        self.zb = (b[:, self.dims] - shift[self.dims]) / self.ell  # (n2, m)
        z1, z2 = self.za[None], self.zb[None]
        if self.dims.numel() <= exact_dims:  # differences, as the forward: 0 at coincidence
            self.exact = self.dims.numel()
        else:
            z1, z2, self.exact = fused.exact_last(z1, z2)
        self.z1, self.z2 = z1, z2  # (1, c, m), (1, n2, m)
        self.sq1 = fused.sq_norms(z1, self.exact).unsqueeze(-1)  # (1, c, 1)
        self.sq2 = fused.sq_norms(z2, self.exact).unsqueeze(-2)  # (1, 1, n2)
        self.A = self.B = None
        if accumulate:
            self.za1 = torch.cat([self.za.T, self.za.new_ones(1, self.za.shape[0])])  # (m+1, c)
            self.zb1 = torch.cat([self.zb.T, self.zb.new_ones(1, self.zb.shape[0])])  # (m+1, n2)
            self.A, self.B = torch.zeros_like(self.za1), torch.zeros_like(self.zb1)  # Aᵀ, Bᵀ

    def distances(self, rows: slice, cols: slice, P: Tensor) -> tuple[Tensor, Tensor]:
        """P (1, c, w) ← the tile's inner products (:func:`fused.inner_products`); returns
        the squared norms that complete D²."""
        fused.inner_products(self.z1[:, rows], self.z2[:, cols], P, self.exact)
        return self.sq1[:, rows], self.sq2[..., cols]

    def accumulate(self, rows: slice, cols: slice, W: Tensor) -> None:
        """Aᵀ ← Aᵀ + [z_b, 1]ᵀ Wᵀ, Bᵀ ← Bᵀ + [z_a, 1]ᵀ W for the tile's W (c, w)."""
        if self.A is not None:
            self.A[:, rows].addmm_(self.zb1[:, cols], W.T)
            self.B[:, cols].addmm_(self.za1[:, rows], W)

    def gradients(self) -> tuple[Tensor, Tensor, Tensor]:
        """(ā_{c_l} (c, m), b̄_{c_l} (n2, m), ℓ̄ in the lengthscale's shape) from A and B."""
        m = self.za.shape[-1]
        grad_za = 2.0 * (self.A[m:].T * self.za - self.A[:m].T)  # (c, m)
        grad_zb = 2.0 * (self.B[m:].T * self.zb - self.B[:m].T)  # (n2, m)
        grad_ell = -((self.za * grad_za).sum(0) + (self.zb * grad_zb).sum(0)) / self.ell
        if self.ell.numel() == 1:  # one lengthscale shared by the columns
            grad_ell = grad_ell.sum()
        return grad_za / self.ell, grad_zb / self.ell, grad_ell.reshape(self.shape).to(self.dtype)


def _blocks(rows: int, cols: int, entries: int) -> list[tuple[slice, slice]]:
    """Tiles (rows, cols) of at most ``entries`` entries, about square."""
    step = max(1, min(rows, int(entries**0.5)))
    width = max(1, entries // step)
    return [(slice(i, min(i + step, rows)), slice(j, min(j + width, cols)))
            for i in range(0, rows, step) for j in range(0, cols, width)]


def composed_vjp(terms: Sequence[ComposedTerm], slots: tuple[tuple[int, int], ...],
                 transpose: Callable[[Tensor, Tensor, Tensor], Tensor], a: Tensor, b: Tensor,
                 v: Tensor, grad_out: Tensor, needs: tuple[bool, ...], *,
                 exact_dims: int) -> tuple[Tensor | None, ...]:
    """The gradients of K(a, b) @ v for ``(a, b, v, *params)`` (module docstring).

    Args:
        terms: the kernel's terms.
        slots: where each parameter sits (:func:`parameters`).
        transpose: ``(a, b, g) -> K(b, a) @ g``, the forward with rows and columns swapped.
        a, b, v, grad_out: (c, d), (n2, d), (n2, k), (c, k).
        needs: which of ``(a, b, v, *params)`` need gradients.
        exact_dims: leaves of at most this many columns take D² from differences.

    Returns:
        One gradient per entry of ``needs`` (None where not needed).
    """
    grads: list[Tensor | None] = [None] * len(needs)
    if needs[2]:
        grads[2] = transpose(a, b, grad_out)  # (n2, k)
    index = {slot: 3 + i for i, slot in enumerate(slots) if needs[3 + i]}
    inputs = needs[0] or needs[1]
    if not (inputs or index):
        return tuple(grads)
    a, b, v, grad_out = a.detach(), b.detach(), v.detach(), grad_out.detach()
    shift = b.mean(0) if b.shape[0] else b.new_zeros(b.shape[1])  # (d,) μ
    plan = []  # (t, s_t, leaves) for the terms some gradient flows through
    for t, term in enumerate(terms):
        through = [inputs or (t, l) in index for l in range(len(term.leaves))]
        if (t, -1) in index or any(through):
            leaves = [_Leaf(leaf, a, b, shift, exact_dims, flows)
                      for leaf, flows in zip(term.leaves, through, strict=True)]
            plan.append((t, term.outputscale.detach().to(a.dtype), leaves))
    scale_grads = [a.new_zeros(()) for _ in plan]
    tiles = _TileBuffers(a, 1 + 2 * max((len(leaves) for _, _, leaves in plan), default=0),
                         min(fused.tile_entries(a), a.shape[0] * b.shape[0]))
    for rows, cols in _blocks(a.shape[0], b.shape[0], fused.tile_entries(a)):
        M, *rest = tiles.views(rows.stop - rows.start, cols.stop - cols.start)
        torch.mm(grad_out[rows], v[cols].T, out=M[0])  # M = Ȳ Vᵀ (1, c, w)
        for i, (_, scale, leaves) in enumerate(plan):
            scale_grads[i] += _term_tile(scale, leaves, rows, cols, M, rest)
    grad_a = torch.zeros_like(a) if needs[0] else None
    grad_b = torch.zeros_like(b) if needs[1] else None
    for (t, _, leaves), scale_grad in zip(plan, scale_grads, strict=True):
        if (t, -1) in index:
            grads[index[t, -1]] = scale_grad.reshape(terms[t].outputscale.shape).to(
                terms[t].outputscale.dtype)
        for l, leaf in enumerate(leaves):
            if leaf.A is None:
                continue
            leaf_a, leaf_b, leaf_ell = leaf.gradients()
            if grad_a is not None:
                grad_a.index_add_(1, leaf.dims, leaf_a)
            if grad_b is not None:
                grad_b.index_add_(1, leaf.dims, leaf_b)
            if (t, l) in index:
                grads[index[t, l]] = leaf_ell
    grads[0], grads[1] = grad_a, grad_b
    return tuple(grads)


class _TileBuffers:
    """A few flat buffers of ``entries`` each, viewed as (1, c, w) tiles (reused: fresh
    multi-megabyte tensors per tile cost page faults)."""

    def __init__(self, like: Tensor, count: int, entries: int):
        self.flat = [like.new_empty(entries) for _ in range(count)]

    def views(self, c: int, w: int) -> list[Tensor]:
        return [flat[: c * w].view(1, c, w) for flat in self.flat]


def _term_tile(scale: Tensor, leaves: list[_Leaf], rows: slice, cols: slice, M: Tensor,
               tiles: list[Tensor]) -> Tensor:
    """Term t on one tile: each leaf's W_l accumulated (where gradients flow through it);
    returns Σ M ⊙ P_t, this tile's share of s̄_t."""
    if len(leaves) == 1:  # W = s M ⊙ φ' and Σ M ⊙ φ in one pass
        leaf, W = leaves[0], tiles[0]
        sq1, sq2 = leaf.distances(rows, cols, W)
        total = fused.compiled_profile(_FUNCTIONS[leaf.profile][1])(W, sq1, sq2, M, scale)
        leaf.accumulate(rows, cols, W[0])
        return total
    values, slopes = tiles[0:2 * len(leaves):2], tiles[1:2 * len(leaves):2]
    for leaf, P, S in zip(leaves, values, slopes, strict=True):
        sq1, sq2 = leaf.distances(rows, cols, P)
        fused.compiled_profile(_FUNCTIONS[leaf.profile][0])(P, sq1, sq2, S)  # P ← φ, S ← φ'
    before, after = [None], [None]  # Π_{l' < l} φ_{l'}, Π_{l' > l} φ_{l'}
    for P, Q in zip(values[:-1], values[:0:-1], strict=True):
        before.append(P if before[-1] is None else before[-1] * P)
        after.append(Q if after[-1] is None else after[-1] * Q)
    scaled = M * scale  # (1, c, w)
    for leaf, S, left, right in zip(leaves, slopes, before, after[::-1], strict=True):
        if leaf.A is None:
            continue
        W = S.mul_(scaled)  # W_l = s M ⊙ φ'_l ⊙ Π_{l' ≠ l} φ_{l'}
        for other in (left, right):
            if other is not None:
                W.mul_(other)
        leaf.accumulate(rows, cols, W[0])
    return torch.dot(M.reshape(-1), (before[-1] * values[-1]).reshape(-1))
