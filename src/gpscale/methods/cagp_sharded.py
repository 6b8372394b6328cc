"""Where data-parallel CaGP-Opt lived before the method families became packages; it lives in
:mod:`gpscale.methods.cagp.sharded` now, and this module re-exports its names so that
``gpscale.methods.cagp_sharded`` keeps working."""

from gpscale.methods.cagp.sharded import (
    ShardedCaGPLoss,
    ShardedCaGPState,
    condition,
    expected_log_lik,
    kl,
    loss,
    predict,
    projected_nll,
)

__all__ = [
    "ShardedCaGPLoss", "ShardedCaGPState", "condition", "expected_log_lik", "kl", "loss",
    "predict", "projected_nll",
]
