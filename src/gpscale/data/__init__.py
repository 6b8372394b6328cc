"""gpscale.data."""
