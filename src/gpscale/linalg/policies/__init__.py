"""gpscale.linalg.policies."""
