r"""Gaussian likelihood N(y; f, Λ) with Λ = diag(noise) (notes/000 §7.1, Thm. A.2).

.. math::
    \log p(y \mid f) = -\tfrac12 \sum_n \big[(y_n - f_n)^2/\sigma_n^2 + \log(2\pi\sigma_n^2)\big],
    \quad \nabla = (y - f)/\sigma^2, \quad W = \Lambda^{-1}, \quad W^{-1} = \Lambda.

W does not depend on f, and the pseudo-targets f + W⁻¹∇ equal y for every f, so one Newton step
reaches the mode (Thm. A.2). Cost of every product: O(n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.likelihoods.base import Likelihood, as_float_targets, per_entry
from gpscale.typing import Float

__all__ = ["Gaussian"]


@dataclass(frozen=True)
class Gaussian(Likelihood):
    """Gaussian observation noise with variance ``noise`` (σ², as in GPyTorch).

    Args:
        noise: noise variance σ² > 0, a float or a (n,) tensor (heteroscedastic).

    Example:
        >>> lik = Gaussian(noise=0.1)
        >>> lik.W_inv_matmul(torch.zeros(1, 3), torch.ones(1, 3))
        tensor([[0.1000, 0.1000, 0.1000]])
    """

    noise: float | Tensor = 1.0
    num_latents = 1
    task = "regression"

    def __post_init__(self):
        if not bool((torch.as_tensor(self.noise) > 0).all()):
            raise ValueError(f"the Gaussian noise variance must be positive; got {self.noise}")

    def _noise(self, f: Tensor) -> Tensor:
        return torch.as_tensor(self.noise, dtype=f.dtype, device=f.device).expand(f.shape)

    def log_prob(self, f: Float[Tensor, "1 n"], y: Tensor) -> Float[Tensor, " n"]:
        """log N(y_n; f_n, σ_n²) per data point."""
        self.check_latents(f)
        noise = self._noise(f)[0]
        r = as_float_targets(y, f) - f[0]
        return -0.5 * (r.square() / noise + torch.log(2 * math.pi * noise))

    def gradient(self, f: Float[Tensor, "1 n"], y: Tensor) -> Float[Tensor, "1 n"]:
        """(y − f) / σ²."""
        self.check_latents(f)
        return (as_float_targets(y, f) - f) / self._noise(f)

    def W_matmul(self, f: Float[Tensor, "1 n"], V: Tensor) -> Tensor:
        """Λ⁻¹ V."""
        return per_entry(1 / self._noise(f), V)

    def W_inv_matmul(self, f: Float[Tensor, "1 n"], V: Tensor) -> Tensor:
        """Λ V."""
        return per_entry(self._noise(f), V)
