"""The one boundary between gpscale and GPyTorch kernels.

Only this module may know about ``ScaleKernel``, lazy evaluation or private kernel methods.

``make_kernel`` builds the kernels the CLI and estimators name by string.
"""

from __future__ import annotations

import gpytorch
import torch
from gpytorch.kernels import Kernel

__all__ = ["KERNELS", "make_kernel", "kernel_matrix", "kernel_diag"]

_BASE_KERNELS = {
    "rbf": gpytorch.kernels.RBFKernel,
    "matern12": lambda **kw: gpytorch.kernels.MaternKernel(nu=0.5, **kw),
    "matern32": lambda **kw: gpytorch.kernels.MaternKernel(nu=1.5, **kw),
    "matern52": lambda **kw: gpytorch.kernels.MaternKernel(nu=2.5, **kw),
}
KERNELS = tuple(_BASE_KERNELS)


def make_kernel(name: str = "matern32", num_dims: int = 1, *, ard: bool = True,
                batch_shape: torch.Size = torch.Size()) -> Kernel:
    """A scaled stationary kernel: ``ScaleKernel(base(ard_num_dims=num_dims if ard))``.

    Args:
        name: one of ``KERNELS``.
        num_dims: input dimension d (one lengthscale per dimension when ``ard``).
        ard: automatic relevance determination (a lengthscale per input dimension).
        batch_shape: kernel batch shape, e.g. ``torch.Size([C])`` for C independent GPs.
    """
    if name not in _BASE_KERNELS:
        raise ValueError(f"unknown kernel {name!r}; valid kernels: {', '.join(KERNELS)}")
    base = _BASE_KERNELS[name](ard_num_dims=num_dims if ard else None, batch_shape=batch_shape)
    return gpytorch.kernels.ScaleKernel(base, batch_shape=batch_shape)


def kernel_matrix(kernel: Kernel, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """Dense kernel matrix K(x1, x2) as a plain tensor (n1, n2)."""
    return kernel(x1, x2).to_dense()


def kernel_diag(kernel: Kernel, x: torch.Tensor) -> torch.Tensor:
    """Diagonal k(x_j, x_j) (n,) without forming the matrix."""
    return kernel(x, diag=True)
