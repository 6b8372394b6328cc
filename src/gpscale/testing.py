"""Helpers the test suite shares (and that users testing their own methods may reuse).

- :data:`SMALL_OPTIONS`: per method key, options small enough that the method builds on a few
  dozen points in well under a second (the Laplace methods get a fixed kernel so no SVGP
  pre-fit runs).
- :func:`toy_problem`: a seeded 2-D problem for any task (regression, classification, counts).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["SMALL_OPTIONS", "toy_problem"]

SMALL_OPTIONS: dict[str, dict] = {
    "svgp": {"num_inducing": 8}, "sgpr": {"num_inducing": 8}, "softki": {"num_inducing": 8},
    "solvegp": {"num_inducing": 6, "num_orthogonal": 6},
    "cagp-opt": {"num_actions": 8}, "cagp-cg": {"num_actions": 8},
    "ski": {"grid_size": 12}, "ggp": {"grid_size": 12},
    "iterncgp": {"lengthscale": 0.8, "outputscale": 2.0},
    "sod-laplace": {"lengthscale": 0.8, "outputscale": 2.0, "num_subset": 30},
    "exact": {}, "cggp": {},
}


def toy_problem(task: str = "regression", n: int = 60, *, seed: int = 3
                ) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, y, x_test)`` in float64: x uniform on [-1, 1]², f = sin 3x₁ · cos 2x₂, and y = f
    plus 0.1 noise (regression), 1{f > 0} (classification) or Poisson(exp f) (counts)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64) * 2 - 1
    f = torch.sin(3 * x[:, 0]) * torch.cos(2 * x[:, 1])
    if task == "classification":
        y = (f > 0).long()
    elif task == "counts":
        y = torch.poisson(torch.exp(f), generator=g)
    else:
        y = f + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    x_test = torch.rand(9, 2, generator=g, dtype=torch.float64) * 2 - 1
    return x, y, x_test
