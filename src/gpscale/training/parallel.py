"""The data-parallel hook of ``training.fit``: :class:`DataParallel`.

``training.fit(..., parallel=DataParallel(n, kind=...))`` runs the same loop on every rank: the
hook supplies the rank's minibatches (:func:`~gpscale.distributed.shard.rank_batches`), reduces
each step's loss and gradients across ranks before the optimiser sees them (as
``DistributedDataParallel`` does), and agrees on the epoch time, so the ranks' parameters stay
identical and they stop together. Two kinds of loss (module docstring of
:mod:`gpscale.distributed.reduce`):

- ``'local'`` — minibatch methods (``svgp`` and every ``minibatch=True`` method): the per-datum
  loss on the rank's batch; gradients and loss values are averaged weighted by batch size, which
  is exactly the loss and gradient on the union of the batches (the global batch).
- ``'global'`` — data-parallel CaGP-Opt (:mod:`gpscale.methods.cagp.sharded`): every rank
  computes the same full-data loss through differentiable all-reduces; gradients are averaged
  plainly. GGP (:mod:`gpscale.methods.ski.sharded`) is 'global' too: its statistics are
  all-reduced once before training, after which every rank computes the same loss from the same
  numbers.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from gpscale.distributed.env import DistEnv, current
from gpscale.distributed.reduce import (
    all_reduce_max,
    all_reduce_sum,
    reduce_gradients,
    rows_at,
    weighted_mean,
)
from gpscale.distributed.shard import batch_per_rank, num_steps, rank_batches, shard_range

__all__ = ["LOSS_KINDS", "DataParallel"]

LOSS_KINDS = ("local", "global")


class DataParallel:
    """The data-parallel hook of ``training.fit`` for this rank.

    Args:
        num_points: n, the global number of training points (the shards tile 0 … n − 1).
        kind: ``'local'`` (per-datum loss on the rank's batch, batch-size-weighted averages) or
            ``'global'`` (the same loss on every rank, plain averages).
        env: the distributed environment; default :func:`~gpscale.distributed.env.current`.

    ``fit``'s ``batch_size`` is the *global* batch: each rank takes ⌈batch_size / P⌉ rows.
    """

    def __init__(self, num_points: int, *, kind: str = "local", env: DistEnv | None = None):
        if kind not in LOSS_KINDS:
            raise ValueError(f"unknown loss kind {kind!r}; valid: {', '.join(LOSS_KINDS)}")
        self.env = env or current()
        self.num_points, self.kind = int(num_points), kind
        start, stop = shard_range(self.num_points, self.env.rank, self.env.world_size)
        self.start, self.num_local = start, stop - start
        self._rows = 0

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    def batches(self, n: int, batch_size: int | None,
                generator: torch.Generator) -> Iterator[Tensor | None]:
        """This rank's local index batches for one epoch (the same count on every rank)."""
        if n != self.num_local:
            raise ValueError(f"rank {self.env.rank} trains on {n} rows but its shard of "
                             f"{self.num_points} points has {self.num_local}")
        per_rank = None if batch_size is None else batch_per_rank(batch_size,
                                                                  self.env.world_size)
        steps = num_steps(self.num_points, self.env.world_size, per_rank)
        seed = int(torch.randint(2**62, (), generator=generator)) if steps > 1 else 0
        return rank_batches(n, steps, seed, self.env.rank)

    def _weight(self, rows: int) -> float:
        return float(rows) if self.kind == "local" else 1.0

    def reduce_loss(self, loss: Tensor, rows: int) -> float:
        """The step's loss, the same float on every rank."""
        # weights = rows: the union mean for 'local' losses; a 'global' loss is equal anyway
        value, total = weighted_mean(loss, float(rows))
        self._rows = int(total)
        return value

    def step_rows(self) -> int:
        """The global batch size of the last step (the ranks' rows together)."""
        return self._rows

    def reduce_gradients(self, model: nn.Module, rows: int) -> None:
        """Average the gradients across ranks (weighted by ``rows`` for ``'local'`` losses)."""
        reduce_gradients(model.parameters(), self._weight(rows))

    def all_reduce(self, t: Tensor) -> Tensor:
        """``t`` summed over the ranks (each holds its shard's part of a sum over data)."""
        return all_reduce_sum(t)

    def global_rows(self, t: Tensor, index: Tensor) -> Tensor:
        """Rows ``index`` (global row numbers) of the training data ``t`` is this rank's shard
        of, on every rank (a collective; e.g. the probe rows a checkpoint records)."""
        return rows_at(t, index, self.start)

    def epoch_time(self, seconds: float) -> float:
        """The slowest rank's epoch time (the wall time of the parallel epoch)."""
        return all_reduce_max(seconds)
