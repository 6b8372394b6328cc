"""gpscale: Gaussian processes on data too large for exact inference."""

from gpscale.distributions import Predictive

__version__ = "0.1.0"
__all__ = ["Predictive", "__version__"]
