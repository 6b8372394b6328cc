r"""SoftKI's posterior for prediction, streamed over the data and kept without it; and the
state of training (:class:`SoftKIState`).

Prediction needs only m-sized quantities (§2.4 of the digest): the points z, U with UᵀU = K_zz,
β², the factor R of the QR of [G/β; I] (G = W Uᵀ, RᵀR = I + GᵀG/β²) and v = Uᵀγ with
RᵀR γ = Gᵀr/β². :func:`stacked_qr` accumulates R over row blocks (TSQR), so the posterior of n
points costs O(n m²) time and O(chunk · m) memory: the n × m weights of the training state are
never held. A :class:`SoftKIPosterior` is also what a saved model keeps instead of its training
data; it records the digest of the parameters it was computed with, and a model holding other
parameters refuses it (:meth:`SoftKIPosterior.check`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["SoftKIPosterior", "SoftKIState", "stacked_qr", "qr_of_blocks"]


@dataclass(frozen=True)
class SoftKIPosterior:
    """The m-sized part of a SoftKI state that :meth:`SoftKI.predict` reads.

    Attributes:
        inducing_points: z (m, d).  chol_zz: U (m, m) upper, UᵀU = K_zz.  noise: β².
        R: (m, m) upper, RᵀR = I + GᵀG/β².  mean_weights: v (m,), μ(x*) = c + W_*z v.
        digest: :func:`~gpscale.methods.base.parameter_digest` of the model it belongs to.
    """

    inducing_points: Tensor
    chol_zz: Tensor
    noise: Tensor
    R: Tensor
    mean_weights: Tensor
    digest: str

    def check(self, digest: str) -> None:
        """Raise unless the model's parameters are the ones this posterior was computed with."""
        if digest != self.digest:
            raise ValueError("this SoftKI posterior was computed with other parameters than the "
                             "model now holds (trained further, or another model?); condition "
                             "on the training data again: model.posterior(x, y)")


@dataclass(frozen=True)
class SoftKIState:
    """Everything SoftKI computes from (x, y): weights, factors, the posterior and probe solves.

    Attributes:
        inducing_points: z (m, d) the state was conditioned with.
        weights: W_xz (n, m), differentiable in z.
        K_zz: (m, m) kernel matrix of z, differentiable.
        chol_zz: U (m, m) upper, UᵀU = K_zz (+ jitter if it was needed).
        residual: r = y − c (n,).
        noise: β² (scalar).
        R: (m, m) upper triangular with RᵀR = I + GᵀG/β², G = W Uᵀ (differentiable only for
            ``objective='mll'``).
        gamma: γ (m,), RᵀR γ = Gᵀ r / β².
        mean_weights: v = Uᵀγ = K_zz α (m,) with α of Eq. 25, so μ(x*) = c + W_*z v.
        quad: ρ² = rᵀ (Q̃ + β²I)⁻¹ r (scalar).
        probes: a (n, L) Gaussian probes (L = 0 for ``objective='mll'``).
        solves: sg(Σ⁻¹ [r, a]) (n, L + 1), detached.
    """

    inducing_points: Tensor
    weights: Tensor
    K_zz: Tensor
    chol_zz: Tensor
    residual: Tensor
    noise: Tensor
    R: Tensor
    gamma: Tensor
    mean_weights: Tensor
    quad: Tensor
    probes: Tensor
    solves: Tensor

    @property
    def num_points(self) -> int:
        return self.residual.shape[0]


def qr_of_blocks(blocks: Iterable[tuple[Tensor, Tensor]], m: int, k: int, noise: Tensor,
                 like: Tensor) -> Tensor:
    """R of the QR of [[G, rhs] / β ; [I, 0]] from row blocks ``(G_i, rhs_i)`` (TSQR).

    Returns the (m + k) × (m + k) upper-triangular factor (fewer rows when n + m < m + k);
    the Q factor is computed (for the backward pass) only when gradients are enabled.
    """
    mode = "reduced" if torch.is_grad_enabled() else "r"
    scale = noise.rsqrt()
    R = torch.cat([torch.eye(m, dtype=like.dtype, device=like.device),
                   like.new_zeros(m, k)], 1)
    for G, rhs in blocks:
        block = torch.cat([G, rhs], 1) * scale
        R = torch.linalg.qr(torch.cat([R, block], 0), mode=mode).R
    return R


def stacked_qr(G: Tensor, rhs: Tensor, noise: Tensor, chunk_size: int) -> Tensor:
    """:func:`qr_of_blocks` over the row chunks of a held G and rhs."""
    blocks = ((G[i:i + chunk_size], rhs[i:i + chunk_size])
              for i in range(0, G.shape[0], chunk_size))
    return qr_of_blocks(blocks, G.shape[1], rhs.shape[1], noise, G)


def streamed_posterior(features: Callable[[Tensor], Tensor], x: Tensor, r: Tensor, *,
                       z: Tensor, U: Tensor, noise: Tensor, chunk_size: int,
                       digest: str) -> SoftKIPosterior:
    """The posterior from ``features(x_chunk)`` = rows of G, one chunk at a time."""
    m = z.shape[0]
    blocks = ((features(x[i:i + chunk_size]), r[i:i + chunk_size, None])
              for i in range(0, x.shape[0], chunk_size))
    R_aug = qr_of_blocks(blocks, m, 1, noise, z)
    R = R_aug[:m, :m]
    gamma = torch.linalg.solve_triangular(R, R_aug[:m, m:], upper=True)[:, 0]
    return SoftKIPosterior(z, U, noise, R, U.mT @ gamma, digest)
