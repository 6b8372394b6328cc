"""GPyTorch kernels of a parsed kernel expression (:mod:`gpscale.kernels.algebra`).

:func:`build_kernel` turns a :class:`~gpscale.kernels.algebra.KernelSpec` into GPyTorch's own
composition: ``AdditiveKernel`` of ``ScaleKernel(ProductKernel(leaves))``, each leaf with
``active_dims`` on its inputs, so that every method that evaluates kernels through GPyTorch
(or through :func:`gpscale.kernels.kernel_matrix`'s fallback) takes it. Start values not given
in the expression: outputscale the target's variance shared equally by the terms, stationary
lengthscales √(inputs of the leaf), period 1 and periodic lengthscale 1, rational-quadratic α 1,
polynomial degree 2 and offset 1 (in the standardised units the methods see).

:func:`standardised` rewrites an expression's start values from the units of the data as read
into those of standardised inputs and targets, and its header names into input indices.
"""

from __future__ import annotations

import math
from dataclasses import replace

import gpytorch
import torch
from gpytorch.kernels import Kernel

from gpscale.kernels.algebra import KernelSpec, Leaf, parse_kernel
from gpscale.linalg.composed import ComposedLeaf, ComposedTerm

__all__ = ["build_kernel", "composed_terms", "standardised", "DEFAULT_DEGREE"]

DEFAULT_DEGREE = 2
_NO_BATCH = torch.Size()
_MATERN_NU = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}
_PROFILE_OF_NU = {nu: name for name, nu in _MATERN_NU.items()}


def build_kernel(spec: KernelSpec | str, num_dims: int, *, names: list[str] | None = None,
                 batch_shape: torch.Size = _NO_BATCH, outputscale: float = 1.0) -> Kernel:
    """The GPyTorch kernel of ``spec`` on ``num_dims`` inputs (module docstring).

    Args:
        spec: a parsed expression or its text.
        num_dims: d. names: the inputs' names, for columns given by name.
        batch_shape: as :func:`gpscale.kernels.make_kernel`.
        outputscale: the total prior variance the terms without their own share equally.
    """
    spec = parse_kernel(spec) if isinstance(spec, str) else spec
    columns = spec.resolve(num_dims, names)
    terms = []
    for term, cols in zip(spec.terms, columns, strict=True):
        leaves = [_leaf(leaf, idx, batch_shape) for leaf, idx in zip(term, cols, strict=True)]
        base = leaves[0] if len(leaves) == 1 else gpytorch.kernels.ProductKernel(*leaves)
        scaled = gpytorch.kernels.ScaleKernel(base, batch_shape=batch_shape)
        given = [leaf.values["outputscale"] for leaf in term if "outputscale" in leaf.values]
        scaled.outputscale = math.prod(given) if given else outputscale / len(spec.terms)
        terms.append(scaled)
    return terms[0] if len(terms) == 1 else gpytorch.kernels.AdditiveKernel(*terms)


def _leaf(leaf: Leaf, idx: list[int], batch_shape: torch.Size) -> Kernel:
    dims = torch.tensor(idx, dtype=torch.long)
    k = len(idx)
    v = leaf.values
    if leaf.name == "rbf":
        kernel = gpytorch.kernels.RBFKernel(ard_num_dims=k, active_dims=dims,
                                            batch_shape=batch_shape)
    elif leaf.name in _MATERN_NU:
        kernel = gpytorch.kernels.MaternKernel(nu=_MATERN_NU[leaf.name], ard_num_dims=k,
                                               active_dims=dims, batch_shape=batch_shape)
    elif leaf.name == "rq":
        kernel = gpytorch.kernels.RQKernel(ard_num_dims=k, active_dims=dims,
                                           batch_shape=batch_shape)
        kernel.alpha = v.get("alpha", 1.0)
    elif leaf.name == "periodic":
        kernel = gpytorch.kernels.PeriodicKernel(ard_num_dims=k, active_dims=dims,
                                                 batch_shape=batch_shape)
        kernel.period_length = v.get("period", 1.0)
        kernel.lengthscale = v.get("lengthscale", 1.0)
        return kernel
    elif leaf.name == "linear":
        kernel = gpytorch.kernels.LinearKernel(active_dims=dims, batch_shape=batch_shape)
        kernel.variance = 1.0
        return kernel
    elif leaf.name == "poly":
        kernel = gpytorch.kernels.PolynomialKernel(
            power=int(v.get("degree", DEFAULT_DEGREE)), active_dims=dims,
            batch_shape=batch_shape)
        kernel.offset = v.get("offset", 1.0)
        return kernel
    else:  # constant
        return gpytorch.kernels.ConstantKernel(batch_shape=batch_shape)
    kernel.lengthscale = v.get("lengthscale", math.sqrt(k))
    return kernel


def standardised(spec: KernelSpec | str, *, names: list[str] | None, num_dims: int,
                 x_scale: list[float] | None, y_var: float = 1.0,
                 kept: list[int] | None = None) -> KernelSpec:
    """``spec`` with columns as the model's input indices and start values in standardised
    units.

    Args:
        names: the names of the ``num_dims`` inputs as read (columns by name), or ``None``.
        x_scale: the standard deviation each model input was divided by (``None``: unscaled).
        y_var: the variance the targets were divided by.
        kept: the inputs (as read) the model sees, in order, where constant ones were dropped;
            ``None``: all.

    Lengthscales (of stationary leaves) and periods divide by their inputs' scale, which must
    be the same for all of a leaf's inputs when one value is given; outputscales divide by
    ``y_var``.

    Raises:
        ValueError: as :meth:`KernelSpec.resolve`; a leaf on a dropped (constant) input; one
            start value for inputs of different scales.
    """
    spec = parse_kernel(spec) if isinstance(spec, str) else spec
    kept = list(range(num_dims)) if kept is None else list(kept)
    position = {j: k for k, j in enumerate(kept)}
    terms = []
    for term, cols in zip(spec.terms, spec.resolve(num_dims, names), strict=True):
        leaves = []
        for leaf, idx in zip(term, cols, strict=True):
            if leaf.columns is not None:
                gone = [j for j in idx if j not in position]
                if gone:
                    raise ValueError(f"kernel {leaf.text}: input {gone[0]} is constant on the "
                                     "training rows and was dropped")
                idx = [position[j] for j in idx]
            else:
                idx = list(range(len(kept)))
            values = dict(leaf.values)
            scale = 1.0 if x_scale is None else _common_scale(leaf, [x_scale[i] for i in idx])
            if "period" in values:
                values["period"] /= scale
            if "lengthscale" in values and leaf.name != "periodic":  # periodic's is unitless
                values["lengthscale"] /= scale
            if "outputscale" in values:
                values["outputscale"] /= y_var
            columns = None if leaf.columns is None else tuple(idx)
            leaves.append(replace(leaf, columns=columns, values=values))
        terms.append(tuple(leaves))
    return KernelSpec(tuple(terms))


def _common_scale(leaf: Leaf, scales: list[float]) -> float:
    if not {"lengthscale", "period"} & set(leaf.values):
        return 1.0
    if max(scales) > min(scales) * (1 + 1e-12):
        raise ValueError(f"kernel {leaf.text}: one start value for inputs of different scales "
                         "(standardised separately); give it to a leaf of one input, or leave "
                         "the start value out")
    return scales[0]


def composed_terms(kernel: Kernel) -> tuple[ComposedTerm, ...] | None:
    """The terms of a sum of scaled products of RBF / Matérn kernels on column groups (what
    :func:`build_kernel` makes of an expression of stationary leaves), for the fused product
    of :mod:`gpscale.linalg.composed`; ``None`` for any other kernel (a batch shape, another
    leaf, a subclass)."""
    parts = list(kernel.kernels) if type(kernel) is gpytorch.kernels.AdditiveKernel \
        else [kernel]
    terms = []
    for part in parts:
        if type(part) is not gpytorch.kernels.ScaleKernel or part.batch_shape != _NO_BATCH:
            return None
        base = part.base_kernel
        if part.active_dims is not None and not (  # GPyTorch copies a leaf's onto its scale
                base.active_dims is not None and torch.equal(part.active_dims, base.active_dims)):
            return None
        leaves = (list(base.kernels) if type(base) is gpytorch.kernels.ProductKernel
                  else [base])
        found = []
        for leaf in leaves:
            if type(leaf) is gpytorch.kernels.RBFKernel:
                profile = "rbf"
            elif type(leaf) is gpytorch.kernels.MaternKernel and leaf.nu in _PROFILE_OF_NU:
                profile = _PROFILE_OF_NU[leaf.nu]
            else:
                return None
            if leaf.active_dims is None or leaf.batch_shape != _NO_BATCH:
                return None
            found.append(ComposedLeaf(profile, leaf.active_dims, leaf.lengthscale))
        terms.append(ComposedTerm(part.outputscale.reshape(()), tuple(found)))
    return tuple(terms)
