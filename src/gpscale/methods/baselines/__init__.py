"""Thin wrappers around GPyTorch's own models: exact, cggp, sgpr, svgp."""
