"""CaGP's conditioned state and the float64 pieces the one-process and data-parallel losses
share (:mod:`~gpscale.methods.cagp.model`, :mod:`~gpscale.methods.cagp.sharded`): the Cholesky
factor of SᵀK̂S with its jitter cap, and tr(G⁻¹A)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from gpscale.linalg.operators.block_sparse import BlockSparseActions
from gpscale.linalg.ops import safe_cholesky, upcast

__all__ = ["JITTER_NOISE_FRACTION", "CaGPState", "gram_cholesky", "trace_solve",
           "warn_float64_fallback"]

JITTER_NOISE_FRACTION = 0.1
"""The most jitter SᵀK̂S may take, as a fraction of its noise term σ² min diag(SᵀS), before a
below-float64 Gram counts as unresolved (:meth:`CaGP.resolves`)."""

def gram_cholesky(G_K: Tensor, noise: Tensor, D: Tensor, dtype: torch.dtype) -> Tensor:
    """chol(SᵀK̂S) = chol(G_K + σ² SᵀS) in float64. Where the kernel products were computed
    below float64 the jitter is capped at :data:`JITTER_NOISE_FRACTION` of the noise term, so
    that a Gram whose rounding the noise does not resolve raises
    :class:`~gpscale.errors.NumericalError` (the caller then recomputes in float64)."""
    cap = None if dtype == torch.float64 else float(
        JITTER_NOISE_FRACTION * noise.detach() * D.diagonal().min().detach())
    return safe_cholesky(G_K + upcast(noise) * D, name="CaGP Gram matrix SᵀK̂S", max_jitter=cap)


def warn_float64_fallback(dtype: torch.dtype) -> None:
    """Say that the kernel products are recomputed in float64 (once: a constant message)."""
    warnings.warn(f"CaGP: SᵀK̂S from {dtype} kernel products is not positive definite to within "
                  "a tenth of the noise σ² (σ² small against the outputscale); the kernel "
                  "products are recomputed in float64 (2-4x slower)", RuntimeWarning, stacklevel=3)


@dataclass(frozen=True)
class CaGPState:
    """Everything CaGP computes from (X, y) for given actions (Alg. S2 lines 1–5).

    Attributes:
        x: (n, d) training inputs.
        actions: S (n, i), a tensor or :class:`BlockSparseActions`.
        residual: r = y − μ(X) (n,).
        K_S: Z = K S (n, i).
        gram_K: G_K = SᵀKS (i, i), float64.
        gram_actions: D = SᵀS (i, i), float64.
        logdet_actions: log det SᵀS, float64.
        cholesky: L (i, i) with L Lᵀ = SᵀK̂S, float64.
        y_proj: ỹ = Sᵀ r (i,), the projected data, float64.
        repr_weights_proj: ṽ = G⁻¹ Sᵀ r (i,), float64.
        noise: σ² (scalar).
        prior_var_sum: Σ_j K(x_j, x_j) over the fitted rows, float64.
        fitted: (n,) bool, the rows the ELBO fits (CaGP-Opt holds some out to calibrate on:
            their action entries are zero); ``None``: every row.
    """

    x: Tensor
    actions: Tensor | BlockSparseActions
    residual: Tensor
    K_S: Tensor
    gram_K: Tensor
    gram_actions: Tensor
    logdet_actions: Tensor
    cholesky: Tensor
    y_proj: Tensor
    repr_weights_proj: Tensor
    noise: Tensor
    prior_var_sum: Tensor
    fitted: Tensor | None = None

    @property
    def num_actions(self) -> int:
        return self.K_S.shape[-1]

    @property
    def num_fitted(self) -> int:
        """How many rows the ELBO fits (n unless rows are held out)."""
        return self.residual.shape[0] if self.fitted is None else int(self.fitted.sum())

    @property
    def fitted_weights(self) -> Tensor | None:
        """1 on the fitted rows, 0 on the held ones, in K S's dtype; ``None``: every row."""
        return None if self.fitted is None else self.fitted.to(self.K_S.dtype)

    def fitted_only(self, t: Tensor) -> Tensor:
        """``t`` (n,) or (n, k) with the rows the ELBO does not fit at zero (a product, not an
        index: its backward is a product too, where an index's scatters into n × k zeros)."""
        if self.fitted is None:
            return t
        mask = self.fitted.to(t.dtype)
        return t * (mask if t.dim() == 1 else mask[:, None])


def trace_solve(L: Tensor, A: Tensor) -> Tensor:
    """tr(G⁻¹ A) for G = L Lᵀ."""
    return torch.cholesky_solve(A, L).diagonal().sum()
