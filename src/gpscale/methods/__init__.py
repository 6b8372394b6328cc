"""Inference families behind the Method contract, and the registry of method keys.

One package per family — ``cagp``, ``iterncgp``, ``ski`` (SKI and GGP), ``softki``, ``solvegp``
and ``baselines`` (GPyTorch's models) — whose ``__init__`` says which file holds what. Beside
them the modules every family shares: ``base`` (the Method contract), ``options`` (declared
options), ``registry`` (method keys), ``auto`` (``method="auto"``) and ``_common`` (prior and
inducing-point set-up, memory limits). A family imports the shared modules, never another
family.

Importing this package registers the built-in keys: each family registers its own with
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
