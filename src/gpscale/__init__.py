"""gpscale: Gaussian processes on data too large for exact inference.

Public API:

- ``GPRegressor``, ``GPClassifier``: scikit-learn estimators over any method.
- ``methods.build(key, num_dims, init=(x, y), **options)``: a method module (``condition`` /
  ``loss`` / ``predict``); ``methods.METHODS`` lists the keys.
- ``training.fit``, ``training.FitConfig``: the training loop.
- ``Predictive``: what every ``predict`` returns.
- ``save``, ``load``: persist a fitted model or estimator.

The names load on first use (PEP 562 ``__getattr__``; the first loads them all), and so do the
submodules (``gpscale.training``): ``import gpscale`` itself imports no torch, so the ``gpscale``
command (:mod:`gpscale.cli`) imports torch inside its own Ctrl-C handling.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpscale.distributions import Predictive
    from gpscale.estimators import GPClassifier, GPRegressor
    from gpscale.io import load, save
    from gpscale.methods import METHODS, build
    from gpscale.training import FitConfig, fit

__version__ = "0.2.0"
__all__ = [
    "GPClassifier", "GPRegressor", "Predictive", "METHODS", "build", "fit", "FitConfig",
    "save", "load", "__version__",
]

_HOMES = {"Predictive": "gpscale.distributions", "GPClassifier": "gpscale.estimators",
          "GPRegressor": "gpscale.estimators", "load": "gpscale.io", "save": "gpscale.io",
          "METHODS": "gpscale.methods", "build": "gpscale.methods",
          "FitConfig": "gpscale.training", "fit": "gpscale.training"}


def __getattr__(name: str) -> Any:
    """A public name, loaded with everything the public names need (``load`` reads estimator
    files only once :mod:`gpscale.estimators` has registered their loader); or a submodule
    (``gpscale.training``), imported."""
    if name in _HOMES:
        for module in dict.fromkeys(_HOMES.values()):
            importlib.import_module(module)
        for public, module in _HOMES.items():
            globals()[public] = getattr(importlib.import_module(module), public)
        return globals()[name]
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":  # a module it imports is missing
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
