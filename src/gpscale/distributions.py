"""The marginal predictive distribution returned by every method's ``predict``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

import gpscale.metrics as metrics

__all__ = ["Predictive"]


@dataclass(frozen=True)
class Predictive:
    """Marginal predictive at t test points.

    Attributes:
        mean: (t,) latent mean, or (t, C) for C latent functions.
        variance: latent variance, same shape as ``mean``.
        noise: observation-noise variance for Gaussian regression: a scalar tensor or (t,).
            ``None`` for non-Gaussian likelihoods.
        probs: (t, C) class probabilities for classification (C = 2 for binary), ``None`` else.
        rate: (t,) expected count for Poisson likelihoods, ``None`` else.
        covariance: (t, t) joint latent covariance, only when asked for.

    Example:
        >>> p = Predictive(mean=torch.zeros(3), variance=torch.ones(3), noise=torch.tensor(0.1))
        >>> round(p.rmse(torch.ones(3)), 3)
        1.0
    """

    mean: Tensor
    variance: Tensor
    noise: Tensor | None = None
    probs: Tensor | None = None
    rate: Tensor | None = None
    covariance: Tensor | None = None

    def __post_init__(self):
        if self.mean.shape != self.variance.shape:
            raise ValueError(
                f"mean {tuple(self.mean.shape)} and variance {tuple(self.variance.shape)} differ"
            )

    @property
    def observed_variance(self) -> Tensor:
        """Variance of y: latent variance plus observation noise (regression only)."""
        if self.noise is None:
            raise ValueError("observed_variance needs a Gaussian likelihood (noise is None)")
        return self.variance + self.noise

    @property
    def stddev(self) -> Tensor:
        """Standard deviation of y for regression (latent plus noise)."""
        return self.observed_variance.sqrt()

    def nll(self, y: Tensor) -> float:
        """Mean negative log predictive density of y (Gaussian), of the true class, or of the
        counts (Poisson: latent log-rate mean and variance, by quadrature)."""
        if self.probs is not None:
            return metrics.multiclass_nll(self.probs, y)
        if self.rate is not None:
            return metrics.poisson_nll(self.mean, self.variance, y)
        return metrics.gaussian_nll(self.mean, self.observed_variance, y)

    def rmse(self, y: Tensor) -> float:
        """Root mean squared error of the predictive mean (of the rate, for counts)."""
        point = self.rate if self.rate is not None else self.mean
        return metrics.rmse(point, y)

    def accuracy(self, y: Tensor) -> float:
        return metrics.accuracy(self._require_probs(), y)

    def ece(self, y: Tensor, num_bins: int = 15) -> float:
        return metrics.ece(self._require_probs(), y, num_bins=num_bins)

    def coverage_error(self, y: Tensor, level: float = 0.95) -> float:
        return metrics.coverage_error(self.mean, self.observed_variance, y, level=level)

    def metrics(self, y: Tensor) -> dict[str, float]:
        """All test metrics that apply to this predictive, keyed as in ``metrics.json``."""
        if self.probs is not None:
            return {
                "test_accuracy": self.accuracy(y),
                "test_nll": self.nll(y),
                "test_ece": self.ece(y),
            }
        if self.rate is not None:
            return {"test_rmse": self.rmse(y), "test_nll": self.nll(y)}
        if self.noise is None:
            return {"test_rmse": self.rmse(y)}
        coverage = metrics.coverage(self.mean, self.observed_variance, y)
        return {
            "test_rmse": self.rmse(y),
            "test_nll": self.nll(y),
            "test_coverage": coverage,
            "test_coverage_error": abs(coverage - 0.95),
            "test_mean_std": float(self.observed_variance.double().sqrt().mean()),
        }

    def to(self, *args, **kwargs) -> Predictive:
        """A copy with every tensor moved/cast like ``Tensor.to``."""
        def move(t):
            return None if t is None else t.to(*args, **kwargs)

        return Predictive(
            move(self.mean), move(self.variance), move(self.noise), move(self.probs),
            move(self.rate), move(self.covariance),
        )

    def _require_probs(self) -> Tensor:
        if self.probs is None:
            raise ValueError("this predictive has no class probabilities (regression model?)")
        return self.probs


def concat(parts: list[Predictive]) -> Predictive:
    """Join chunk-wise predictives along the test-point axis (no joint covariance)."""
    def cat(name):
        values = [getattr(p, name) for p in parts]
        if values[0] is None:
            return None
        if name == "noise" and values[0].dim() == 0:
            return values[0]
        return torch.cat(values, 0)

    return Predictive(cat("mean"), cat("variance"), cat("noise"), cat("probs"), cat("rate"))
