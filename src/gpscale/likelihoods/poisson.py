r"""Poisson likelihood with a log link (notes/000 §7.2, paper §A.5).

With rates λ_n = exp(f_n):

.. math::
    \log p(y \mid f) = \sum_n y_n f_n - e^{f_n} - \log(y_n!), \quad \nabla = y - e^{f}, \quad
    W = \operatorname{diag}(e^{f}), \quad W^{-1} = \operatorname{diag}(e^{-f}).

The pseudo-targets are f + e^{−f}(y − e^{f}) = f + y e^{−f} − 1. Cost of every product: O(n).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.likelihoods.base import Likelihood, as_float_targets, per_entry
from gpscale.typing import Float

__all__ = ["Poisson"]


@dataclass(frozen=True)
class Poisson(Likelihood):
    """Counts y_n ∈ {0, 1, 2, …} with y_n ~ Poisson(exp(f_n)).

    Example:
        >>> lik = Poisson()
        >>> lik.W_inv_matmul(torch.zeros(1, 2), torch.ones(1, 2))
        tensor([[1., 1.]])
    """

    num_latents = 1
    task = "counts"

    def log_prob(self, f: Float[Tensor, "1 n"], y: Tensor) -> Float[Tensor, " n"]:
        """y f − e^f − log Γ(y + 1) per data point."""
        self.check_latents(f)
        y = as_float_targets(y, f)
        return y * f[0] - torch.exp(f[0]) - torch.lgamma(y + 1)

    def gradient(self, f: Float[Tensor, "1 n"], y: Tensor) -> Float[Tensor, "1 n"]:
        """y − e^f."""
        self.check_latents(f)
        return as_float_targets(y, f) - torch.exp(f)

    def W_matmul(self, f: Float[Tensor, "1 n"], V: Tensor) -> Tensor:
        """diag(e^f) V."""
        return per_entry(torch.exp(f), V)

    def W_inv_matmul(self, f: Float[Tensor, "1 n"], V: Tensor) -> Tensor:
        """diag(e^{−f}) V."""
        return per_entry(torch.exp(-f), V)
