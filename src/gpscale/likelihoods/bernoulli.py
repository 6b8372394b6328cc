r"""Bernoulli likelihood with a logistic link and one latent function (R&W Eq. 3.15; notes §7.3).

For labels t_n ∈ {0, 1} and σ the logistic sigmoid:

.. math::
    \log p(t \mid f) = \sum_n t_n f_n - \log(1 + e^{f_n}), \quad \nabla = t - \sigma(f), \quad
    W = \operatorname{diag}(\sigma(f)\,\sigma(-f)), \quad
    W^{-1} = \operatorname{diag}(2 + 2\cosh f).

The last form is σ(f)⁻¹σ(−f)⁻¹ = (1 + e^{−f})(1 + e^{f}) written without division, finite for
|f| < 710 in float64. Cost of every product: O(n).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.functional import softplus

from gpscale.likelihoods.base import Likelihood, as_float_targets, per_entry
from gpscale.typing import Float

__all__ = ["Bernoulli"]


@dataclass(frozen=True)
class Bernoulli(Likelihood):
    """Binary labels 0/1 with P(y = 1 | f) = σ(f).

    Example:
        >>> lik = Bernoulli()
        >>> lik.gradient(torch.zeros(1, 2), torch.tensor([0, 1]))
        tensor([[-0.5000,  0.5000]])
    """

    num_latents = 1
    task = "classification"

    def log_prob(self, f: Float[Tensor, "1 n"], y: Tensor) -> Float[Tensor, " n"]:
        """t f − log(1 + e^f) = −softplus(−(2t − 1) f) per data point."""
        self.check_latents(f)
        sign = 2 * as_float_targets(y, f) - 1
        return -softplus(-sign * f[0])

    def gradient(self, f: Float[Tensor, "1 n"], y: Tensor) -> Float[Tensor, "1 n"]:
        """t − σ(f)."""
        self.check_latents(f)
        return as_float_targets(y, f) - torch.sigmoid(f)

    def W_matmul(self, f: Float[Tensor, "1 n"], V: Tensor) -> Tensor:
        """diag(σ(f) σ(−f)) V."""
        return per_entry(torch.sigmoid(f) * torch.sigmoid(-f), V)

    def W_inv_matmul(self, f: Float[Tensor, "1 n"], V: Tensor) -> Tensor:
        """diag(2 + 2 cosh f) V."""
        return per_entry(2 + 2 * torch.cosh(f), V)
