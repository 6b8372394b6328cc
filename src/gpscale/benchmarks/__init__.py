"""gpscale.benchmarks."""
