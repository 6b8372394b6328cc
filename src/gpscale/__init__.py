"""gpscale: Gaussian processes on data too large for exact inference.

Public API:

- ``GPRegressor``, ``GPClassifier``: scikit-learn estimators over any method.
- ``methods.build(key, num_dims, init=(x, y), **options)``: a method module (``condition`` /
  ``loss`` / ``predict``); ``methods.METHODS`` lists the keys.
- ``training.fit``, ``training.FitConfig``: the training loop.
- ``Predictive``: what every ``predict`` returns.
- ``save``, ``load``: persist a fitted model or estimator.
"""

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
