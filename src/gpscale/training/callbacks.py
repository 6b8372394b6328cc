"""Callbacks run by ``training.fit`` after an epoch: evaluation and progress.

A callback is any object with ``on_epoch_end(model, epoch, row) -> dict | None``; the returned
metrics are merged into the history row. Callbacks run outside the training clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from gpscale.distributions import Predictive

__all__ = ["Evaluate", "LogMetrics"]

log = logging.getLogger("gpscale.training")


class Evaluate:
    """Test metrics every ``every`` epochs from ``predict_fn(model) -> Predictive``.

    Args:
        predict_fn: computes the predictive at the evaluation inputs (e.g. conditions the model
            on the training data and predicts at the test inputs).
        y: targets at the evaluation inputs.
        every: evaluate on epochs divisible by ``every`` (and whenever ``fit`` asks at the end).
        transform: optional ``Predictive -> Predictive`` applied first (e.g. un-standardise).
    """

    def __init__(self, predict_fn: Callable[[nn.Module], Predictive], y: Tensor, *,
                 every: int = 1, transform: Callable[[Predictive], Predictive] | None = None):
        if every < 1:
            raise ValueError(f"every must be ≥ 1; got {every}")
        self.predict_fn = predict_fn
        self.y = y
        self.every = every
        self.transform = transform

    def on_epoch_end(self, model: nn.Module, epoch: int, row: dict[str, Any],
                     *, final: bool = False) -> dict[str, float] | None:
        if epoch % self.every and not final:
            return None
        with torch.no_grad():
            pred = self.predict_fn(model)
            if self.transform is not None:
                pred = self.transform(pred)
            return pred.metrics(self.y)


class LogMetrics:
    """Log each history row at INFO level through the ``gpscale.training`` logger."""

    def on_epoch_end(self, model: nn.Module, epoch: int, row: dict[str, Any],
                     *, final: bool = False) -> None:
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in row.items())
        log.info("%s", shown)
        return None
