"""CaGP: computation-aware GP regression with ELBO model selection (``cagp-opt``, ``cagp-cg``).

Wenger, Wu, Hennig, Gardner, Pleiss & Cunningham (2024), "Computation-Aware Gaussian Processes:
Model Selection And Linear-Time Inference", arXiv:2411.01036 (notes/001_cagp.md). The posterior
conditions on k projections Sᵀy of the data (actions S, n × k) and counts the error of that
limited computation as uncertainty; an ELBO chooses the kernel hyperparameters and, in
CaGP-Opt, the block-sparse actions themselves (CaGP-CG takes CG's residuals).

===============  ===============================================================================
``model``        :class:`CaGP`, the posterior and losses, the two factories and the
                 registration of their keys
``state``        :class:`CaGPState` and the float64 Gram pieces both losses share
``actions``      operations on the actions, dense or block-sparse: float64 copies, SᵀS and K S
``cg``           what makes CaGP-CG affordable (a cached kernel matrix for CG, actions recycled
                 between steps) and Alg. S1 one action at a time
``pipeline``     what the pipeline needs beside the options: training defaults per preset, the
                 exact-GP pre-fit (and CaGP-CG's check of its start), small test options
``sharded``      CaGP-Opt's ELBO from per-rank pieces for data-parallel training
                 (:meth:`CaGP.shard_plan`)
``calibration``  CaGP-Opt's predictive variance, calibrated after training on training rows
                 held out of training (:meth:`CaGP.finalize`)
===============  ===============================================================================

Importing the package registers ``cagp-opt`` and ``cagp-cg``.
"""

from gpscale.methods.cagp.actions import action_gram, kernel_times
from gpscale.methods.cagp.cg import IterativePosterior, iterative_posterior
from gpscale.methods.cagp.model import (
    OBJECTIVES,
    REFRESH_EVERY,
    CaGP,
    build_cagp_cg,
    build_cagp_opt,
)
from gpscale.methods.cagp.state import (
    JITTER_NOISE_FRACTION,
    CaGPState,
    gram_cholesky,
    trace_solve,
    warn_float64_fallback,
)

__all__ = [
    "OBJECTIVES", "CaGP", "CaGPState", "IterativePosterior", "build_cagp_cg", "build_cagp_opt",
    "action_gram", "gram_cholesky", "iterative_posterior", "kernel_times", "trace_solve",
    "warn_float64_fallback", "JITTER_NOISE_FRACTION", "REFRESH_EVERY",
]
