"""gpscale.linalg.operators."""
