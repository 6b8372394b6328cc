"""gpscale.linalg."""
