r"""Softmax (categorical) likelihood over C classes with C latent functions (notes/000 §7.4).

With π_n = softmax(f_n) ∈ R^C for data point n and one-hot labels e_{y_n}:

.. math::
    \log p(y \mid f) = \sum_n f_n^{y_n} - \log\textstyle\sum_c e^{f_n^c}, \quad
    \nabla = e_y - \pi, \quad
    W = \operatorname{blockdiag}_n\big(\operatorname{diag}(\pi_n) - \pi_n\pi_n^\top\big).

W is singular (each block has the null vector 1_C, rank W = N(C − 1)), so ``W_inv_matmul``
applies the Moore–Penrose pseudo-inverse of Lemma A.7,

.. math::
    W^\dagger = \operatorname{blockdiag}_n\big(P \operatorname{diag}(\pi_n^{-1}) P\big),\quad
    P = I_C - \tfrac1C \mathbf 1\mathbf 1^\top,

i.e. centre over the classes, divide by π, centre again: O(NC) time and memory, the NC × NC
matrix is never formed. W W† = W† W = blockdiag(P). 1/π_n^c is computed as
exp(logsumexp(f_n) − f_n^c), so it stays finite while the logit gaps are below ~709 (float64).
Deviation from the paper's text: its intermediate identity (15) is false as printed (notes §7.4);
the lemma itself, implemented here, holds.

Layout: f is (C, n), class-major (NC-ordering); the blocks couple the C entries of one data
point, i.e. they act along the leading axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.likelihoods.base import Likelihood, per_entry
from gpscale.typing import Float

__all__ = ["Softmax"]


@dataclass(frozen=True)
class Softmax(Likelihood):
    """Labels 0..C−1 with P(y = c | f) = softmax(f)_c.

    Args:
        num_classes: C ≥ 2 (one latent function per class).

    Example:
        >>> lik = Softmax(num_classes=3)
        >>> f = torch.zeros(3, 2)
        >>> out = lik.W_inv_matmul(f, torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
        >>> [round(v, 4) for v in out[:, 0].tolist()]  # P diag(3) P e_1 at π = 1/3
        [2.0, -1.0, -1.0]
    """

    num_classes: int = 2
    task = "classification"

    def __post_init__(self):
        if self.num_classes < 2:
            raise ValueError(f"Softmax needs num_classes ≥ 2; got {self.num_classes}")

    @property
    def num_latents(self) -> int:  # type: ignore[override]
        return self.num_classes

    def log_prob(self, f: Float[Tensor, "C n"], y: Tensor) -> Float[Tensor, " n"]:
        """f_n^{y_n} − logsumexp_c f_n^c per data point."""
        self.check_latents(f)
        picked = f.gather(0, y.long().to(f.device)[None, :])[0]
        return picked - torch.logsumexp(f, 0)

    def gradient(self, f: Float[Tensor, "C n"], y: Tensor) -> Float[Tensor, "C n"]:
        """e_y − π."""
        self.check_latents(f)
        onehot = torch.zeros_like(f).scatter_(0, y.long().to(f.device)[None, :], 1.0)
        return onehot - torch.softmax(f, 0)

    def W_matmul(self, f: Float[Tensor, "C n"], V: Tensor) -> Tensor:
        """(diag(π_n) − π_n π_nᵀ) V_n for every data point n."""
        pi = torch.softmax(f, 0)  # (C, n)
        PiV = per_entry(pi, V)  # (C, n[, k])
        return PiV - per_entry(pi, PiV.sum(0, keepdim=True).expand_as(V))

    def W_inv_matmul(self, f: Float[Tensor, "C n"], V: Tensor) -> Tensor:
        """W† V = P diag(π_n⁻¹) P V_n per data point (Lemma A.7)."""
        inv_pi = torch.exp(torch.logsumexp(f, 0, keepdim=True) - f)  # (C, n)
        U = per_entry(inv_pi, _centre(V))
        return _centre(U)


def _centre(V: Tensor) -> Tensor:
    """P V: subtract the mean over the classes (the leading axis)."""
    return V - V.mean(0, keepdim=True)
