"""Inference families behind the Method contract, and the registry of method keys.

Importing this package registers the built-in keys: each method module registers its own with
:func:`~gpscale.methods.registry.register` when it is imported below (the registry itself imports
no method module).
"""

import gpscale.methods.baselines  # noqa: F401  (exact, cggp, sgpr, svgp)
import gpscale.methods.cagp  # noqa: F401
import gpscale.methods.iterncgp  # noqa: F401  (iterncgp and sod-laplace)
import gpscale.methods.ski  # noqa: F401  (ski and ggp)
import gpscale.methods.softki  # noqa: F401
import gpscale.methods.solvegp  # noqa: F401
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.registry import METHODS, MethodSpec, build, get_spec, register

__all__ = ["Method", "MethodSpec", "METHODS", "build", "get_spec", "register", "predict_in_chunks"]
