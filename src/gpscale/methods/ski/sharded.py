r"""Data-parallel GGP: sufficient statistics per rank, summed across ranks (notes/002 §4.5).

GGP (:mod:`gpscale.methods.ski`) sees the data only through

=====================  ==============================  =================
statistic              per-rank piece                  reduction
=====================  ==============================  =================
WᵀW (stencil)          Σ_{j ∈ r} w_j w_jᵀ              all-reduce sum
Wᵀy, Wᵀ1               Σ_{j ∈ r} w_j y_j, Σ w_j        all-reduce sum
yᵀy, Σ y, n            Σ_{j ∈ r} y_j², y_j, 1          all-reduce sum
Wᵀz_l, ‖z_l‖²          Σ_{j ∈ r} w_j z_lj, z_lj²       all-reduce sum
=====================  ==============================  =================

so each rank makes one streaming pass over its own shard (rows start … stop − 1 of the
training set, :func:`~gpscale.distributed.shard.shard_range`) and a single all-reduce of
O(7^d m + p m) floats gives every rank the statistics of all n points. Everything after that —
the factorized CG, the log-determinant, the gradients, prediction — is m-dimensional and
runs replicated on every rank from identical numbers (no further communication; the
``'global'`` gradient average of :class:`~gpscale.training.parallel.DataParallel` is then a
no-op on identical gradients). Memory per rank: its shard plus O(chunk · 16^d + 7^d m + p m).

Probes. The log-determinant uses p Rademacher probes z_l ∈ ℝⁿ. One process
(:func:`gpscale.methods.ski.sufficient_statistics` on tensors) draws them chunk after chunk of
``chunk_size`` rows from one generator seeded with the model's ``seed``. A rank reproduces
exactly the rows of that stream that belong to its shard (:class:`_ProbeTape`: it draws, and
discards, the chunks before its first row; O(start · p) random numbers, no data), so the
reduced statistics, probes included, equal the single-process ones up to the order of
floating-point summation (the tests check 1e-12) and the loss, gradients and predictions match.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

from gpscale.distributed.env import current
from gpscale.distributed.reduce import all_reduce_sums, predict_in_shards
from gpscale.distributions import Predictive
from gpscale.linalg.interpolation import Grid
from gpscale.linalg.ops import rademacher
from gpscale.methods.base import Method, ShardPlan
from gpscale.methods.ski.statistics import (
    StatisticsAccumulator,
    SufficientStatistics,
    float64_chunks,
)
from gpscale.validation import check_xy

__all__ = [
    "DEFAULT_CHUNK", "ShardedGGPLoss", "predict", "reduce_statistics", "sharded_plan",
    "shard_statistics", "statistics",
]

DEFAULT_CHUNK = 100_000
"""Rows per chunk; the default of ``GGP.statistics``, so the probe stream is the same."""

_F64 = torch.float64


class _ProbeTape:
    """The single-process probe stream read from global row ``start`` on.

    Global chunk j (rows j·c … min((j+1)·c, n) − 1) has its (rows, p) Rademacher block drawn
    from one generator, in chunk order, as ``sufficient_statistics`` draws them.
    """

    def __init__(self, num_points: int, num_probes: int, seed: int, chunk_size: int,
                 start: int):
        self.n, self.p, self.c = num_points, num_probes, chunk_size
        self.generator = torch.Generator().manual_seed(seed)
        self.next_chunk, self.skip = 0, 0
        self.block = torch.zeros(0, num_probes, dtype=_F64)
        for _ in range(start // chunk_size):  # chunks wholly before the shard: drawn, dropped
            self._draw()
        self.used = self.block.shape[0]  # the next take draws the chunk holding ``start``
        self.skip = start % chunk_size  # … and drops its rows before ``start``

    def _draw(self) -> None:
        rows = min(self.c, self.n - self.next_chunk * self.c)
        if rows <= 0:
            raise ValueError(f"the shard reads past the {self.n} training points")
        self.block = rademacher(rows, self.p, dtype=_F64, generator=self.generator)
        self.next_chunk, self.used, self.skip = self.next_chunk + 1, self.skip, 0

    def take(self, rows: int) -> Tensor:
        """The next ``rows`` rows of the stream (rows, p)."""
        parts = []
        while rows > 0:
            if self.used == self.block.shape[0]:
                self._draw()
            k = min(rows, self.block.shape[0] - self.used)
            parts.append(self.block[self.used: self.used + k])
            self.used, rows = self.used + k, rows - k
        return torch.cat(parts) if parts else torch.zeros(0, self.p, dtype=_F64)


def _local_chunks(data, chunk_size: int) -> Iterator[tuple[Tensor, Tensor]]:
    """(x, y) float64 chunks from this rank's ``(x, y)`` arrays/tensors or chunk iterable."""
    for x, y in float64_chunks(data, chunk_size):
        yield x, y.reshape(-1)


def shard_statistics(grid: Grid, data: tuple | Iterable, *, start: int, num_points: int,
                     num_probes: int = 16, seed: int = 0,
                     chunk_size: int = DEFAULT_CHUNK) -> SufficientStatistics:
    """This rank's statistics (not reduced) of global rows ``start …`` in one pass, float64.

    Args:
        grid: the model's grid; every point must lie in ``grid.bounds()``.
        data: this rank's rows as ``(x, y)`` tensors/arrays/memmaps, or an iterable of
            ``(x_chunk, y_chunk)`` covering them in order (any chunk sizes).
        start: the global index of the rank's first row.
        num_points: n, the training points of all ranks together.
        num_probes, seed: the model's ``num_probes`` and ``seed`` options.
        chunk_size: rows per chunk of the single-process probe stream (and of array input);
            keep the default to match ``GGP.condition`` in one process.

    Returns:
        Statistics with ``n`` = this rank's row count and ``probe_sq`` = (n_r, …, n_r).

    Raises:
        ValueError: invalid data, a point outside the grid, rows past ``num_points``.

    Cost: O(n_r (16^d + (p + 2) 4^d)) time (cubic), O(chunk · 16^d) transient memory, plus
    O(start · p) discarded random numbers for the probe stream.
    """
    if chunk_size < 1 or not 0 <= start < num_points:
        raise ValueError(f"need chunk_size >= 1 and 0 <= start < num_points; got chunk_size "
                         f"{chunk_size}, start {start}, num_points {num_points}")
    acc = StatisticsAccumulator(grid, num_probes)
    tape = _ProbeTape(num_points, num_probes, seed, chunk_size, start) if num_probes else None
    for x, y in _local_chunks(data, chunk_size):
        if start + acc.n + y.shape[0] > num_points:
            raise ValueError(f"rows {start} … {start + acc.n + y.shape[0] - 1} lie past the "
                             f"{num_points} training points")
        check_xy(x, y)
        acc.add(x, y, None if tape is None else tape.take(y.shape[0]))
    return acc.result("no data on this rank: the chunks were empty")


def reduce_statistics(stats: SufficientStatistics) -> SufficientStatistics:
    """The ranks' statistics summed (one all-reduce of O(7^d m + p m) floats); a collective.

    Without a process group this returns ``stats`` unchanged.
    """
    if not current().active:
        return stats
    n = torch.tensor(float(stats.n), dtype=_F64)
    with torch.no_grad():
        coef, wt_y, wt_one, yty, y_sum, wt_probes, probe_sq, total = all_reduce_sums(
            stats.gram.coef, stats.wt_y, stats.wt_one, stats.yty, stats.y_sum, stats.wt_probes,
            stats.probe_sq, n)
    gram = dataclasses.replace(stats.gram, coef=coef)
    return SufficientStatistics(stats.grid, gram, wt_y, wt_one, yty, y_sum, int(total),
                                wt_probes, probe_sq)


def statistics(model: Method, data: tuple | Iterable, *, start: int, num_points: int,
               chunk_size: int = DEFAULT_CHUNK) -> SufficientStatistics:
    """The statistics of all n points on every rank (what ``model.statistics`` gives in one
    process), from this rank's rows; a collective.

    Args:
        model: a ``ggp`` model, identical on every rank (its grid, probes, seed, WᵀW format).
        data, start, num_points, chunk_size: as :func:`shard_statistics`.

    Raises:
        ValueError: not a GGP model; the shards do not add up to ``num_points``.
    """
    if getattr(model, "key", None) != "ggp":
        raise ValueError(f"data-parallel statistics need a ggp model; got {type(model).__name__}")
    local = shard_statistics(model.grid, data, start=start, num_points=num_points,
                             num_probes=model.options["num_probes"], seed=model.options["seed"],
                             chunk_size=chunk_size)
    stats = reduce_statistics(local)
    if stats.n != num_points:
        raise ValueError(f"the ranks' shards hold {stats.n} points together, not num_points = "
                         f"{num_points}")
    if model.options["wtw_format"] == "csr":
        stats = dataclasses.replace(stats, gram_csr=stats.gram.to_csr())
    return stats


class ShardedGGPLoss:
    """``loss_fn(model, x_r, y_r)`` for ``training.fit``: the loss from the reduced statistics.

    The rank's batch is ignored (the statistics already hold all n points); the value, the
    same on every rank, is ``model.loss(model.condition_stats(stats))``.
    """

    def __init__(self, stats: SufficientStatistics):
        self.stats = stats

    def __call__(self, model: Method, x: Tensor, y: Tensor) -> Tensor:
        return model.loss(model.condition_stats(self.stats))


def predict(model: Method, stats: SufficientStatistics, x_test: Tensor,
            chunk_size: int = 4096) -> Predictive:
    """Predictive at ``x_test`` (t, d), the same on every rank (a collective when P > 1).

    Each rank predicts rows ``shard_range(t, rank, P)`` from the replicated statistics and the
    parts are gathered; with fewer test points than ranks every rank predicts all of them.
    """
    with torch.no_grad():
        state = model.condition_stats(stats)
        return predict_in_shards(lambda part: model.predict(state, part, chunk_size), x_test)


def sharded_plan(model: Method, x: Tensor, y: Tensor, start: int, num_points: int) -> ShardPlan:
    """GGP's :class:`~gpscale.methods.base.ShardPlan`: one pass over the shard and one
    all-reduce give every rank the statistics of all points; from there training and
    prediction run replicated on identical numbers."""
    stats = statistics(model, (x, y), start=start, num_points=num_points)
    return ShardPlan("global", lambda x_test: predict(model, stats, x_test),
                     ShardedGGPLoss(stats), full_batch=True)
