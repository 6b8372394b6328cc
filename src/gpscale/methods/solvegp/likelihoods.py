r"""The variational expectations of SOLVE-GP's likelihoods, and the robust-max likelihood.

Given the marginals q(f_n) = N(μ_n, σ_n²) of each latent function (L, b), the ELBO needs
E_q[log p(y_n | f_n)] and prediction p(y | x) = E_q[p(y | f)]:

- Gaussian (regression): closed form (notes/004_solvegp.md §2.5).
- Bernoulli (binary labels, one latent function): Gauss–Hermite quadrature.
- Softmax (C > 2 classes): Monte Carlo over independent draws of the C marginals.
- :class:`RobustMax` (C classes, Hernández-Lobato, Hernández-Lobato & Dupont 2011; SOLVE-GP's
  CIFAR-10 likelihood, notes §2.13): p(y = k | f) = 1 − ε when k = argmax_c f_c, else
  ε/(C − 1). Both expectations need only P_k = P(argmax_c f_c = k), a one-dimensional
  integral over f_k ~ N(μ_k, σ_k²) of Π_{c≠k} Φ((f_k − μ_c)/σ_c), by Gauss–Hermite quadrature
  (log Φ summed, so that the product of C − 1 probabilities near 0 stays exact). ε bounds every
  label's probability away from 0: a mislabelled image costs at most −log(ε/(C − 1)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.likelihoods import Softmax
from gpscale.methods.solvegp.parts import VARIANCE_FLOOR, gauss_hermite

__all__ = ["LIKELIHOODS", "RobustMax", "argmax_probabilities", "expected_log_lik",
           "predictive"]

LIKELIHOODS = ("softmax", "robustmax")
"""Multi-class likelihoods a SOLVE-GP model may take (option ``likelihood``)."""


@dataclass(frozen=True)
class RobustMax:
    """Labels 0..C−1 with p(y = k | f) = 1 − ε at the largest f_k, ε/(C − 1) elsewhere.

    Attributes:
        num_classes: C ≥ 2 (one latent function per class).
        epsilon: ε in (0, 1), the probability of a label other than the argmax.
    """

    num_classes: int
    epsilon: float = 1e-3
    task = "classification"

    def __post_init__(self):
        if self.num_classes < 2:
            raise ValueError(f"RobustMax needs num_classes ≥ 2; got {self.num_classes}")
        if not 0 < self.epsilon < 1:
            raise ValueError(f"RobustMax's epsilon must lie in (0, 1); got {self.epsilon}")

    @property
    def num_latents(self) -> int:
        return self.num_classes

    def probabilities(self, argmax: Tensor) -> Tensor:
        """p(y = k) from P(argmax = k) (..., C)."""
        other = self.epsilon / (self.num_classes - 1)
        return argmax * (1 - self.epsilon - other) + other


def argmax_probabilities(mean: Tensor, var: Tensor, num_points: int,
                         labels: Tensor | None = None) -> Tensor:
    """P(argmax_c f_c = k) under independent f_c ~ N(mean_c, var_c): (C, b) for every k, or (b,)
    for k = ``labels`` (b,). Gauss–Hermite over f_k with ``num_points`` nodes."""
    std = var.clamp_min(VARIANCE_FLOOR).sqrt()  # (C, b)
    t, w = np.polynomial.hermite.hermgauss(num_points)
    t = torch.as_tensor(t, dtype=mean.dtype, device=mean.device)
    w = torch.as_tensor(w / math.sqrt(math.pi), dtype=mean.dtype, device=mean.device)
    if labels is None:
        centre, spread = mean, std  # (K = C, b)
    else:
        pick = labels.long()[None, :]
        centre, spread = mean.gather(0, pick), std.gather(0, pick)  # (1, b)
    u = centre[..., None] + math.sqrt(2.0) * spread[..., None] * t  # (K, b, J)
    z = (u[:, None] - mean[None, :, :, None]) / std[None, :, :, None]  # (K, C, b, J)
    log_cdf = torch.special.log_ndtr(z)
    own = (torch.arange(mean.shape[0], device=mean.device)[None, :, None]
           == (torch.arange(centre.shape[0], device=mean.device)[:, None, None]
               if labels is None else labels.long()[None, None, :]))  # (K, C, b)
    log_cdf = log_cdf.masked_fill(own[..., None], 0.0)  # the product runs over c ≠ k
    probs = (log_cdf.sum(1).exp() * w).sum(-1)  # (K, b)
    return probs if labels is None else probs[0]


def expected_log_lik(likelihood, mean: Tensor, var: Tensor, y: Tensor, *, noise: Tensor | None,
                     num_quadrature: int, num_samples: int,
                     generator: torch.Generator | None) -> Tensor:
    """E_{N(mean, var)}[log p(y_n | f_n)] per data point (b,); mean, var (L, b)."""
    if isinstance(likelihood, RobustMax):
        p = argmax_probabilities(mean, var, num_quadrature, labels=y).clamp(0.0, 1.0)
        other = likelihood.epsilon / (likelihood.num_classes - 1)
        return p * math.log(1 - likelihood.epsilon) + (1 - p) * math.log(other)
    if isinstance(likelihood, Softmax):
        f = draw(mean, var, num_samples, generator)  # (S, C, b)
        S, C, b = f.shape
        logp = likelihood.log_prob(f.permute(1, 0, 2).reshape(C, S * b), y.repeat(S))
        return logp.reshape(S, b).mean(0)
    if noise is not None:  # Gaussian, closed form (notes §2.5)
        return -0.5 * torch.log(2 * math.pi * noise) - 0.5 * ((y - mean[0]).square() + var[0]) \
            / noise
    return gauss_hermite(
        lambda f: likelihood.log_prob(f.reshape(1, -1), y.repeat_interleave(f.shape[-1]))
        .reshape(f.shape), mean[0], var[0], num_quadrature)


def draw(mean: Tensor, var: Tensor, num_samples: int,
         generator: torch.Generator | None) -> Tensor:
    """``num_samples`` draws of the marginals, (S, L, b), from ``generator``'s device."""
    eps = torch.randn((num_samples, *mean.shape), generator=generator,
                      device=getattr(generator, "device", mean.device), dtype=mean.dtype)
    return mean + var.clamp_min(VARIANCE_FLOOR).sqrt() * eps.to(mean.device)


def predictive(likelihood, mean: Tensor, var: Tensor, *, noise: Tensor | None,
               num_quadrature: int, eps: Tensor) -> Predictive:
    """The predictive of marginals (L, b): latent mean and variance, and the noise (regression)
    or the class probabilities (the softmax's by the fixed draws ``eps``, (S, L, 1))."""
    if isinstance(likelihood, RobustMax):
        probs = likelihood.probabilities(argmax_probabilities(mean, var, num_quadrature))
        return Predictive(mean.mT, var.mT, probs=(probs / probs.sum(0)).mT)
    if isinstance(likelihood, Softmax):
        probs = torch.softmax(mean + var.clamp_min(VARIANCE_FLOOR).sqrt() * eps, 1).mean(0)
        return Predictive(mean.mT, var.mT, probs=probs.mT)
    if noise is not None:
        return Predictive(mean[0], var[0], noise=noise)
    p1 = gauss_hermite(torch.sigmoid, mean[0], var[0], num_quadrature)
    return Predictive(mean[0], var[0], probs=torch.stack([1 - p1, p1], -1))
