"""One rank of a data-parallel ``gpscale fit`` (``--nproc P`` or a ``torchrun`` job): the
data-parallel counterpart of :func:`gpscale.run.run`, which it builds on (the command line calls
it; it imports only what lies below: the run, training, the methods and the distributed
infrastructure).

:func:`run_rank` loads the data, builds the model identically on every rank through the training
harness (rank 0's parameters are broadcast), keeps only its shard of the training set, trains
with the :class:`~gpscale.training.parallel.DataParallel` hook, predicts the test set in shards,
and rank 0 writes ``metrics.json``, ``history.csv/json`` and ``model.pt`` exactly as
``gpscale fit`` does (:mod:`gpscale.run`). With ``--checkpoint`` every rank checks the checkpoint
against the run as one process does (``training.fit``: the same settings and the same training
data, whose probe rows the ranks gather from their shards), and rank 0 says where it resumed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch
from torch import Tensor

from gpscale.distributed.env import DEFAULT_TIMEOUT, current, init_from_env
from gpscale.distributed.reduce import (
    all_gather_rows,
    all_reduce_max,
    broadcast_module,
    gather_predictive,
)
from gpscale.distributed.shard import shard_range
from gpscale.distributions import Predictive
from gpscale.errors import NonFiniteLossError
from gpscale.linalg.policies.block_sparse import LearnedBlockSparsePolicy
from gpscale.methods.base import Method
from gpscale.methods.cagp import CaGP
from gpscale.methods.cagp import sharded as dcagp
from gpscale.methods.ski import GGP
from gpscale.methods.ski import sharded as dggp
from gpscale.run import (
    RunSpec,
    fit_config,
    load_data,
    plan_text,
    resolve_auto,
    write_outputs,
    write_partial,
)
from gpscale.training import Evaluate
from gpscale.training.harness import build_method, cast, train_built
from gpscale.training.parallel import DataParallel

__all__ = ["is_sharded_cagp", "run_rank"]


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
    spec = resolve_auto(spec, data)
    config, dtype = fit_config(spec, data.num_train)
    n = data.num_train
    if env.is_main:  # the plan line of a one-process run (the ranks log as gpscale fit does)
        latents = data.num_classes if (data.num_classes or 0) > 2 else 1
        logging.getLogger("gpscale.fit").info(plan_text(spec.method, config, spec.options, n,
                                                        latents, data.task))
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
