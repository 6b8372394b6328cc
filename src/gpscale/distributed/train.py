"""Data-parallel training: the ``training.fit`` hook and the per-rank body of ``gpscale fit``.

:class:`DataParallel` is what ``training.fit(..., parallel=...)`` calls on every rank: it
supplies the rank's minibatches (:func:`~gpscale.distributed.shard.rank_batches`), reduces each
step's loss and gradients across ranks before the optimiser sees them (as
``DistributedDataParallel`` does), and agrees on the epoch time, so the ranks' parameters stay
identical and they stop together. Two kinds of loss (module docstring of
:mod:`gpscale.distributed.reduce`):

- ``'local'`` — minibatch methods (``svgp`` and every ``minibatch=True`` method): the per-datum
  loss on the rank's batch; gradients and loss values are averaged weighted by batch size, which
  is exactly the loss and gradient on the union of the batches (the global batch).
- ``'global'`` — data-parallel CaGP-Opt (:mod:`gpscale.distributed.cagp`): every rank computes
  the same full-data loss through differentiable all-reduces; gradients are averaged plainly.
  GGP (:mod:`gpscale.distributed.ggp`) is 'global' too: its statistics are all-reduced once
  before training, after which every rank computes the same loss from the same numbers.

:func:`run_rank` is one rank of ``gpscale fit --nproc P`` (or of a ``torchrun`` job): it loads
the data, builds the model identically on every rank (rank 0's parameters are broadcast),
keeps only its shard of the training set, trains, predicts the test set in shards, and rank 0
writes ``metrics.json``, ``history.csv/json`` and ``model.pt`` exactly as ``gpscale fit`` does.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from gpscale.benchmarks.runner import RunSpec, fit_config, load_data, write_outputs, write_partial
from gpscale.distributed import cagp as dcagp
from gpscale.distributed import ggp as dggp
from gpscale.distributed.env import DEFAULT_TIMEOUT, DistEnv, current, init_from_env
from gpscale.distributed.reduce import (
    all_gather_rows,
    all_reduce_max,
    all_reduce_sum,
    broadcast_module,
    gather_predictive,
    reduce_gradients,
    weighted_mean,
)
from gpscale.distributed.shard import batch_per_rank, num_steps, rank_batches, shard_range
from gpscale.distributions import Predictive
from gpscale.errors import NonFiniteLossError
from gpscale.linalg.policies.block_sparse import LearnedBlockSparsePolicy
from gpscale.methods.base import Method
from gpscale.methods.cagp import CaGP
from gpscale.methods.ski import GGP
from gpscale.training import Evaluate
from gpscale.training.harness import build_method, cast, train_built

__all__ = ["LOSS_KINDS", "DataParallel", "is_sharded_cagp", "run_rank"]

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
        self.num_local = stop - start
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

    def epoch_time(self, seconds: float) -> float:
        """The slowest rank's epoch time (the wall time of the parallel epoch)."""
        return all_reduce_max(seconds)


def is_sharded_cagp(model: Method) -> bool:
    """Whether ``model`` trains with the data-parallel CaGP-Opt loss."""
    return isinstance(model, CaGP) and isinstance(model.policy, LearnedBlockSparsePolicy)


def _predictor(model: Method, x_all: Tensor | None, x: Tensor, y: Tensor, start: int,
               stats: Any = None):
    """``predictor(model, x_test) -> Predictive`` for this rank (a collective)."""

    def predict(m: Method, x_test: Tensor) -> Predictive:
        with torch.no_grad():
            if stats is not None:
                return dggp.predict(m, stats, x_test)
            if x_all is not None:
                return dcagp.predict(m, dcagp.condition(m, x_all, x, y, start), x_test)
            env = current()
            if x_test.shape[0] < env.world_size:
                return m.predict(m.condition(x, y), x_test)
            lo, hi = shard_range(x_test.shape[0], env.rank, env.world_size)
            return gather_predictive(m.predict(m.condition(x, y), x_test[lo:hi]))

    return predict


def run_rank(spec: RunSpec, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """One rank of a data-parallel ``gpscale fit``; returns the metrics (the same on every rank).

    Joins the process group from the torchrun variables unless one is running.

    Raises:
        ValueError: a method without a data-parallel path (supported: ``cagp-opt``, ``ggp``
            and methods with ``minibatch=True``), or CaGP-Opt / GGP with a batch size.
        NonFiniteLossError: as ``training.fit``; rank 0 writes the partial history first.
        DistributedError: another rank failed.
    """
    env = current() if current().active else init_from_env(timeout=timeout)
    data = load_data(spec)
    config, dtype = fit_config(spec, data.num_train)
    n = data.num_train
    x_full, y_full = cast((data.x_train, data.y_train), config, data.task)
    x_test = data.x_test.to(dtype)
    model, setup_time = build_method(spec.method, (x_full, y_full), task=data.task,
                                     num_classes=data.num_classes, options=spec.options,
                                     config=config, seed=spec.seed, device=env.device)
    broadcast_module(model)  # identical parameters, whatever the initialisation did per rank
    start, stop = shard_range(n, env.rank, env.world_size)
    x, y = (t[start:stop].clone().to(env.device) for t in (x_full, y_full))
    x_test = x_test.to(env.device)
    data = dataclasses.replace(data, x_train=x, y_train=data.y_train[start:stop].clone())
    del x_full, y_full  # from here on this rank holds only its shard (and, for CaGP, X)
    stats = None
    if is_sharded_cagp(model) or isinstance(model, GGP):
        if config.batch_size is not None:
            raise ValueError(f"data-parallel {spec.method} trains on the full data; drop "
                             "--batch-size")
    if is_sharded_cagp(model):
        x_all = all_gather_rows(x)
        loss_fn, kind = dcagp.ShardedCaGPLoss(x_all, start), "global"
    elif isinstance(model, GGP):  # one pass over the shard, one all-reduce, then replicated
        x_all, stats = None, dggp.statistics(model, (x, y), start=start, num_points=n)
        loss_fn, kind = dggp.ShardedGGPLoss(stats), "global"
    elif getattr(model, "minibatch", False) and model.trainable:
        x_all, loss_fn, kind = None, None, "local"
    else:
        raise ValueError(f"method {spec.method!r} has no data-parallel path; supported: "
                         "cagp-opt, ggp and minibatch methods (e.g. svgp)")
    predict = _predictor(model, x_all, x, y, start, stats)
    callbacks = [Evaluate(lambda m: predict(m, x_test), data.y_test, every=spec.eval_every)] \
        if spec.eval_every else []
    try:
        history, _ = train_built(model, (x, y), config, callbacks, loss_fn=loss_fn,
                                 parallel=DataParallel(n, kind=kind, env=env), condition=False)
    except NonFiniteLossError as err:
        if env.is_main:
            write_partial(spec, err.history)
        raise
    tic = time.perf_counter()
    pred = predict(model, x_test)
    metrics: dict[str, Any] = {
        "method": spec.method, "dataset": data.name, "n_train": n, "n_test": data.num_test,
        "num_dims": data.num_dims, **pred.metrics(data.y_test), "setup_time_s": setup_time,
        "train_time_s": history.train_time, "epochs": history.epochs,
        "time_per_epoch_s": history.train_time / max(history.epochs, 1),
        "predict_time_s": all_reduce_max(time.perf_counter() - tic), "stopped": history.stopped,
        "noise": None if pred.noise is None else float(pred.noise.double().mean()),
        "nproc": env.world_size,
    }
    train = None
    if spec.out is not None and model.needs_data_for_prediction:
        train = (all_gather_rows(x) if x_all is None else x_all, all_gather_rows(y))
    if spec.out is not None and env.is_main:
        write_outputs(spec, metrics, history, model, data, train)
    return metrics
