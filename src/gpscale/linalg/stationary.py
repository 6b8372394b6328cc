r"""Dense stationary kernel matrices :math:`s\,\varphi(D^2)` in one autograd node.

:math:`D^2_{ij} = \lVert z_{1i} - z_{2j}\rVert^2` for scaled, centred inputs (z = (x − c)/ℓ, see
:func:`gpscale.linalg.reach.centre`), from the inner products and norms of
:mod:`gpscale.linalg.fused` (the dimensions :func:`~gpscale.linalg.fused.exact_dims` picks enter
exactly), through the same profile functions as the matrix-free products. Nothing n1 × n2 is kept
for the backward pass: it recomputes the inner products and takes
:math:`H = (s\bar G) \odot \varphi'(D^2)` from the profile's vjp; then
:math:`\bar z_1 = 2(\operatorname{diag}(H 1) z_1 - H z_2)`,
:math:`\bar z_2 = 2(\operatorname{diag}(H^\top 1) z_2 - H^\top z_1)` and
:math:`\bar s = \langle \bar G, \varphi\rangle`.
Cost: O(n1 n2 d) in one batched matrix product plus O(n1 n2) elementwise, each way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpscale.linalg import fused

__all__ = ["stationary_matrix"]


def stationary_matrix(z1: Tensor, z2: Tensor, outputscale: Tensor, profile: str, *,
                      exact: int = 0, symmetric: bool = False) -> Tensor:
    """``outputscale[b] · φ(‖z1[b, i] − z2[b, j]‖²)`` as (B, n1, n2), differentiable in all three.

    Args:
        z1: (B, n1, d) scaled rows, the ``exact`` dimensions last.
        z2: (B, n2, d) scaled columns, the same order.
        outputscale: (B,).
        profile: a key of :data:`gpscale.linalg.fused.PROFILES`.
        exact: how many trailing dimensions enter D² exactly (:func:`fused.inner_products`).
        symmetric: z1 and z2 are the same points: D²_ii is set to exactly 0.
    """
    return _StationaryMatrix.apply(z1, z2, outputscale, profile, exact, symmetric)


class _StationaryMatrix(torch.autograd.Function):
    """s φ(D²) with the backward of the module docstring."""

    @staticmethod
    def forward(ctx, z1: Tensor, z2: Tensor, s: Tensor, profile: str, exact: int,
                symmetric: bool) -> Tensor:
        value, _ = fused.PROFILES[profile]
        P, sq1, sq2 = _inner(z1, z2, exact, symmetric)
        value(P, sq1, sq2)  # P ← φ(D²)
        ctx.save_for_backward(z1, z2, s)
        ctx.profile, ctx.exact, ctx.symmetric = profile, exact, symmetric
        return P.mul_(s[..., None, None])

    @staticmethod
    def backward(ctx, grad: Tensor):
        z1, z2, s = ctx.saved_tensors
        _, vjp = fused.PROFILES[ctx.profile]
        P, sq1, sq2 = _inner(z1, z2, ctx.exact, ctx.symmetric)
        H = grad * s[..., None, None]
        rows, cols = vjp(P, sq1, sq2, H)  # P ← φ(D²), H ← (s Ḡ) ⊙ φ'(D²)
        grad_s = (grad * P).sum((-2, -1)) if ctx.needs_input_grad[2] else None
        grad_z1 = 2 * torch.baddbmm(rows[..., None] * z1, H, z2, alpha=-1)
        grad_z2 = 2 * torch.baddbmm(cols[..., None] * z2, H.mT, z1, alpha=-1)
        return grad_z1, grad_z2, grad_s, None, None, None


def _inner(z1: Tensor, z2: Tensor, exact: int,
           symmetric: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Inner products P (B, n1, n2) and the squared norms (B, n1, 1), (B, 1, n2); with
    ``symmetric`` the diagonal of P is set so that D²_ii = sq1_i + sq2_i − 2 P_ii = 0 exactly."""
    P = z1.new_empty(z1.shape[0], z1.shape[1], z2.shape[1])
    fused.inner_products(z1, z2, P, exact)
    sq1, sq2 = fused.sq_norms(z1, exact), fused.sq_norms(z2, exact)
    if symmetric:
        P.diagonal(dim1=-2, dim2=-1).copy_(0.5 * (sq1 + sq2))
    return P, sq1[..., None], sq2[..., None, :]
