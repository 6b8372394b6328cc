"""The latent GPs' kernel given as a kernel expression (:mod:`gpscale.kernels.algebra`), for
``iterncgp`` and ``sod-laplace``: its start values and what the ``lengthscale`` and
``outputscale`` options mean beside it.

The expression is built by :func:`~gpscale.kernels.compose.build_kernel`, shared by the L latent
GPs or as a batch of L kernels (``shared_kernel=False``), and its start values are its own. The
two options fill in what it leaves unset, one number each:

===============  ===============================================================================
``lengthscale``  the lengthscale of a kernel on all d inputs: a stationary leaf on k of them
                 that gives none starts at lengthscale · √(k/d) (distances over k inputs grow as
                 √k; at lengthscale √d this is build_kernel's own default √k)
``outputscale``  the total variance the terms that give none share equally, as for the other
                 methods (:func:`~gpscale.methods._common.prior_modules`)
===============  ===============================================================================

A list of values (per input, per class) belongs in the expression instead, and is refused.

An expression is not pre-fitted: the SVGP pre-fit of :mod:`gpscale.training.prefit` reads back
one named kernel's lengthscale and outputscale, and a composition has none. The harness gives it
the start of a learned kernel instead, the median distance between training inputs and
outputscale 1 (:func:`~gpscale.methods.iterncgp.pipeline.learns_from_median`); the kernel rounds
learn every hyperparameter of the composition from there. A kernel kept fixed
(``learn_kernel=False``, ``sod-laplace``) keeps those start values.

Its products go through GPyTorch's evaluation (the ``eager`` backend): the fused, native and
Triton paths and the held distances of kernel learning
(:mod:`~gpscale.methods.iterncgp.held_distances`) serve one named kernel only, and
:func:`check_backend` refuses the others at the build rather than at the first product.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from gpytorch.kernels import Kernel

from gpscale.kernels import build_kernel, is_expression, parse_kernel
from gpscale.kernels.algebra import STATIONARY, KernelSpec

__all__ = ["check_backend", "expression_kernel", "expression_value"]

_NO_BATCH = torch.Size()
EXPRESSION_BACKENDS = ("auto", "eager")
"""Kernel-product backends that evaluate a composition: the fused, native and Triton paths
serve the four named kernels only (:func:`gpscale.kernels.select_backend`)."""


def check_backend(kernel: str, backend: str) -> None:
    """Refuse, at the build, a ``backend`` that cannot evaluate kernel expression ``kernel``
    (no check for a named kernel).

    Raises:
        ValueError: one line naming the backends that can.
    """
    if is_expression(kernel) and backend not in EXPRESSION_BACKENDS:
        raise ValueError(f"backend {backend!r} evaluates the four named kernels only, not the "
                         f"kernel expression {kernel!r}; use backend=auto or eager")


def expression_value(name: str, value: Any) -> float | None:
    """The ``lengthscale`` or ``outputscale`` option beside an expression: ``None`` or one
    positive number (a list of one number is that number).

    Raises:
        ValueError: a list of several values, one line saying where they go instead.
    """
    if isinstance(value, (list, tuple)):
        values = _flat(value)
        if len(values) != 1:
            raise ValueError(
                f"with a kernel expression {name} takes one number, the start of what the "
                f"expression leaves unset; got {len(values)} values: give each leaf its own "
                f"in the expression, e.g. 'rbf(0, {name}=2) + matern32(1:, {name}=0.5)'")
        value = values[0]
    return None if value is None else float(value)


def _flat(value: Any) -> list:
    return [w for v in value for w in _flat(v)] if isinstance(value, (list, tuple)) else [value]


def expression_kernel(text: str, num_dims: int, *, batch_shape: torch.Size = _NO_BATCH,
                      lengthscale: Any = None, outputscale: Any = None) -> Kernel:
    """The GPyTorch kernel of expression ``text`` on ``num_dims`` inputs, with
    ``lengthscale`` and ``outputscale`` filling in the start values it leaves unset (module
    table); ``None`` leaves build_kernel's defaults (√k, and outputscale 1 shared by the terms).

    Args:
        text: a kernel expression.
        num_dims: d.
        batch_shape: ``()`` for one kernel shared by the latent GPs, ``(L,)`` for L kernels.
        lengthscale, outputscale: ``None`` or one positive number each.

    Raises:
        KernelSyntaxError: ``text`` does not parse.
        ValueError: columns outside the inputs, or several values for an option.
    """
    spec = parse_kernel(text)
    ls = expression_value("lengthscale", lengthscale)
    scale = expression_value("outputscale", outputscale)
    if ls is not None:
        spec = _with_lengthscale(spec, ls, num_dims)
    return build_kernel(spec, num_dims, batch_shape=batch_shape,
                        outputscale=1.0 if scale is None else scale)


def _with_lengthscale(spec: KernelSpec, lengthscale: float, num_dims: int) -> KernelSpec:
    """``spec`` whose stationary leaves without a lengthscale start at lengthscale · √(k/d)
    (k: the leaf's inputs); a leaf's own value stays."""
    terms = []
    for term, columns in zip(spec.terms, spec.resolve(num_dims), strict=True):
        terms.append(tuple(
            replace(leaf, values={"lengthscale": lengthscale * math.sqrt(len(idx) / num_dims),
                                  **leaf.values})
            if leaf.name in STATIONARY else leaf
            for leaf, idx in zip(term, columns, strict=True)))
    return KernelSpec(tuple(terms))
