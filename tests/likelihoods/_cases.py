"""Likelihoods with random latent values and valid targets for the shared tests (float64)."""

from __future__ import annotations

import torch

from gpscale.likelihoods import Bernoulli, Gaussian, Poisson, Softmax

N = 7


def case(name: str, generator: torch.Generator):
    """(likelihood, f (L, n), y (n,))."""
    if name == "gaussian":
        noise = 0.1 + torch.rand(N, generator=generator, dtype=torch.float64)
        return Gaussian(noise), torch.randn(1, N, generator=generator), torch.randn(
            N, generator=generator)
    if name == "bernoulli":
        return (Bernoulli(), 2 * torch.randn(1, N, generator=generator),
                torch.randint(0, 2, (N,), generator=generator))
    if name == "poisson":
        return (Poisson(), torch.randn(1, N, generator=generator),
                torch.randint(0, 6, (N,), generator=generator).double())
    if name == "softmax":
        return (Softmax(4), 2 * torch.randn(4, N, generator=generator),
                torch.randint(0, 4, (N,), generator=generator))
    raise KeyError(name)


NAMES = ("gaussian", "bernoulli", "poisson", "softmax")
