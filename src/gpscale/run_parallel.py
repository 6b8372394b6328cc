"""The ranks of a data-parallel ``gpscale fit`` (``--nproc P`` or a ``torchrun`` job) as a
strategy of the one pipeline, :func:`gpscale.run.run`.

:class:`Ranks` builds the model identically on every rank through the training harness (rank 0's
parameters are broadcast), keeps only its shard of the training set and asks the model how to
train on it (:meth:`~gpscale.methods.base.Method.shard_plan`: the loss, its kind, a collective
predictor), then trains with the :class:`~gpscale.training.parallel.DataParallel` hook. Loading,
the choice of ``auto``, the configuration, the metrics and the outputs are ``run``'s; rank 0 logs
and writes. With ``--checkpoint`` every rank checks the checkpoint against the run as one
process does (``training.fit``: the same settings and the same training data, whose probe rows
the ranks gather from their shards), and rank 0 says where it resumed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch import Tensor

from gpscale.data import Dataset
from gpscale.distributed.env import DEFAULT_TIMEOUT, DistEnv, collective, current, init_from_env
from gpscale.distributed.reduce import all_gather_rows, all_reduce_max, broadcast_module
from gpscale.distributed.shard import shard_range
from gpscale.distributions import Predictive
from gpscale.run import Outcome, RunSpec, run
from gpscale.training import FitConfig
from gpscale.training.harness import after_build, build_method, start_warm, train_built
from gpscale.training.parallel import DataParallel

__all__ = ["Ranks", "run_rank"]


class Ranks:
    """This process as one rank of a data-parallel run (the strategy ``run`` trains in).

    Args:
        env: the distributed environment of the process group this rank has joined.
    """

    def __init__(self, env: DistEnv):
        self.env = env
        self.is_main = env.is_main
        self.metrics = {"nproc": env.world_size}

    @staticmethod
    def slowest(seconds: float) -> float:
        return all_reduce_max(seconds)

    @property
    def race_limit(self) -> float:
        """Most seconds ``auto``'s race may take: the other ranks wait for it in one
        collective, so half its timeout (a slice can overrun its share)."""
        return 0.5 * self.env.timeout

    def agree(self, choose: Callable[[], Any]) -> Any:
        """``choose()`` on rank 0, its result on every rank (``auto``'s choice: a race timed
        on one rank alone, which the others wait for)."""
        box = [choose() if self.is_main else None]
        with collective("broadcast (auto's choice)"):
            dist.broadcast_object_list(box, 0)
        return box[0]

    def train(self, spec: RunSpec, data: Dataset, config: FitConfig, train: tuple[Tensor, Tensor],
              callbacks_for: Callable[[Callable[..., Predictive]], list],
              warm: dict[str, Tensor] | None = None) -> Outcome:
        """Build on all rows (from ``warm``'s parameters where given), shard, train on the
        shard; ValueError for a method without a data-parallel path, or one whose loss needs
        the whole shard given a batch size."""
        env = self.env
        n = train[0].shape[0]
        model, setup_time = build_method(spec.method, train, task=data.task,
                                         num_classes=data.num_classes, options=spec.options,
                                         config=config, seed=spec.seed, device=env.device)
        config = after_build(config, warm, setup_time)
        if warm:
            start_warm(model, warm, spec.method, spec.options)
        broadcast_module(model)  # identical parameters, whatever the initialisation did per rank
        start, stop = shard_range(n, env.rank, env.world_size)
        x, y = (t[start:stop].clone().to(env.device) for t in train)
        del train  # from here on this rank holds only its shard (and what its plan gathers)
        plan = model.shard_plan(x, y, start=start, num_points=n)
        if plan is None:
            raise ValueError(f"method {spec.method!r} has no data-parallel path; run it in one "
                             "process (without --nproc), or choose a minibatch method, e.g. svgp")
        if plan.full_batch and config.batch_size is not None:
            raise ValueError(f"data-parallel {spec.method} trains on the full data; drop "
                             "--batch-size")

        def predict(x_test: Tensor) -> Predictive:
            return plan.predict(x_test.to(env.device))

        history, _ = train_built(model, (x, y), config,
                                 callbacks_for(lambda _, x_test: predict(x_test)),
                                 loss_fn=plan.loss_fn, condition=False,
                                 parallel=DataParallel(n, kind=plan.kind, env=env))

        def saved() -> tuple[tuple[Tensor, Tensor] | None, Any]:
            if not model.needs_data_for_prediction:
                return None, None
            inputs = all_gather_rows(x) if plan.inputs is None else plan.inputs
            return (inputs, all_gather_rows(y)), None

        return Outcome(model, history, setup_time, predict, saved)


def run_rank(spec: RunSpec, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """One rank of a data-parallel ``gpscale fit``: ``run(spec, Ranks(...))``; returns the
    metrics (the same on every rank). Joins the process group from the torchrun variables
    unless one is running.

    Raises:
        ValueError: a method without a data-parallel path
            (:meth:`~gpscale.methods.base.Method.shard_plan`), or one that trains on the full
            data given a batch size.
        NonFiniteLossError: as ``training.fit``; rank 0 writes the partial history first.
        DistributedError: another rank failed.
    """
    env = current() if current().active else init_from_env(timeout=timeout)
    return run(spec, Ranks(env)).metrics
