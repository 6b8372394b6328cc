"""Benchmark of data-parallel CaGP-Opt: time per epoch and peak memory per rank for P processes.

Not a registered suite (the lead decides where it goes). :func:`bench_cagp` launches P local
ranks (:func:`~gpscale.distributed.launch.launch`) for each P asked for; each rank generates the
same synthetic data, keeps its shard, builds the same ``cagp-opt`` model and trains a few Adam
epochs with the data-parallel loss (:mod:`gpscale.distributed.cagp`). ``'single'`` adds the
ordinary single-process path (``CaGP.loss(CaGP.condition(X, y))``, the symmetric kernel
product) in a process of its own for comparison.

Measured per rank: wall time per epoch (the slowest rank's; the first epoch, which includes
one-off start-up costs, is excluded when there are several) and the peak resident memory
above the rank's memory just before training (``VmHWM`` reset, see
:mod:`gpscale.benchmarks.memory`; ``torch.cuda.max_memory_allocated`` on GPU). Memory per rank
should fall roughly as 1/P: K(X_r, X) S is n/P × i. Do not run it at large n on the 2-core
development machine; the issue's figure is n = 40,000.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gpscale.benchmarks.memory import current_rss_mb, peak_rss_mb, reset_peak_rss
from gpscale.distributed import cagp as dcagp
from gpscale.distributed.env import current
from gpscale.distributed.launch import launch
from gpscale.distributed.reduce import all_gather_rows, all_reduce_max
from gpscale.distributed.shard import shard_range
from gpscale.distributed.train import DataParallel
from gpscale.methods import build
from gpscale.training import FitConfig, fit

__all__ = ["bench_cagp"]


def _data(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g)
    y = torch.sin(6 * x).sum(-1) / d ** 0.5 + 0.1 * torch.randn(n, generator=g)
    return x, y


def _bench_rank(n: int, d: int, num_actions: int, epochs: int, mode: str,
                seed: int) -> dict[str, Any]:
    """One rank: train ``epochs`` epochs; return its epoch times and peak memory (MB)."""
    env = current()
    x_full, y_full = _data(n, d, seed)
    torch.manual_seed(seed)
    model = build("cagp-opt", d, init=(x_full, y_full), num_actions=num_actions, seed=seed)
    model.to(env.device)
    config = FitConfig(lr=0.05, epochs=epochs, progress=False)
    if mode == "single":
        data, loss_fn, parallel = (x_full.to(env.device), y_full.to(env.device)), None, None
    else:
        start, stop = shard_range(n, env.rank, env.world_size)
        x, y = x_full[start:stop].to(env.device), y_full[start:stop].to(env.device)
        data, x_all = (x, y), all_gather_rows(x)
        loss_fn, parallel = dcagp.ShardedCaGPLoss(x_all, start), DataParallel(n, kind="global")
        del x_full, y_full
    cuda = env.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(env.device)
        base = torch.cuda.memory_allocated(env.device) / 2**20
    else:
        reset_peak_rss()
        base = current_rss_mb()
    tic = time.perf_counter()
    history = fit(model, loss_fn, data, config, parallel=parallel)
    wall = time.perf_counter() - tic
    peak = torch.cuda.max_memory_allocated(env.device) / 2**20 if cuda else peak_rss_mb()
    times = [b - a for a, b in zip([0.0, *history.column("time_s")], history.column("time_s"),
                                   strict=False)]
    return {"epoch_times_s": times, "wall_s": all_reduce_max(wall),
            "peak_mb": peak - base, "loss": history.column("loss")[-1]}


def bench_cagp(n: int, *, nprocs: tuple[int | str, ...] = ("single", 1, 2), d: int = 8,
               num_actions: int = 256, epochs: int = 3, seed: int = 0,
               threads: int | None = None) -> list[dict[str, Any]]:
    """Time per epoch and peak memory per rank of CaGP-Opt for each process count.

    Args:
        n: training points (synthetic, d inputs).
        nprocs: process counts P, and ``'single'`` for the ordinary single-process loss.
        d: input dimension.
        num_actions: i.
        epochs: Adam epochs per run (≥ 2 so that the first, warm-up epoch can be dropped).
        seed: data, model and action seed (the same for every P).
        threads: torch threads per rank; default cores // P.

    Returns:
        One row per entry of ``nprocs``: ``nproc``, ``time_per_epoch_s``, ``peak_mb_per_rank``
        (the largest over ranks), ``peak_mb_ranks``, ``final_loss`` (equal across P up to
        rounding, a sanity check), ``n``, ``num_actions``.
    """
    rows = []
    for p in nprocs:
        mode, count = ("single", 1) if p == "single" else ("parallel", int(p))
        ranks = launch(_bench_rank, (n, d, num_actions, epochs, mode, seed), nproc=count,
                       threads=threads)
        times = ranks[0]["epoch_times_s"]
        steady = times[1:] if len(times) > 1 else times
        rows.append({"nproc": p, "n": n, "num_actions": num_actions,
                     "time_per_epoch_s": sum(steady) / len(steady),
                     "peak_mb_per_rank": max(r["peak_mb"] for r in ranks),
                     "peak_mb_ranks": [r["peak_mb"] for r in ranks],
                     "final_loss": ranks[0]["loss"]})
    return rows
