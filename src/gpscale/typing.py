"""Shape-annotated tensor aliases used across gpscale (jaxtyping)."""

from __future__ import annotations

from jaxtyping import Float, Int
from torch import Tensor

__all__ = ["Float", "Int", "Tensor"]
