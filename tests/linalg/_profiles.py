"""Dense references shared by the kernel-product tests: the stationary profiles as functions of
the distance r, and block-sparse actions as a dense matrix."""

from __future__ import annotations

import math

import torch

from gpscale.linalg.operators.block_sparse import BlockLayout

DENSE = {
    "rbf": lambda r: torch.exp(-0.5 * r.square()),
    "matern12": lambda r: torch.exp(-r),
    "matern32": lambda r: (1 + math.sqrt(3) * r) * torch.exp(-math.sqrt(3) * r),
    "matern52": lambda r: (1 + math.sqrt(5) * r + 5 / 3 * r.square())
    * torch.exp(-math.sqrt(5) * r),
}


def block_matrix(values: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """S (n, i) in block order from its definition: S[p, block(p)] = values[p]."""
    out = torch.zeros(layout.num_points, layout.num_blocks, dtype=values.dtype)
    out[torch.arange(layout.num_points), layout.block_ids()] = values
    return out
