r"""Images as rows of a data matrix, and their patches.

An image of height H, width W and C channels is one row of d = H·W·C numbers in channel-last
order (row-major over H, then W, then C: the layout of ``numpy.reshape(N, -1)`` of an (N, H, W, C)
array, and of MNIST's (N, 28, 28) with C = 1). :class:`PatchGeometry` says how the patches of a
convolutional kernel are cut: square ``patch`` × ``patch`` windows moved by ``stride``, over the
image padded with ``padding`` zeros on every side. Patch p covers all C channels; its vector
is channel-first (C·patch² numbers, as ``torch.nn.functional.unfold`` orders them) and its
location is its (row, column) on the grid of patch positions, counted from 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ImageShape", "PatchGeometry", "infer_image_shape"]


@dataclass(frozen=True)
class ImageShape:
    """Height, width and channels of the images whose flattened rows a model sees."""

    height: int
    width: int
    channels: int = 1

    def __post_init__(self):
        for name in ("height", "width", "channels"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"image {name} must be at least 1; got {getattr(self, name)}")

    @property
    def size(self) -> int:
        """d = H·W·C."""
        return self.height * self.width * self.channels

    def as_list(self) -> list[int]:
        return [self.height, self.width, self.channels]


def infer_image_shape(num_dims: int, given: list[int] | tuple[int, ...] | None = None
                      ) -> ImageShape:
    """The image shape of rows of ``num_dims`` numbers.

    ``given`` is [H, W] or [H, W, C]; without it, a square grey image when d is a square
    (MNIST: 784 = 28²) and a square colour image when d/3 is (CIFAR-10: 3072 = 3·32²); a
    number cannot be both (3 is not a square). Anything else asks for ``image_shape``.

    Raises:
        ValueError: when ``given`` does not multiply out to d, or d fits no square image.
    """
    if given is not None:
        dims = [int(v) for v in given]
        if len(dims) not in (2, 3):
            raise ValueError(f"image_shape must be H,W or H,W,C; got {given}")
        shape = ImageShape(*dims)
        if shape.size != num_dims:
            raise ValueError(f"image_shape {','.join(map(str, dims))} holds {shape.size} numbers "
                             f"but the inputs have {num_dims} columns")
        return shape
    for channels in (1, 3):
        if num_dims % channels == 0:
            side = math.isqrt(num_dims // channels)
            if side * side * channels == num_dims:
                return ImageShape(side, side, channels)
    raise ValueError(f"{num_dims} input columns are not a square grey (H·H) or colour (3·H·H) "
                     "image; give image_shape=H,W or H,W,C")


@dataclass(frozen=True)
class PatchGeometry:
    """How a convolutional kernel cuts an image into patches.

    Attributes:
        image: the image shape.
        patch: side of the square patches.
        stride: step between patch positions (both directions).
        padding: zeros added on every side before cutting.
    """

    image: ImageShape
    patch: int = 5
    stride: int = 1
    padding: int = 0

    def __post_init__(self):
        if self.patch < 1 or self.stride < 1 or self.padding < 0:
            raise ValueError(f"patch size and stride must be at least 1 and padding at least 0; "
                             f"got {self.patch}, {self.stride}, {self.padding}")
        if self.patch > min(self.image.height, self.image.width) + 2 * self.padding:
            raise ValueError(f"patch size {self.patch} exceeds the padded image "
                             f"({self.image.height}×{self.image.width}, padding {self.padding})")

    @property
    def grid(self) -> tuple[int, int]:
        """Patch positions down and across."""
        def count(side: int) -> int:
            return (side + 2 * self.padding - self.patch) // self.stride + 1
        return count(self.image.height), count(self.image.width)

    @property
    def num_patches(self) -> int:
        """P, patches per image."""
        rows, cols = self.grid
        return rows * cols

    @property
    def patch_dims(self) -> int:
        """Numbers per patch: C·patch²."""
        return self.image.channels * self.patch * self.patch

    def patches(self, x: Tensor) -> Tensor:
        """The patches of images ``x`` (b, d): (b, P, C·patch²)."""
        shape = self.image
        images = x.reshape(x.shape[0], shape.height, shape.width, shape.channels)
        cols = F.unfold(images.permute(0, 3, 1, 2), self.patch, padding=self.padding,
                        stride=self.stride)  # (b, C·patch², P)
        return cols.mT

    def locations(self, like: Tensor) -> Tensor:
        """(row, column) of every patch position (P, 2), in ``like``'s dtype and device."""
        rows, cols = self.grid
        r = torch.arange(rows, dtype=like.dtype, device=like.device)
        c = torch.arange(cols, dtype=like.dtype, device=like.device)
        return torch.cartesian_prod(r, c).reshape(rows * cols, 2)
