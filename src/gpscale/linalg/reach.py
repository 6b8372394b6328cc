r"""The reach of a stationary kernel: where every kernel value is exactly 0.

A stationary profile :math:`\varphi(D^2)` of the scaled squared distance
:math:`D^2 = \lVert (x - x')/\ell \rVert^2` underflows to exactly 0, in float32 and in float64,
once :math:`D^2 \ge` :data:`FAR_SQDIST` (:math:`10^6`: RBF :math:`e^{-5\cdot 10^5}`, Matérn-½
:math:`e^{-1000}`, Matérn-3/2 and -5/2 a polynomial times :math:`e^{-1732}`, :math:`e^{-2236}`;
float64 underflows below :math:`e^{-745}`). A point that far from every point of the other set
is *beyond reach*: its kernel row is 0 whatever the other set holds.

Why this module exists. The kernel products compute :math:`D^2` after subtracting one shift point
from both point sets, by the norm expansion :math:`\lVert z_1\rVert^2 + \lVert z_2\rVert^2 - 2
z_1^\top z_2`. When the shift comes from a batch that holds one point at :math:`10^8`, every other
point's distances lose :math:`\varepsilon \lVert\text{shift}\rVert^2` to cancellation (GPyTorch
centres on the mean of ``x1``, the test batch in ``K(x_*, X)``: one far test row moved every other
row's prediction); and a point at :math:`10^{200}` overflows :math:`D^2` to ∞, where Matérn's
:math:`(1 + r)e^{-r}` is ∞ · 0 = NaN. :func:`centre` therefore takes the shift from the points
within reach only and *parks* the points beyond reach on it (finite, harmless coordinates), and
reports them, so that callers set their kernel values to the exact 0 they would have.
:func:`park` moves far points to one finite point beyond reach instead, for code (GPyTorch's
own kernels) that must see them but would form infinite distances.

Cost: O((n1 + n2) d) elementwise; on a GPU without host synchronisation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["FAR_SQDIST", "Centred", "batched", "beyond_box", "box_sqdist", "centre", "park",
           "within_reach"]

FAR_SQDIST = 1e6
"""Scaled squared distance from which every profile of :mod:`gpscale.linalg.fused` is exactly 0
in float32 and float64 (see the module docstring)."""


class Centred(NamedTuple):
    """Scaled, centred inputs and which rows are within reach (``None``: all of them)."""

    z1: Tensor
    z2: Tensor
    keep1: Tensor | None
    keep2: Tensor | None


def _box(s: Tensor, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-dimension bounds (..., 1, d) of the rows of s (..., n, d) (those ``keep`` marks).
    No rows give the empty box (+∞, −∞), from which everything is beyond reach."""
    if keep is None:
        return s.amin(-2, keepdim=True), s.amax(-2, keepdim=True)
    inf = torch.tensor(torch.inf, dtype=s.dtype, device=s.device)
    k = keep[..., None]
    return torch.where(k, s, inf).amin(-2, keepdim=True), torch.where(k, s, -inf).amax(-2,
                                                                                     keepdim=True)


def box_sqdist(s: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    """Squared distance (..., n) from each row of s (..., n, d) to the box [lower, upper]: a lower
    bound on its squared distance to every point in the box (∞ where it overflows)."""
    return ((lower - s).clamp_min(0) + (s - upper).clamp_min(0)).square().sum(-1)


def _all_within_reach(x1: Tensor, x2: Tensor, lengthscale: Tensor) -> bool:
    """On the CPU, whether the box around both sets is too small to hold a pair beyond reach: the
    common case, in which :func:`centre` skips its masks (a dozen small operations; on a GPU
    the answer would cost a synchronisation, so there it always masks)."""
    if x1.device.type != "cpu":
        return False
    with torch.no_grad():
        lower = torch.minimum(x1.amin(-2, keepdim=True), x2.amin(-2, keepdim=True))
        upper = torch.maximum(x1.amax(-2, keepdim=True), x2.amax(-2, keepdim=True))
        return bool((((upper - lower) / lengthscale).square().sum(-1) < FAR_SQDIST).all())


def centre(x1: Tensor, x2: Tensor, lengthscale: Tensor) -> Centred:
    """``z = (x − c) / ℓ`` for both sets, with the rows beyond each other's reach parked on c.

    The columns of ``x2`` beyond reach of the box of ``x1`` are marked first, then the rows of
    ``x1`` beyond reach of the box of the remaining columns; c is the mean of those remaining
    columns. So a far point in either set neither moves c nor meets a profile, wherever it is;
    ``keep1`` / ``keep2`` say which rows kept their coordinates, and the caller zeroes the
    kernel values of the others (they are exactly 0). Where nothing can be beyond reach (always
    for ``x1 is x2``) c is the mean of x2, as before, and the masks are ``None``.

    Args:
        x1: (..., n1, d) row inputs.
        x2: (..., n2, d) column inputs.
        lengthscale: (..., 1, d) or (..., 1, 1); per batch member.

    Returns:
        :class:`Centred`: z1 (..., n1, d), z2 (..., n2, d) broadcast over the batch, masks
        (..., n1) and (..., n2) (True: within reach), or ``None`` masks.
    """
    if x1 is x2 or _all_within_reach(x1, x2, lengthscale):
        shift = x2.detach().mean(-2, keepdim=True)  # distances are translation invariant
        z2 = (x2 - shift) / lengthscale
        return Centred(z2 if x1 is x2 else (x1 - shift) / lengthscale, z2, None, None)
    with torch.no_grad():
        s1, s2 = x1.detach() / lengthscale, x2.detach() / lengthscale  # unshifted, coarse is fine
        # ~(≥) rather than <: a NaN row counts as within reach, so that it shows (fail loudly)
        keep2 = ~(box_sqdist(s2, *_box(s1)) >= FAR_SQDIST)  # (..., n2)
        keep1 = ~(box_sqdist(s1, *_box(s2, keep2)) >= FAR_SQDIST)  # (..., n1)
        kept = torch.where(keep2[..., None], x2.detach(), 0.0)  # (..., n2, d)
        count = keep2.sum(-1, keepdim=True)[..., None].clamp_min(1)  # (..., 1, 1)
        shift = kept.sum(-2, keepdim=True) / count  # (..., 1, d)
    x1 = torch.where(keep1[..., None], x1, shift)
    x2 = torch.where(keep2[..., None], x2, shift)
    return Centred((x1 - shift) / lengthscale, (x2 - shift) / lengthscale, keep1, keep2)


def batched(x1: Tensor, x2: Tensor, rhs: Tensor, lengthscale: Tensor,
            batch_shape: torch.Size):
    """:func:`centre`, flattened over the batch for the product backends.

    Returns:
        z1 (B, n1, d), z2 (B, n2, d), rhs (B, n2, k), the batch shape (broadcast of the inputs',
        the lengthscale's and ``batch_shape``), and the masks keep1 (B, n1), keep2 (B, n2) of
        the rows within reach (``None`` where nothing can be beyond reach).
    """
    z1, z2, keep1, keep2 = centre(x1, x2, lengthscale)
    batch = torch.broadcast_shapes(z1.shape[:-2], z2.shape[:-2], rhs.shape[:-2], batch_shape)
    flat = [t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in (z1, z2, rhs)]
    masks = [None if m is None else m.expand(*batch, m.shape[-1]).reshape(-1, m.shape[-1])
             for m in (keep1, keep2)]
    return (*flat, batch, *masks)


def within_reach(t: Tensor, keep: Tensor | None) -> Tensor:
    """t (B, n, k) with the rows that ``keep`` (B, n) does not mark set to exactly 0 (their
    kernel values are 0; parked on the shift, they would give other numbers)."""
    return t if keep is None else t * keep[..., None]


def beyond_box(x: Tensor, lower: Tensor, upper: Tensor, lengthscale: Tensor) -> Tensor:
    """(t,) True for the rows of x (t, d) beyond reach of every point of the box [lower, upper]
    (d,); ``lengthscale`` (..., 1, d) may carry batch dimensions (one GP per latent): a row is
    beyond reach only where it is so for all (the largest lengthscale per dimension decides)."""
    with torch.no_grad():
        ell = lengthscale.detach().reshape(-1, lengthscale.shape[-1]).amax(0)  # (d,) or (1,)
        return box_sqdist(x.detach() / ell, lower / ell, upper / ell) >= FAR_SQDIST


def park(x: Tensor, reference: Tensor, lengthscale: Tensor) -> Tensor:
    """``x`` (t, d) with each row beyond reach of every point of ``reference`` (..., m, d) moved
    to one finite point beyond reach too: its kernel values with ``reference`` stay exactly 0
    and its own prior variance k(x, x) is unchanged (the kernel is stationary), but no distance
    overflows. Batch dimensions as in :func:`beyond_box`."""
    with torch.no_grad():
        ref = reference.detach().reshape(-1, reference.shape[-1])  # (m', d)
        lower, upper = ref.amin(0), ref.amax(0)  # (d,)
        far = beyond_box(x, lower, upper, lengthscale)  # (t,)
        ell = lengthscale.detach().reshape(-1, lengthscale.shape[-1]).amax(0)
        spot = upper + 2.0 * FAR_SQDIST ** 0.5 * ell  # 2000 lengthscales past the box
    return torch.where(far[:, None], spot.to(x.dtype), x)
