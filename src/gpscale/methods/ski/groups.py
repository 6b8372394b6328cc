r"""The groups of an additive SKI / GGP kernel (:mod:`gpscale.methods.ski.additive`): which
expressions a grid per group can take, how the terms fall into groups, each group's kernel on
its grid, its reach, and the grids' sizes and corners.

What a term admits: any stationary kernel k(x − x') on at most three inputs, with its own
lengthscales and outputscale: RBF, Matérn ½, 3/2, 5/2, rational quadratic, periodic, and
products of these (on the union of their inputs: ``rbf(0) * periodic(0)`` is a locally
periodic kernel on one grid). Linear and polynomial kernels are not functions of x − x' and
have no Toeplitz form.

Groups: terms on the same inputs share one grid, whose kernel is their sum (the textbook
CO₂ kernel's four terms on time are one grid, not four: M, the dense WᵀW's size, stays m).
A group of one term that is one profile, or a product of one profile over single inputs (RBF on
any), is a Kronecker product built from the profile (:func:`~gpscale.linalg.toeplitz.grid_kernel`);
any other group's K_G is built from the kernel's own values at the grid's offsets
(:func:`~gpscale.linalg.toeplitz.evaluated_grid_kernel`: Toeplitz on one input, multilevel
Toeplitz on more, whose products the factorized CG solves).

A term without inputs takes every input, so on data of at most three inputs a sum of kernels
needs none (``rbf + rbf * periodic`` on a time series is one group).

Grid sizes per group: :data:`ADDITIVE_GRID_SIZE` points per input by the group's size (smaller
than one grid's defaults: M = Σ_g m_g sets the dense WᵀW's M² memory and product cost), a single
grid's (:data:`~gpscale.methods.ski.statistics.DEFAULT_GRID_SIZE`) where there is one group; one
``grid_size`` value applies to every input of every group, or one value per input of each group
in order (groups in the order their inputs first appear).

A test point beyond the kernel's reach of a group's grid gets that group's prior (mean 0,
variance the sum of its terms' outputscales) and no weight on it; within reach but outside a
grid it is an error, as for one grid. A periodic or rational quadratic factor never lets a point
out of reach (the one repeats, the other decays only polynomially): its group's grid must cover
the test points (``grid_bounds``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gpytorch
import torch
from torch import Tensor

from gpscale.kernels import KERNELS
from gpscale.kernels.algebra import KernelSpec, KernelSyntaxError, parse_kernel
from gpscale.linalg.interpolation import Grid, make_grid
from gpscale.linalg.toeplitz import GridKernel, evaluated_grid_kernel, grid_kernel
from gpscale.methods.ski.statistics import DEFAULT_GRID_SIZE, MAX_DIMS

__all__ = ["ADDITIVE_GRID_SIZE", "DENSE_GRAM_MAX", "GRID_LEAVES", "Group", "additive_refusal",
           "additive_groups", "group_grid_kernel", "group_reach", "resolve_additive_grids",
           "additive_grids", "term_at_offsets"]

ADDITIVE_GRID_SIZE = {1: 128, 2: 32, 3: 12}
"""Default grid points per input of a group of 1, 2 or 3 inputs (module docstring)."""
DENSE_GRAM_MAX = 16_384
"""Largest M = Σ_g m_g whose dense WᵀW (M² float64: 2 GiB) the additive GGP holds."""
_F64 = torch.float64
_PROFILES = {"rbf": "rbf", "matern12": "matern12", "matern32": "matern32",
             "matern52": "matern52"}
GRID_LEAVES = (*_PROFILES, "rq", "periodic")
"""Leaves of a group's kernel: stationary, k(x − x') (module docstring)."""


def additive_refusal(text: str) -> str | None:
    """Why ``ggp`` cannot take the kernel ``text`` (``None``: it can, or it is a name)."""
    if text in KERNELS:
        return None
    try:
        spec = parse_kernel(text)
    except KernelSyntaxError:
        return None  # the option's parser names the position
    for term in spec.terms:
        for leaf in term:
            if leaf.name not in GRID_LEAVES:
                why = ("has no inputs to put on a grid (the constant mean takes an offset)"
                       if leaf.name == "constant" else "is not a function of x − x'")
                return (f"SKI and GGP interpolate sums of stationary kernels on at most "
                        f"{MAX_DIMS} inputs each; {leaf.name!r} {why}")
    return None


@dataclass(frozen=True)
class Group:
    """Terms of an additive kernel on one set of inputs, which share a grid.

    Attributes:
        terms: the terms' positions in the expression.
        columns: the inputs, in the order of the group's first term (the grid's dimensions).
        profile: the profile of a Kronecker K_G (one term of one kind, module docstring), or
            ``None``: K_G from the kernel's values.
    """

    terms: tuple[int, ...]
    columns: tuple[int, ...]
    profile: str | None


def additive_groups(text: str, num_dims: int) -> tuple[KernelSpec, list[Group]]:
    """The parsed expression and its groups, in the order their inputs first appear.

    Raises:
        ValueError: what :func:`additive_refusal` names, or a term on more than 3 inputs.
    """
    why = additive_refusal(text)
    if why is not None:
        raise ValueError(f"kernel {text!r}: {why}")
    spec = parse_kernel(text)
    found: dict[frozenset[int], list[int]] = {}
    order: dict[frozenset[int], tuple[int, ...]] = {}
    profiles = []
    for t, (term, leaf_cols) in enumerate(zip(spec.terms, spec.resolve(num_dims), strict=True)):
        cols = tuple(dict.fromkeys(j for c in leaf_cols for j in c))  # factors may share
        if len(cols) > MAX_DIMS:
            where = " * ".join(leaf.text for leaf in term)
            every = (", every input (give it its inputs, e.g. rbf(0, 1))"
                     if any(leaf.columns is None for leaf in term) else "")
            raise ValueError(f"kernel {text!r}: the term {where!r} is on {len(cols)} "
                             f"inputs{every}; a grid takes at most {MAX_DIMS} (split it into "
                             "smaller groups, or use svgp or cagp-opt)")
        found.setdefault(frozenset(cols), []).append(t)
        order.setdefault(frozenset(cols), cols)
        profiles.append(_profile_of(term, leaf_cols))
    return spec, [Group(tuple(terms), order[key], profiles[terms[0]] if len(terms) == 1 else None)
                  for key, terms in found.items()]


def _profile_of(term, leaf_cols) -> str | None:
    """The profile whose Kronecker (or joint-distance) K_G :func:`grid_kernel` builds for a
    term: one RBF or Matérn leaf, or a product of one of them over single inputs (RBF over
    any); ``None`` otherwise."""
    names = {leaf.name for leaf in term}
    flat = [j for c in leaf_cols for j in c]
    if len(names) > 1 or not names <= set(_PROFILES) or len(set(flat)) < len(flat):
        return None
    name = names.pop()
    if len(term) == 1 or name == "rbf" or all(len(c) == 1 for c in leaf_cols):
        return _PROFILES[name]
    return None


def _leaves(term) -> list[Any]:
    base = term.base_kernel
    return list(base.kernels) if hasattr(base, "kernels") else [base]


def term_lengthscale(term) -> Tensor:
    """The lengthscales (d_g,) of a term (a ScaleKernel) over its inputs in order: one
    leaf's, or a product's leaves' concatenated (each broadcast over its own inputs)."""
    return torch.cat([leaf.lengthscale.reshape(-1).expand(len(leaf.active_dims))
                      for leaf in _leaves(term)])


def term_reach(term, columns: list[int]) -> Tensor:
    """The lengthscales (d_g,) over a term's ``columns`` that decide its reach: a product is
    negligible where any of its factors is, so each input takes the shortest lengthscale of
    the factors on it that decay; infinite where only a factor that never lets a point out of
    reach (:data:`_UNBOUNDED`) reads it."""
    unbounded = (gpytorch.kernels.PeriodicKernel, gpytorch.kernels.RQKernel)
    reach = torch.full((len(columns),), math.inf, dtype=_F64)
    with torch.no_grad():
        for leaf in _leaves(term):
            if isinstance(leaf, unbounded):
                continue
            ell = leaf.lengthscale.detach().reshape(-1).expand(len(leaf.active_dims))
            for k, col in enumerate(leaf.active_dims.tolist()):
                at = columns.index(col)
                reach[at] = min(float(reach[at]), float(ell[k]))
    return reach


def term_at_offsets(term, columns: list[int], num_dims: int) -> Callable[[Tensor], Tensor]:
    """τ (P, d_g) ↦ the term's k(τ, 0) (P,) in float64: the offsets placed on the term's
    ``columns`` of ``num_dims`` inputs, evaluated by the GPyTorch kernel itself."""
    def values(tau: Tensor) -> Tensor:
        dtype = term.outputscale.dtype
        x = tau.new_zeros(tau.shape[0], num_dims, dtype=dtype)
        x[:, columns] = tau.to(dtype)
        return term(x, x[:1] * 0).to_dense()[:, 0].to(_F64)
    return values


def group_grid_kernel(terms: list[Any], group: Group, grid: Grid, num_dims: int) -> GridKernel:
    """K_G of a group on its grid, ``terms`` the ScaleKernels at ``group.terms``: the profile's
    Kronecker product for one term of one kind, else from the sum of the terms' values at the
    grid's offsets (module docstring)."""
    if group.profile is not None:
        term = terms[0]
        product = hasattr(term.base_kernel, "kernels")  # one profile over single inputs
        return grid_kernel(grid, group.profile, term_lengthscale(term),
                           term.outputscale.reshape(()), per_input=product)
    parts = [term_at_offsets(term, list(group.columns), num_dims) for term in terms]
    return evaluated_grid_kernel(grid, lambda tau: sum(part(tau) for part in parts),
                                 device=terms[0].outputscale.device)


def group_reach(terms: list[Any], columns: list[int]) -> Tensor:
    """The lengthscales (d_g,) that decide a group's reach: a sum is negligible only where each
    of its terms is, so each input takes the longest of the terms' :func:`term_reach`."""
    return torch.stack([term_reach(term, columns) for term in terms]).amax(0)


def resolve_additive_grids(columns: list[list[int]], init, grid_size, grid_bounds,
                           grid_margin: float, interpolation: str, *,
                           dense_gram: bool = True) -> dict[str, Any]:
    """Flat per-input lists (groups in order) of grid sizes and corners (module docstring);
    ``dense_gram``: the model holds WᵀW densely (``ggp``), so M is bounded."""
    dims = [len(c) for c in columns]
    total = sum(dims)
    if grid_size is None:  # one group has M to itself: a single grid's defaults
        table = DEFAULT_GRID_SIZE if len(dims) == 1 else ADDITIVE_GRID_SIZE
        sizes = [table[d] for d in dims for _ in range(d)]
    elif isinstance(grid_size, int | float):
        sizes = [int(grid_size)] * total
    else:
        sizes = [int(s) for s in grid_size]
        if len(sizes) == 1:
            sizes = sizes * total
    if len(sizes) != total:
        raise ValueError(f"grid_size needs 1 value or one per input of each group ({total} for "
                         f"groups of {dims} inputs); got {len(sizes)}")
    if grid_bounds is not None:
        lower, upper = ([float(v) for v in b] for b in grid_bounds)
    elif init is not None:
        x = init[0].detach().to(_F64)[:, [j for cols in columns for j in cols]]
        lo, hi = x.min(0).values, x.max(0).values
        span = torch.clamp_min(hi - lo, 1e-6)
        lower, upper = (lo - grid_margin * span).tolist(), (hi + grid_margin * span).tolist()
    else:
        raise ValueError("an additive ggp needs grid_bounds=(lower, upper) when init is None")
    if len(lower) != total or len(upper) != total:
        raise ValueError(f"grid_bounds needs (lower, upper) with {total} entries each (one "
                         "per input of each group)")
    opts = {"grid_size": sizes, "grid_lower": lower, "grid_upper": upper,
            "interpolation": interpolation}
    grids = additive_grids(opts, columns)
    size = sum(g.num_points for g in grids)
    if dense_gram and size > DENSE_GRAM_MAX:
        raise ValueError(f"the additive grids hold M = {size:,} points; their dense WᵀW needs "
                         f"M ≤ {DENSE_GRAM_MAX:,}: give a smaller grid_size")
    return opts


def additive_grids(options: dict[str, Any], columns: list[list[int]]) -> list[Grid]:
    """The groups' grids from the flat options of :func:`resolve_additive_grids`."""
    grids, start = [], 0
    for cols in columns:
        stop = start + len(cols)
        grids.append(make_grid(options["grid_lower"][start:stop],
                               options["grid_upper"][start:stop],
                               options["grid_size"][start:stop], options["interpolation"]))
        start = stop
    return grids


