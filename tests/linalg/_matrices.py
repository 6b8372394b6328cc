"""Test matrices with controlled spectra (float64)."""

from __future__ import annotations

import torch


def spd_with_spectrum(eigenvalues: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Q diag(eigenvalues) Qᵀ with a random orthogonal Q (n, n)."""
    n = eigenvalues.shape[0]
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=eigenvalues.dtype))
    return (Q * eigenvalues) @ Q.mT


def spd(n: int, condition_number: float, generator: torch.Generator) -> torch.Tensor:
    """SPD (n, n) with log-spaced eigenvalues from 1 to ``condition_number``."""
    return spd_with_spectrum(torch.logspace(0, torch.log10(torch.tensor(condition_number)), n,
                                            dtype=torch.float64), generator)


def rbf_gram(n: int, generator: torch.Generator, lengthscale: float = 0.5) -> torch.Tensor:
    """RBF kernel matrix (n, n) of n points in [0, 1]² (fast-decaying spectrum)."""
    x = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    return torch.exp(-0.5 * torch.cdist(x, x).square() / lengthscale**2)
