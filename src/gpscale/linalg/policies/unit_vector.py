r"""Unit-vector policy: the j-th action is a unit vector e_{π(j)} (Wenger et al. 2022b, Tab. 1).

With these actions an iterative (probabilistic) solver conditions on one data point per
iteration, so after j iterations it has the exact GP posterior on the first j points of the order
π: a subset of data, computed as a partial Cholesky factorisation (IterNCGP-Chol, notes/000 §5).

Layout: the residual of the step is (n,) for one latent function or (L, n) for L latent functions
(latent-major). Entries are visited data point by data point, all L latents of a point in a row,
so after j = L·m actions the solver holds the first m data points with all their latents. The
point order is 0, 1, …, n−1, or a random permutation drawn from ``seed``.

Cost per action: O(n) (the permutation is redrawn from its seed; no state is kept).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.linalg.solvers.base import SolverStep

__all__ = ["UnitVectorPolicy"]


@dataclass(frozen=True)
class UnitVectorPolicy:
    """Actions e_{π(j)}: data points in order (``seed=None``) or in a seeded random order.

    Args:
        seed: seeds the random order of the data points; ``None`` keeps their order.

    Example:
        >>> import torch
        >>> from gpscale.linalg.solvers import SolverStep
        >>> r = torch.ones(2, 3)  # L = 2 latents, n = 3 points
        >>> step = SolverStep(3, r, r, r.norm(), r, None, torch.tensor(False))
        >>> UnitVectorPolicy()(step)  # action 3: point 3 // 2 = 1, latent 3 % 2 = 1
        tensor([[0., 0., 0.],
                [0., 1., 0.]])
    """

    seed: int | None = None

    def order(self, n: int) -> Tensor:
        """The data-point order π (n,) (on the CPU)."""
        if self.seed is None:
            return torch.arange(n)
        return torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))

    def __call__(self, step: SolverStep) -> Tensor | None:
        """The unit vector for action number ``step.iteration`` (0-based), shaped like the residual.

        Returns:
            e with the residual's shape, dtype and device; ``None`` once all n·L unit vectors
            have been used.
        """
        r = step.residual
        num_latents, n = (1, r.shape[0]) if r.dim() == 1 else r.shape
        j = int(step.iteration)
        if j >= num_latents * n:
            return None
        point = int(self.order(n)[j // num_latents])
        e = torch.zeros_like(r)
        if r.dim() == 1:
            e[point] = 1
        else:
            e[j % num_latents, point] = 1
        return e
