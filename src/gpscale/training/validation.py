"""Early stopping on held-out rows: the best epoch by a held-out score, kept and restored.

A method that overfits its training rows (SoftKI's learned interpolation points: their test error
can be best early in training and worse at its end) can ask
:func:`gpscale.training.harness.train_built` to hold rows out (``holdout_rows``); ``fit`` then
scores the model on them after every epoch through a :class:`Validation`, inside the training
clock, keeps the parameters of the best-scoring epoch, stops once the score has not improved for
``patience`` epochs (``history.stopped == "no-improvement"``) and restores the best epoch's
parameters when training ends, whatever ended it.

The best epoch's parameters live in memory only: a run resumed from a checkpoint starts its
search for the best epoch afresh.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["Validation", "split_holdout", "VALIDATION_PATIENCE", "VALIDATION_MIN_STEPS",
           "validation_patience"]

log = logging.getLogger("gpscale.training")

VALIDATION_PATIENCE = 10
"""Epochs without an improvement of the held-out score (by ``min_delta``) before stopping."""
VALIDATION_MIN_STEPS = 300
"""Fewest optimiser steps without an improvement before stopping: on a few thousand rows an
epoch is one or two minibatch steps, and ten of them at a small learning rate move the held-out
score less than its own noise, however far training still has to go."""


def validation_patience(num_rows: int, batch_size: int | None) -> int:
    """The patience in epochs for ``num_rows`` training rows in batches of ``batch_size``
    (``None``: full batch): :data:`VALIDATION_PATIENCE` epochs, or as many as hold
    :data:`VALIDATION_MIN_STEPS` steps."""
    steps = 1 if batch_size is None else max(1, math.ceil(num_rows / batch_size))
    return max(VALIDATION_PATIENCE, math.ceil(VALIDATION_MIN_STEPS / steps))


def split_holdout(x: Tensor, y: Tensor, rows: int, seed: int
                  ) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """((x, y) to train on, (x, y) held out): ``rows`` random rows out, the same for a seed."""
    if not 0 < rows < x.shape[0]:
        raise ValueError(f"cannot hold out {rows} of {x.shape[0]} rows")
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed + 7919))
    held, kept = order[:rows].to(x.device), order[rows:].to(x.device)
    return (x[kept], y[kept]), (x[held], y[held])


class Validation:
    """Tracks a held-out score over epochs; see the module docstring.

    Args:
        score: ``model -> {name: value, ...}``; the first entry is the score to minimise, all
            are recorded in the epoch's history row.
        patience: epochs without an improvement larger than ``min_delta`` before :attr:`stop`.
        min_delta: the absolute improvement that resets the patience (any improvement still
            makes an epoch the best one).
        tolerance: how much worse than the best the last epoch may score and be kept.
    """

    def __init__(self, score: Callable[[nn.Module], dict[str, float]], *,
                 patience: int = VALIDATION_PATIENCE, min_delta: float = 1e-3,
                 tolerance: float = 0.0):
        if patience < 1:
            raise ValueError(f"patience must be ≥ 1; got {patience}")
        self.score_fn, self.patience, self.min_delta = score, patience, float(min_delta)
        self.tolerance = float(tolerance)
        self.best, self.best_epoch, self.state = math.inf, 0, None
        self.level, self.since, self.last = math.inf, 0, math.inf

    @property
    def stop(self) -> bool:
        """Whether the score has not improved for ``patience`` epochs."""
        return self.since >= self.patience

    def epoch_end(self, model: nn.Module, epoch: int) -> dict[str, float]:
        """Score the model after ``epoch``; keep its parameters if it is the best so far."""
        was_training = model.training
        model.eval()
        with torch.no_grad():
            metrics = self.score_fn(model)
        model.train(was_training)
        value = float(next(iter(metrics.values())))
        self.last = value
        if value < self.best:
            self.best, self.best_epoch = value, epoch
            self.state = copy.deepcopy(model.state_dict())
        if value < self.level - self.min_delta:
            self.level, self.since = value, 0
        else:
            self.since += 1
        return metrics

    def restore(self, model: nn.Module) -> dict[str, Any] | None:
        """Load the best epoch's parameters if the last epoch scored worse by more than
        ``tolerance`` (the held-out score's own noise: a difference within it says nothing
        about which epoch generalises better, and the last has trained longer); returns what
        was restored (recorded in the history), or ``None``."""
        if self.state is None or not self.last > self.best + self.tolerance:
            return None
        model.load_state_dict(self.state)
        log.info("held-out score %.6g of the last epoch is worse than epoch %d's %.6g: its "
                 "parameters restored", self.last, self.best_epoch, self.best)
        return {"restored_epoch": self.best_epoch}
