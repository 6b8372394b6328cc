"""SoftKI's softmax interpolation weights and the scaling of their distances (notes/003 §2.2).

:class:`SoftmaxInterpolation` is Def. 4.1 with a temperature; :func:`distance_scale` gives the
per-input divisor that makes the distances follow the kernel's ARD lengthscales (see
:mod:`gpscale.methods.softki.model` for why and for the measurements).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gpytorch
import torch
from torch import Tensor

__all__ = ["DISTANCES", "OBJECTIVES", "SoftmaxInterpolation", "check_options", "distance_scale"]

OBJECTIVES = ("pseudoloss", "mll")

DISTANCES = ("relative", "lengthscale", "euclidean")


@dataclass(frozen=True)
class SoftmaxInterpolation:
    """Softmax interpolation weights W_ij = softmax_j(−‖x_i − z_j‖₂ / τ) (Def. 4.1, §2.2).

    τ → 0 gives one-hot weights on the nearest point, τ → ∞ uniform weights 1/m.

    Args:
        temperature: τ > 0 (1 is the paper's definition).

    Example:
        >>> w = SoftmaxInterpolation()(torch.zeros(2, 3), torch.randn(5, 3))
        >>> w.shape, bool(torch.allclose(w.sum(1), torch.ones(2)))
        (torch.Size([2, 5]), True)
    """

    temperature: float = 1.0

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature > 0):
            raise ValueError(f"temperature must be a positive finite number; got "
                             f"{self.temperature!r}")

    def __call__(self, x: Tensor, z: Tensor, scale: Tensor | None = None) -> Tensor:
        """(n, m) weights of x (n, d) on z (m, d); O(n m d). Differentiable in x, z and scale.

        ``scale`` (broadcastable to (d,)): distances are taken between x / scale and z / scale
        (``None``: plain Euclidean, the paper's).

        The logits are −(‖x_i − z_j‖ − s_i)/τ, shifted by a row constant s_i (softmax ignores
        it) and computed without forming and cancelling ‖x_i‖² (:class:`_ShiftedDistance`): a
        row far from z keeps its exact limit softmax_j(x̂_iᵀz_j/τ) (the expansion gave rounding
        noise at 10²⁰ and NaN at 10²⁰⁰), and each row's weights depend on it alone.
        """
        shift = z.detach().mean(0, keepdim=True)  # distances are translation invariant
        xs, zs = x - shift, z - shift
        if scale is not None:
            scale = scale.reshape(-1).to(xs.dtype)
            xs, zs = xs / scale, zs / scale
        return torch.softmax(_ShiftedDistance.apply(xs, zs) / -self.temperature, dim=-1)


class _ShiftedDistance(torch.autograd.Function):
    """‖x_i − z_j‖ − s_i (n, m) with s_i = (‖x_i‖² + 1)^½, for x (n, d) and z (m, d).

    D²_ij comes from the norm expansion as before; the value is b_ij / (D_ij + s_i) with b_ij =
    ‖z_j‖² − 1 − 2 x_iᵀz_j = D²_ij − s_i², formed without ‖x_i‖², so that it stays exact far
    away (→ −x̂_iᵀz_j) where D − s would cancel. Each row is taken in units of a power of two
    near its largest coordinate, so nothing overflows; the scalings are exact, so D² is the old
    expansion's number (0 where x_i = z_j). Backward by hand: with H = Ḡ / D (0 where D² hit
    its clamp), x̄ = diag(H 1 − Ḡ 1 / s) x − H z and z̄ = diag(Hᵀ 1) z − Hᵀ x.
    """

    @staticmethod
    def forward(ctx, x: Tensor, z: Tensor) -> Tensor:
        unit = _unit(x)
        x_unit = x / unit  # (n, d), |x_unit| < 2
        inv2 = unit.reciprocal().square()  # (n, 1); 0 where it underflows (negligible there)
        zz = z.square().sum(-1)[None, :]  # (1, m)
        xx = x_unit.square().sum(-1, keepdim=True)  # (n, 1)
        G2 = torch.mm(x_unit * (-2.0 / unit), z.mT)  # −2 xᵀz / unit² (n, m)
        sq = (G2 + xx).addcmul_(inv2, zz)  # D² / unit²
        b = G2.addcmul_(inv2, zz - 1.0)  # (D² − s²) / unit²
        # clamp: rounding can make D² slightly negative; below `tiny` the gradient is 0
        dist = sq.clamp_min_(torch.finfo(sq.dtype).tiny).sqrt_()  # D / unit
        s = (xx + inv2).sqrt_()  # s / unit
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(x, z, dist * unit, s * unit)
        return b.div_(dist.add_(s)).mul_(unit)  # D − s

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, z, dist, s = ctx.saved_tensors
        # 0 where D²/unit² hit its clamp (dist = √tiny · unit exactly: the scalings are powers
        # of two), as the clamp's own gradient is; comparing D with √tiny alone let a coincident
        # pair of a row with |x| > 1 through as Ḡ / 1e-19 (a SoftKI fit then stopped far short
        # of its converged error)
        floor = torch.finfo(dist.dtype).tiny ** 0.5 * _unit(x)  # (n, 1)
        H = torch.where(dist > floor, grad / dist, 0.0)  # (n, m)
        rows = H.sum(-1, keepdim=True) - grad.sum(-1, keepdim=True) / s  # (n, 1)
        return rows * x - H @ z, H.sum(0)[:, None] * z - H.mT @ x


def _unit(x: Tensor) -> Tensor:
    """Per row of x (n, d), a power of two near its largest |coordinate| (at least 1), (n, 1)."""
    return torch.exp2(torch.floor(torch.log2(x.abs().amax(-1, keepdim=True).clamp_min(1.0))))


def distance_scale(kernel: gpytorch.kernels.Kernel, distance: str,
                   temperature: Tensor | None = None,
                   num_dims: int | None = None) -> Tensor | None:
    """Per-input divisor of the softmax distances (``None``: Euclidean, the paper's).

    ``'lengthscale'``: the kernel's lengthscales ℓ; ``'relative'``: ℓ · rms(1/ℓ), i.e. the
    inverse lengthscales rescaled to a root mean square of 1 — the paper's weights when all
    lengthscales are equal, while an input the kernel finds irrelevant (large ℓ) drops out of
    the distances as it drops out of K_zz. ``temperature`` (a factor of τ) multiplies it.

    A composed kernel (leaves with ``active_dims``, :func:`composed_lengthscale`) gives each of
    its ``num_dims`` inputs the lengthscale its leaves give it together.
    """
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; valid: {', '.join(DISTANCES)}")
    if distance == "euclidean":
        return temperature
    ell = (composed_lengthscale(kernel, num_dims) if _has_active_dims(kernel)
           else _lengthscale(kernel))
    if distance == "relative":
        ell = ell * ell.reciprocal().square().mean().sqrt()
    return ell if temperature is None else ell * temperature


def _lengthscale(kernel: gpytorch.kernels.Kernel) -> Tensor:
    """The lengthscale(s) of a stationary kernel, possibly wrapped in a ScaleKernel."""
    base = getattr(kernel, "base_kernel", kernel)
    ell = getattr(base, "lengthscale", None)
    if ell is None:
        raise ValueError(f"distance scaling needs a kernel with lengthscales; "
                         f"{type(base).__name__} has none (use distance='euclidean')")
    return ell.reshape(-1)


def _has_active_dims(kernel: gpytorch.kernels.Kernel) -> bool:
    return any(isinstance(m, gpytorch.kernels.Kernel) and m.active_dims is not None
               for m in kernel.modules())


def composed_lengthscale(kernel: gpytorch.kernels.Kernel, num_dims: int | None) -> Tensor:
    """Per-input lengthscales (num_dims,) of a composed kernel for the softmax distances.

    Softmax interpolation is a local average over learned points and admits any kernel for
    K_zz; only the distances need a length per input. An input's is ℓ_eff with
    1/ℓ_eff² = Σ 1/ℓ_l² over the leaves on it that have a lengthscale (a product's curvatures
    add; so do a sum's where both parts vary); an input only a leaf without one (linear,
    polynomial, constant) reads gets the median of the others (neither dominant nor ignored);
    an input no leaf reads gets ∞ and drops out of the distances, as it is out of K_zz.

    Raises:
        ValueError: no leaf has a lengthscale (use ``distance='euclidean'``), or no num_dims.
    """
    if num_dims is None:
        raise ValueError("a composed kernel's distance scale needs the number of inputs")
    device = next(iter(kernel.parameters())).device
    inverse = torch.zeros(num_dims, dtype=torch.float64, device=device)
    covered = torch.zeros(num_dims, dtype=torch.bool, device=device)
    read = torch.zeros(num_dims, dtype=torch.bool, device=device)
    for leaf in kernel.modules():
        if not isinstance(leaf, gpytorch.kernels.Kernel) or leaf.active_dims is None:
            continue
        dims = leaf.active_dims.to(device)
        read[dims] = True
        ell = leaf.lengthscale if leaf.has_lengthscale else None
        if ell is None:
            continue
        inverse = inverse.index_add(0, dims, ell.reshape(-1).to(inverse.dtype)
                                    .expand(len(dims)).reciprocal().square())
        covered[dims] = True
    if not bool(covered.any()):
        raise ValueError("distance scaling needs a kernel with lengthscales; no leaf of this "
                         "kernel has one (use distance='euclidean')")
    ell = inverse.clamp_min(1e-300).rsqrt()
    neutral = ell[covered].detach().median()
    ell = torch.where(covered, ell, torch.where(read, neutral, torch.full_like(ell, math.inf)))
    return ell.to(next(iter(kernel.parameters())).dtype)


def check_options(*, noise: float, objective: str, num_probes: int, chunk_size: int,
                  distance: str = "euclidean") -> None:
    """Raise a ValueError naming the first invalid SoftKI option."""
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; valid: {', '.join(DISTANCES)}")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    if not (isinstance(noise, (int, float)) and math.isfinite(noise) and noise > 0):
        raise ValueError(f"noise must be a positive finite variance; got {noise!r}")
    if not isinstance(num_probes, int) or num_probes < 1:
        raise ValueError(f"num_probes must be an integer ≥ 1; got {num_probes!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer ≥ 1; got {chunk_size!r}")
