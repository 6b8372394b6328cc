r"""Additive SKI: ``ski`` with a kernel expression that is a sum of stationary kernels on groups
of at most three inputs, one grid per group — the model of additive GGP
(:mod:`gpscale.methods.ski.additive`: what a group admits, grid sizes, reach), solved as SKI
solves it: CG on the n × n operator W K_B Wᵀ + σ²I with W = [W_1 … W_G] the groups' stacked
interpolation rows and K_B block diagonal (:mod:`gpscale.methods.ski.rows_solve`).

Each iteration costs O(n S + Σ_g m_g log m_g), S = Σ_g s^{d_g} the weights per row, where
additive GGP's costs O(M²) once its statistics are summed; nothing of size M × M is held for
training (no WᵀW), so its grids are not bounded by the dense Gram's memory. The likelihood
and its gradients are GGP's (the same surrogates), so on the same grids the two models agree to
the solvers' tolerance.

Predictive variance: ``variance='auto'`` forms WᵀW once from the training rows and takes the
dense posterior on the grids (:func:`~gpscale.methods.ski.additive.grid_posterior`) where
M ≤ :data:`~gpscale.methods.ski.additive.DENSE_VARIANCE_MAX`, LOVE beyond it; ``exact``
solves per test chunk in n dimensions; ``lanczos`` is LOVE.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gpscale.linalg.additive import (
    AdditiveRows,
    BlockGridKernel,
    accumulate_gram,
    additive_rows,
    mirror_blocks,
)
from gpscale.linalg.interpolation import Grid
from gpscale.linalg.stencil import pair_offsets
from gpscale.methods.base import Method
from gpscale.methods.ski.additive import AdditiveGGP, grid_posterior
from gpscale.methods.ski.rows_solve import RowsSolved, variance_reduction
from gpscale.methods.ski.solve import GridState

__all__ = ["AdditiveSKI"]

_F64 = torch.float64


class AdditiveSKI(RowsSolved, AdditiveGGP):
    """SKI on a sum of kernels of input groups, one grid each (module docstring). Same
    arguments, options, loss and predictive as :class:`~gpscale.methods.ski.AdditiveGGP`; the
    state's ``data`` is the training rows, and a saved model keeps the training data."""

    key = "ski"
    summary_types = ()

    def _interpolate(self, x: Tensor) -> AdditiveRows:
        return additive_rows(self.grids, self.columns, x.to(_F64))

    def _solve_kernel(self) -> BlockGridKernel:
        return self._block_kernel(self.grids)

    def summary(self, state: GridState) -> None:
        """None: prediction solves with the training rows, so a saved model keeps the data."""
        return None

    def from_summary(self, summary: Any) -> Any:
        return Method.from_summary(self, summary)

    def _grids_of(self, state: GridState) -> list[Grid]:
        return self.grids

    def _variance_term(self, GK: BlockGridKernel, rows: AdditiveRows):
        """Test rows ↦ the latent posterior variance (module docstring)."""
        s2 = float(self.noise.detach())
        variance = self._variance(GK)
        if variance == "exact" and self.options["variance"] == "auto":
            gram = torch.zeros(GK.num_grid, GK.num_grid, dtype=_F64, device=self.noise.device)
            accumulate_gram(gram, rows)
            mirror_blocks(gram, rows.sizes)
            posterior = grid_posterior(GK, gram, s2)
            return lambda test_rows: test_rows.quad(posterior)
        pairs = [pair_offsets(g.support, g.num_dims) for g in self.grids]
        reduction = variance_reduction(self.options, GK, rows, s2, exact=variance == "exact",
                                       device=self.noise.device)
        return lambda test_rows: GK.interp_quad(test_rows, pairs) - reduction(test_rows)

