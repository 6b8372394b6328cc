"""Benchmarks of data-parallel CaGP-Opt and GGP: time per epoch and peak memory per rank.

Not a registered suite (the lead decides where it goes). :func:`bench_cagp` launches P local
ranks (:func:`~gpscale.distributed.launch.launch`) for each P asked for; each rank generates the
same synthetic data, keeps its shard, builds the same ``cagp-opt`` model and trains a few Adam
epochs with the data-parallel loss (:mod:`gpscale.methods.cagp.sharded`). ``'single'`` adds the
ordinary single-process path (``CaGP.loss(CaGP.condition(X, y))``, the symmetric kernel
product) in a process of its own for comparison.

Measured per rank: wall time per epoch (the slowest rank's; the first epoch, which includes
one-off start-up costs, is excluded when there are several) and the peak resident memory
above the rank's memory just before training (``VmHWM`` reset, see
:mod:`gpscale.benchmarks.memory`; ``torch.cuda.max_memory_allocated`` on GPU). Memory per rank
should fall roughly as 1/P: K(X_r, X) S is n/P × i. Do not run it at large n on the 2-core
development machine; the issue's figure is n = 40,000.

:func:`bench_ggp` does the same for GGP (:mod:`gpscale.methods.ski.sharded`): each rank draws only
its rows of a :class:`~gpscale.data.synthetic.FieldStream` (x ~ U[0, 1]^d, a smooth random
field plus noise; the stream's chunks are seeded by their index, so P = 1 and P = 2 see the same
n points), holds them, computes its sufficient statistics in one pass and all-reduces them,
then trains a few epochs from the statistics. Reported: the statistics time (pass + reduce,
the slowest rank's), the time per epoch (m-dimensional, the same work on every rank, so
independent of P and n) and the peak memory per rank, dominated at large n by the held shard
(n/P · (d + 1) float64) — the statistics need O(chunk · 16^d + 7^d m + p m) beyond it. The
issue's figure is n = 10⁷ (do not run that on the 2-core development machine).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gpscale.benchmarks.memory import current_rss_mb, peak_rss_mb, reset_peak_rss
from gpscale.data.synthetic import FieldStream
from gpscale.distributed.env import current
from gpscale.distributed.launch import launch
from gpscale.distributed.reduce import all_gather_rows, all_reduce_max
from gpscale.distributed.shard import shard_range
from gpscale.methods import build
from gpscale.methods.cagp import sharded as dcagp
from gpscale.methods.ski import sharded as dggp
from gpscale.training import FitConfig, fit
from gpscale.training.parallel import DataParallel

__all__ = ["bench_cagp", "bench_ggp"]


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


def _stream_rows(stream: FieldStream, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows start … stop − 1 of the stream, generating only the chunks that hold them.

    The rows are copied into preallocated tensors chunk by chunk, so building the shard peaks at
    the shard plus one chunk (not the two or three copies a concatenation would hold).
    """
    c = stream.chunk_size
    x = y = None
    for j in range(start // c, (stop - 1) // c + 1):
        xc, yc = stream.chunk(j)
        lo, hi = max(start, j * c), min(stop, j * c + xc.shape[0])
        if x is None:
            x = xc.new_empty((stop - start, *xc.shape[1:]))
            y = yc.new_empty((stop - start, *yc.shape[1:]))
        x[lo - start: hi - start] = xc[lo - j * c: hi - j * c]
        y[lo - start: hi - start] = yc[lo - j * c: hi - j * c]
    return x, y


def _bench_ggp_rank(n: int, d: int, grid_size: int, num_probes: int, epochs: int,
                    seed: int, chunk_size: int = dggp.DEFAULT_CHUNK) -> dict[str, Any]:
    """One rank of :func:`bench_ggp`: hold the shard, statistics, ``epochs`` Adam epochs."""
    env = current()
    torch.manual_seed(seed)
    model = build("ggp", d, grid_bounds=([0.0] * d, [1.0] * d), grid_size=grid_size,
                  num_probes=num_probes, seed=seed, kernel="rbf", lengthscale=0.2,
                  outputscale=1.0, noise=0.01, mean_constant=0.0)
    config = FitConfig(lr=0.05, epochs=epochs, progress=False)
    reset_peak_rss()
    base = current_rss_mb()
    start, stop = shard_range(n, env.rank, env.world_size)
    x, y = _stream_rows(FieldStream(n=n, num_dims=d, seed=seed, chunk_size=100_000), start,
                        stop)  # this rank's shard, held as in a data-parallel run
    tic = time.perf_counter()
    stats = dggp.statistics(model, (x, y), start=start, num_points=n, chunk_size=chunk_size)
    stats_time = all_reduce_max(time.perf_counter() - tic)
    stats_peak = peak_rss_mb() - base  # the shard plus the statistics pass
    history = fit(model, dggp.ShardedGGPLoss(stats), (x, y), config,
                  parallel=DataParallel(n, kind="global"))
    times = [b - a for a, b in zip([0.0, *history.column("time_s")], history.column("time_s"),
                                   strict=False)]
    return {"stats_s": stats_time, "epoch_times_s": times, "peak_mb": peak_rss_mb() - base,
            "stats_peak_mb": stats_peak, "loss": history.column("loss")[-1]}


def bench_ggp(n: int, *, nprocs: tuple[int, ...] = (1, 2), d: int = 2, grid_size: int = 100,
              num_probes: int = 16, epochs: int = 3, seed: int = 0,
              threads: int | None = None,
              chunk_size: int = dggp.DEFAULT_CHUNK) -> list[dict[str, Any]]:
    """Statistics time, time per epoch and peak memory per rank of GGP for each process count.

    Args:
        n: training points (a :class:`~gpscale.data.synthetic.FieldStream` on [0, 1]^d).
        nprocs: process counts P.
        d: input dimension (1 … 3).
        grid_size: grid points per dimension (m = grid_size^d before padding).
        num_probes: p log-determinant probes.
        epochs: Adam epochs (≥ 2 so that the first can be dropped from the epoch time).
        seed: data, probe and model seed (the same for every P).
        threads: torch threads per rank; default cores // P.
        chunk_size: rows per chunk of the statistics pass (its working set, the part of the
            memory that does not fall with P, grows with it). It also sets the chunking of the
            probe stream, so the loss matches single-process GGP only at the default.

    Returns:
        One row per P: ``nproc``, ``n``, ``num_grid``, ``stats_time_s``, ``time_per_epoch_s``,
        ``peak_mb_per_rank`` (largest over ranks, the whole run), ``peak_mb_ranks``,
        ``stats_peak_mb_per_rank`` (largest over ranks, up to the end of the statistics: the
        shard plus the pass, the part that falls with P; the training epochs' m-dimensional
        solves are replicated and do not), ``final_loss`` (equal across P up to the solver's
        sensitivity to rounding, a sanity check).
    """
    rows = []
    for p in nprocs:
        ranks = launch(_bench_ggp_rank, (n, d, grid_size, num_probes, epochs, seed, chunk_size),
                       nproc=p, threads=threads)
        times = ranks[0]["epoch_times_s"]
        steady = times[1:] if len(times) > 1 else times
        rows.append({"nproc": p, "n": n, "num_grid": grid_size**d,
                     "stats_time_s": ranks[0]["stats_s"],
                     "time_per_epoch_s": sum(steady) / len(steady),
                     "peak_mb_per_rank": max(r["peak_mb"] for r in ranks),
                     "peak_mb_ranks": [r["peak_mb"] for r in ranks],
                     "stats_peak_mb_per_rank": max(r["stats_peak_mb"] for r in ranks),
                     "final_loss": ranks[0]["loss"]})
    return rows
