"""Thin wrappers around GPyTorch's own models: exact, cggp, sgpr, svgp.

Importing this package registers the four method keys (see :mod:`gpscale.methods.registry`).
``optimal_q`` holds the closed-form step after training that sets SVGP's q(v) and σ² (and
SGPR's σ²) to the collapsed bound's optimum for the trained inducing points and kernel;
``pipeline`` what the pipeline needs beside the options (training defaults per preset, SVGP's
inducing points on a GPU, the dense-memory copies of exact and cggp, small test options).
"""

from gpscale.methods.baselines.cggp import CGSettings, build_cggp
from gpscale.methods.baselines.exact import CholeskySettings, ExactGPyTorch, build_exact
from gpscale.methods.baselines.sgpr import SGPR, build_sgpr
from gpscale.methods.baselines.svgp import SVGP, SVGPSettings, SVGPState, build_svgp

__all__ = [
    "CGSettings", "CholeskySettings", "ExactGPyTorch", "SGPR", "SVGP", "SVGPSettings",
    "SVGPState", "build_cggp", "build_exact", "build_sgpr", "build_svgp",
]
