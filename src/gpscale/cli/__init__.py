"""gpscale.cli."""
