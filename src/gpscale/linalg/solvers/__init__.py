"""gpscale.linalg.solvers."""
