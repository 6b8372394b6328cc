"""gpscale.training."""
