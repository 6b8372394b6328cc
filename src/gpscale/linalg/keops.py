"""The KeOps reduction behind ``kernel_matmul(..., backend='keops')`` (optional dependency)."""

from __future__ import annotations

import importlib.util

from torch import Tensor

__all__ = ["PROFILES", "product"]

PROFILES = {
    "rbf": lambda D2: (-0.5 * D2).exp(),
    "matern12": lambda D2: (-D2.sqrt()).exp(),
    "matern32": lambda D2: (1 + 3**0.5 * D2.sqrt()) * (-(3**0.5) * D2.sqrt()).exp(),
    "matern52": lambda D2: ((1 + 5**0.5 * D2.sqrt() + 5.0 / 3.0 * D2)
                            * (-(5**0.5) * D2.sqrt()).exp()),
}
"""The stationary profiles as functions of a KeOps squared-distance LazyTensor."""


def product(profile: str, z1: Tensor, z2: Tensor, rhs: Tensor) -> Tensor:
    """Φ(z1, z2) @ rhs for scaled inputs z1 (B, n1, d), z2 (B, n2, d) and rhs (B, n2, k), as
    one pykeops reduction (KeOps tiles on its own).

    Raises:
        ImportError: pykeops is not installed.
    """
    if importlib.util.find_spec("pykeops") is None:
        raise ImportError("backend='keops' needs the optional dependency pykeops: "
                          "pip install gpscale[keops] (or use backend='compiled' or 'eager')")
    from pykeops.torch import LazyTensor

    D2 = LazyTensor(z1[:, :, None, :]).sqdist(LazyTensor(z2[:, None, :, :]))
    return PROFILES[profile](D2) @ rhs
