r"""The likelihood protocol IterNCGP needs (STYLE §2): log p, its gradient and products with W, W⁻¹.

W(f) := −∇²_f log p(y | f) is the negative Hessian of the log-likelihood (notes/000 §2). It is
positive (semi-)definite for the log-concave likelihoods here. Laplace/Newton methods use
:math:`W^{-1}` as the observation noise of the pseudo-target regression problem (Prop. A.1); where
W is singular (softmax) the method documents that ``W_inv_matmul`` applies the Moore–Penrose
pseudo-inverse :math:`W^\dagger` instead.

Layout. A likelihood has ``num_latents`` = L latent functions; latent values are passed
latent-major ("NC-ordering", notes/000 §2) as ``f`` of shape (L, n), so a prior with L
independent GPs is block-diagonal over the leading axis. Products take ``V`` of shape (L, n) or
(L, n, k) (k vectors at once) and return the same shape. Targets ``y`` are (n,).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from torch import Tensor

from gpscale.typing import Float

__all__ = ["Likelihood", "as_float_targets", "per_entry"]


class Likelihood(ABC):
    """log p(y | f) for iid observations with L latent functions per data point.

    Attributes:
        num_latents: L, latent functions per data point.
        task: the data task of its targets (``"regression"``, ``"classification"``,
            ``"counts"``), as :func:`gpscale.validation.check_xy` names it.
    """

    num_latents: int = 1
    task: ClassVar[str] = "regression"

    @abstractmethod
    def log_prob(self, f: Float[Tensor, "L n"], y: Tensor) -> Float[Tensor, " n"]:
        """log p(y_n | f_n) per data point.

        Args:
            f: (L, n) latent values.
            y: (n,) targets.

        Returns:
            (n,) log-likelihood of each observation.
        """

    @abstractmethod
    def gradient(self, f: Float[Tensor, "L n"], y: Tensor) -> Float[Tensor, "L n"]:
        """∇_f log p(y | f), (L, n)."""

    @abstractmethod
    def W_matmul(self, f: Float[Tensor, "L n"], V: Tensor) -> Tensor:
        """W(f) V for V (L, n) or (L, n, k)."""

    @abstractmethod
    def W_inv_matmul(self, f: Float[Tensor, "L n"], V: Tensor) -> Tensor:
        """W(f)⁻¹ V (the pseudo-inverse where W is singular) for V (L, n) or (L, n, k)."""

    def check_latents(self, f: Tensor) -> None:
        """Raise ``ValueError`` unless ``f`` is (L, n) with L = ``num_latents``."""
        if f.dim() != 2 or f.shape[0] != self.num_latents:
            raise ValueError(f"{type(self).__name__} expects latent values f of shape "
                             f"({self.num_latents}, n); got {tuple(f.shape)}")


def per_entry(w: Float[Tensor, "L n"], V: Tensor) -> Tensor:
    """``w ⊙ V`` for the diagonal operator with entries ``w`` (L, n); V (L, n) or (L, n, k)."""
    return w * V if V.dim() == w.dim() else w[..., None] * V


def as_float_targets(y: Tensor, like: Tensor) -> Tensor:
    """Targets as (n,) in the dtype and on the device of ``like``."""
    return y.to(device=like.device, dtype=like.dtype)
