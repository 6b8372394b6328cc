r"""The kernel K_G on a regular grid and its FFT products (notes/002 §3.3).

- :class:`GridKernel`: K_G for a stationary kernel on the grid. For a product kernel (RBF with ARD,
  or any profile in 1-D) K_G = s ⊗_j T_j with symmetric Toeplitz T_j, and each factor acts along
  its mode by an FFT of its circulant embedding (size 2 m_j): O(m Σ_j log m_j). GPyTorch's Matérn
  with d > 1 is stationary but not a product, so K_G is multilevel (block) Toeplitz and acts by a
  d-dimensional FFT of the embedding (size 2^d m): O(2^d m log m). The output scale s multiplies
  once (the reference code applies it per factor, s^d: notes §3.3, §11.16).
- :func:`grid_kernel` builds it from a :class:`~gpscale.linalg.interpolation.Grid` and the kernel's
  hyperparameters, differentiably.
- :func:`evaluated_grid_kernel` builds it for any stationary kernel k(x − x') from the kernel's
  values at the grid's offsets (periodic, rational quadratic, products of different kinds):
  Toeplitz in 1-D, multilevel Toeplitz beyond.

The kernel factors follow the hyperparameters' dtype upcast to float64 (the m-dimensional solves
are float64, notes §9.2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from gpscale.linalg.interpolation import Grid, Interpolation

__all__ = ["PROFILES", "GridKernel", "grid_kernel", "evaluated_grid_kernel"]

PROFILES = ("rbf", "matern12", "matern32", "matern52")

_F64 = torch.float64


def _profile(name: str, r2: Tensor) -> Tensor:
    """Stationary profile φ at squared scaled distance r² (GPyTorch's conventions)."""
    if name == "rbf":
        return torch.exp(-0.5 * r2)
    pos = r2 > 0
    r = torch.where(pos, torch.sqrt(torch.where(pos, r2, torch.ones_like(r2))), 0.0)
    if name == "matern12":
        return torch.exp(-r)
    if name == "matern32":
        r = math.sqrt(3.0) * r
        return (1 + r) * torch.exp(-r)
    if name == "matern52":
        r = math.sqrt(5.0) * r
        return (1 + r + r * r / 3) * torch.exp(-r)
    raise ValueError(f"unknown kernel profile {name!r}; valid: {', '.join(PROFILES)}")


@dataclass(frozen=True)
class GridKernel:
    """K_G on a grid: ``outputscale · ⊗_j T_j`` (``kron``) or multilevel Toeplitz (``bttb``).

    Attributes:
        sizes: (m_1..m_d).
        structure: ``'kron'`` or ``'bttb'``.
        spectra: circulant-embedding spectra: per dimension (m_j + 1,) for kron; one tensor
            (2m_1, …, 2m_{d−1}, m_d + 1) for bttb (the rfftn half spectrum); float64 or complex.
        outputscale: scalar s (float64), applied once.
        local: (q^d,) kernel values at local offsets {−(s−1)..s−1}^d (for w_*ᵀ K_G w_*).
    """

    sizes: tuple[int, ...]
    structure: str
    spectra: tuple[Tensor, ...]
    outputscale: Tensor
    local: Tensor

    @property
    def num_grid(self) -> int:
        return math.prod(self.sizes)

    def matmul(self, v: Tensor) -> Tensor:
        """K_G v for v (m,) or (m, k) by FFTs: O(m log m) per column; differentiable."""
        single = v.dim() == 1
        V = (v[:, None] if single else v).to(_F64)
        k = V.shape[1]
        X = V.T.reshape(k, *self.sizes)
        if self.structure == "kron":
            for j, m_j in enumerate(self.sizes):
                X = X.movedim(j + 1, -1)
                F = torch.fft.rfft(X, n=2 * m_j)
                X = torch.fft.irfft(F * self.spectra[j], n=2 * m_j)[..., :m_j]
                X = X.movedim(-1, j + 1)
        else:
            dims = tuple(range(1, len(self.sizes) + 1))
            shape = [2 * m for m in self.sizes]
            F = torch.fft.rfftn(X, s=shape, dim=dims)
            X = torch.fft.irfftn(F * self.spectra[0], s=shape, dim=dims)
            X = X[(slice(None),) + tuple(slice(0, m) for m in self.sizes)]
        out = self.outputscale * X.reshape(k, -1).T
        return out[:, 0] if single else out

    def to_dense(self) -> Tensor:
        """Dense K_G (m, m) by products with the identity; for tests and small m."""
        return self.matmul(torch.eye(self.num_grid, dtype=_F64, device=self.local.device))

    def interp_quad(self, rows: Interpolation, pairs: Tensor) -> Tensor:
        """w_iᵀ K_G w_i per row (n,): all s^d nodes of a row are within the local offsets."""
        K_loc = self.local[pairs]  # (S, S)
        return torch.einsum("ns,st,nt->n", rows.weight, K_loc, rows.weight)


def _embedding_column(t: Tensor) -> Tensor:
    """Circulant embedding [t_0..t_{M−1}, 0, t_{M−1}..t_1] (2M,) of a symmetric Toeplitz column."""
    return torch.cat([t, t.new_zeros(1), t[1:].flip(0)])


def grid_kernel(grid: Grid, profile: str, lengthscale: Tensor, outputscale: Tensor,
                structure: str | None = None, per_input: bool = False) -> GridKernel:
    """K_G of ``outputscale · φ(‖(x − x')/ℓ‖²)`` on ``grid``; differentiable in ℓ and s.

    Args:
        grid: the grid.
        profile: one of :data:`PROFILES` (GPyTorch's RBF and Matérn ν = ½, 3/2, 5/2).
        lengthscale: (d,) or scalar ℓ.
        outputscale: scalar s.
        structure: ``'kron'`` (exact for RBF, or any profile when d = 1) or ``'bttb'`` (exact for
            any stationary profile); default: kron where it is exact, else bttb.
        per_input: the kernel is the product of the profile on each input alone,
            ``s · Π_j φ((x_j − x'_j)²/ℓ_j²)`` (a product of one-input kernels; the same as
            ``per_input=False`` for RBF), a Kronecker product for any profile.

    Raises:
        ValueError: an unknown profile or structure, or ``'kron'`` for a non-product kernel.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown kernel profile {profile!r}; valid: {', '.join(PROFILES)}")
    d = grid.num_dims
    separable = profile == "rbf" or d == 1 or per_input
    structure = structure or ("kron" if separable else "bttb")
    if structure not in ("kron", "bttb"):
        raise ValueError(f"unknown K_G structure {structure!r}; valid: kron, bttb")
    if structure == "kron" and not separable:
        raise ValueError(f"the {profile} kernel is not a product over dimensions for d = {d}; "
                         "use structure='bttb'")
    ell = lengthscale.to(_F64).reshape(-1).expand(d)
    scale = outputscale.to(_F64).reshape(())
    q = 2 * grid.support - 1
    device = ell.device  # the spectra live with the hyperparameters
    delta = torch.arange(q, dtype=_F64, device=device) - (grid.support - 1)
    local_axes = [(delta * grid.spacing[j] / ell[j]) ** 2 for j in range(d)]
    if per_input and d > 1:
        local = scale * math.prod(torch.meshgrid(*[_profile(profile, a) for a in local_axes],
                                                 indexing="ij")).reshape(-1)
    else:
        local_r2 = sum(torch.meshgrid(*local_axes, indexing="ij")) if d > 1 else local_axes[0]
        local = scale * _profile(profile, local_r2).reshape(-1)
    if structure == "kron":
        spectra = []
        for j, m_j in enumerate(grid.sizes):
            lag = torch.arange(m_j, dtype=_F64, device=device) * grid.spacing[j] / ell[j]
            t = _profile("rbf", lag**2) if d > 1 and not per_input else _profile(profile, lag**2)
            spectra.append(torch.fft.rfft(_embedding_column(t)).real)
        return GridKernel(grid.sizes, "kron", tuple(spectra), scale, local)
    axes = []
    for j, m_j in enumerate(grid.sizes):
        axes.append((_lags(m_j, grid.spacing[j], device) / ell[j]) ** 2)
    r2 = sum(torch.meshgrid(*axes, indexing="ij"))
    column = _profile(profile, r2)
    # The wrap-around entries (index m_j in some dimension) never meet an un-padded input.
    spectrum = torch.fft.rfftn(column).real
    return GridKernel(grid.sizes, "bttb", (spectrum,), scale, local)


def _lags(m: int, spacing: float, device) -> Tensor:
    """The offsets of a circulant embedding of size 2m along one axis: 0..m, then −(m−1)..−1,
    times the grid spacing."""
    p = torch.arange(2 * m, device=device)
    return torch.where(p <= m, p, p - 2 * m).to(_F64) * spacing


def evaluated_grid_kernel(grid: Grid, stationary: Callable[[Tensor], Tensor],
                          device=None) -> GridKernel:
    """K_G of a stationary kernel on ``grid`` from its values at offsets: ``stationary(τ)``
    maps offsets τ (P, d) in float64 to k(τ, 0) (P,), outputscale included, differentiably.

    With one input the kernel is one symmetric Toeplitz factor (``kron``, so a Kronecker
    preconditioner can take it); with more, multilevel Toeplitz (``bttb``): exact for any
    stationary kernel, a product of kernels of different kinds or a kernel of the joint
    distance alike. Its cost is the embedding's: 2^d m evaluations once, then FFTs of that size.
    """
    d = grid.num_dims
    q = 2 * grid.support - 1
    delta = torch.arange(q, dtype=_F64, device=device) - (grid.support - 1)
    local_axes = [delta * grid.spacing[j] for j in range(d)]
    local = stationary(torch.cartesian_prod(*local_axes).reshape(-1, d)).to(_F64)
    one = torch.ones((), dtype=_F64, device=local.device)
    if d == 1:
        m = grid.sizes[0]
        lag = torch.arange(m, dtype=_F64, device=device) * grid.spacing[0]
        t = stationary(lag[:, None]).to(_F64)
        return GridKernel(grid.sizes, "kron", (torch.fft.rfft(_embedding_column(t)).real,),
                          one, local)
    axes = [_lags(m, grid.spacing[j], device) for j, m in enumerate(grid.sizes)]
    column = stationary(torch.cartesian_prod(*axes)).to(_F64).reshape(
        [2 * m for m in grid.sizes])
    # The wrap-around entries (index m_j in some dimension) never meet an un-padded input.
    return GridKernel(grid.sizes, "bttb", (torch.fft.rfftn(column).real,), one, local)
