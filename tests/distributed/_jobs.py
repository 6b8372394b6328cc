"""Module-level rank bodies for the spawned 2-process tests (pickled by reference)."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from gpscale.distributed import (
    all_gather_rows,
    all_reduce_sum,
    broadcast_module,
    current,
    shard_range,
)
from gpscale.distributed.env import DistEnv
from gpscale.distributed.reduce import check_replicated, reduce_gradients
from gpscale.errors import SavedFileError
from gpscale.methods import build
from gpscale.methods.baselines import svgp  # noqa: F401  (registers svgp)
from gpscale.methods.cagp import sharded as dcagp
from gpscale.methods.ski import sharded as dggp
from gpscale.training import FitConfig, fit
from gpscale.training.harness import load_warm
from gpscale.training.parallel import DataParallel
from gpscale.training.race import warm_parameters

torch.set_default_dtype(torch.float64)  # as conftest.py does in the parent process

HYPER = {"lengthscale": 0.4, "outputscale": 1.3, "noise": 0.05, "mean_constant": 0.2}


def data(n: int, seed: int = 0, num_test: int = 31):
    """Smooth 2-D regression data in float64 (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n + num_test, 2, generator=g, dtype=torch.float64) * 2
    y = torch.sin(3 * x[:, 0]) + torch.cos(2 * x[:, 1]) + 0.1 * torch.randn(
        n + num_test, generator=g, dtype=torch.float64)
    return x[:n], y[:n], x[n:]


def cagp_model(x, y, num_actions: int = 12):
    return build("cagp-opt", 2, init=(x, y), num_actions=num_actions, **HYPER).double()


def svgp_model(x, y):
    return build("svgp", 2, init=(x, y), num_inducing=8, **HYPER).double()


def grads(model) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def params(model) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in model.named_parameters()}


def _shard(n, x, y):
    env = current()
    start, stop = shard_range(n, env.rank, env.world_size)
    return start, x[start:stop].clone(), y[start:stop].clone()


def cagp_job(n: int, epochs: int) -> dict:
    """Loss, averaged gradients, predictions and a short fit of data-parallel CaGP-Opt."""
    x_full, y_full, x_test = data(n)
    model = cagp_model(x_full, y_full)
    start, x, y = _shard(n, x_full, y_full)
    del x_full, y_full
    x_all = all_gather_rows(x)
    state = dcagp.condition(model, x_all, x, y, start)
    loss = dcagp.loss(model, state)
    loss.backward()
    reduce_gradients(model.parameters())
    out = {"loss": float(loss.detach()), "grads": grads(model), "rows": state.K_S.shape[0],
           "terms": (float(dcagp.kl(state).detach()),
                     float(dcagp.expected_log_lik(state).detach()))}
    with torch.no_grad():
        pred = dcagp.predict(model, state, x_test)
    out["pred"] = (pred.mean, pred.variance)
    config = FitConfig(lr=0.05, epochs=epochs, progress=False)
    history = fit(model, dcagp.ShardedCaGPLoss(x_all, start), (x, y), config,
                  parallel=DataParallel(n, kind="global"))
    out.update(history=history.column("loss"), params=params(model),
               spread=check_replicated(model))
    return out


def grown_cagp_job(n: int, kept: int) -> dict:
    """``auto``'s hand-over under ``--nproc``: rank 0 holds a race's CaGP-Opt on the first
    ``kept`` of ``n`` rows and grows its actions to every row; the dict reaches the other rank
    as the race's choice does (an object broadcast); each rank starts a model on every row
    from it, the parameters and buffers are broadcast as before training, and one sharded loss
    and prediction follow."""
    x_full, y_full, x_test = data(n)
    box: list = [None]
    if current().rank == 0:
        race = cagp_model(x_full[:kept], y_full[:kept])
        box = [race.warm_for_rows(warm_parameters(race), x_full, torch.arange(kept),
                                  torch.arange(kept, n), race.options)]
    dist.broadcast_object_list(box, 0)
    model = cagp_model(x_full, y_full)
    load_warm(model, box[0])
    broadcast_module(model)
    start, x, y = _shard(n, x_full, y_full)
    state = dcagp.condition(model, all_gather_rows(x), x, y, start)
    with torch.no_grad():
        pred = dcagp.predict(model, state, x_test)
    return {"warm": box[0], "index": model.policy.index.clone(),
            "loss": float(dcagp.loss(model, state).detach()), "pred": (pred.mean, pred.variance)}


def svgp_job(n: int, batch_size: int, epochs: int) -> dict:
    """One step's loss/gradients on the rank batches, then a short minibatch fit."""
    x_full, y_full, x_test = data(n)
    model = svgp_model(x_full, y_full)
    start, x, y = _shard(n, x_full, y_full)
    parallel = DataParallel(n, kind="local")
    idx = next(iter(parallel.batches(x.shape[0], batch_size, torch.Generator().manual_seed(5))))
    loss = model.loss(model.condition(x[idx], y[idx]))
    loss.backward()
    parallel.reduce_gradients(model, idx.shape[0])
    out = {"batch": all_gather_rows(idx + start), "grads": grads(model), "rows": idx.shape[0],
           "loss": parallel.reduce_loss(loss.detach(), idx.shape[0])}
    model.zero_grad(set_to_none=True)
    config = FitConfig(lr=0.05, epochs=epochs, batch_size=batch_size, progress=False, seed=3)
    history = fit(model, None, (x, y), config, parallel=parallel)
    with torch.no_grad():
        pred = model.predict(None, x_test)
    out.update(history=history.column("loss"), params=params(model),
               spread=check_replicated(model), pred=(pred.mean, pred.variance))
    return out


class UnionBatches:
    """One process stepping through the union of the 2 ranks' batches (the global batch)."""

    is_main = True

    def __init__(self, n: int):
        self.ranks = [DataParallel(n, env=DistEnv(rank=r, world_size=2)) for r in range(2)]
        self.starts = [0, self.ranks[0].num_local]

    def batches(self, n, batch_size, generator):
        state = generator.get_state()
        parts = []
        for rank in self.ranks:  # every rank draws from an identically seeded generator
            generator.set_state(state)
            parts.append(list(rank.batches(rank.num_local, batch_size, generator)))
        for step in zip(*parts, strict=True):
            self.sizes = [idx.shape[0] for idx in step]  # the ranks' parts of this step
            yield torch.cat([idx + s for idx, s in zip(step, self.starts, strict=True)])

    def reduce_loss(self, loss, rows):
        self.rows = rows
        return float(loss)

    def step_rows(self):
        return self.rows

    def reduce_gradients(self, model, rows):
        pass

    def epoch_time(self, seconds):
        return seconds


def failing_job(mode: str, wait: float) -> float:
    """Rank 1 dies (``'die'``), stalls (``'hang'``: sleeps, its heartbeat goes on) or is
    stopped (``'stop'``: SIGSTOP, everything freezes); rank 0 runs a collective."""
    env = current()
    if env.rank == 1:
        if mode == "die":
            os._exit(3)
        if mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(wait)
    tic = time.monotonic()
    all_reduce_sum(torch.ones(3))
    return time.monotonic() - tic


def equivalence_job(cagp_args: tuple, svgp_args: tuple) -> dict:
    """Both jobs in one launch (one process start-up instead of two)."""
    return {"cagp": cagp_job(*cagp_args), "svgp": svgp_job(*svgp_args)}


# -- GGP (statistics all-reduced once) -------------------------------------------------------

# rtol 1e-10: at the default 1e-3 the factorized CG's loss moves by ~1e-5 relative when the
# statistics change by rounding (1e-15; any other order of the sums), in one process as well.
GGP_OPTIONS = {"grid_size": 20, "num_probes": 4, "rtol": 1e-10, "max_iters": 2000, **HYPER}
STAT_FIELDS = ("wt_y", "wt_one", "yty", "y_sum", "wt_probes", "probe_sq")


def ggp_model(x, y):
    return build("ggp", 2, init=(x, y), **GGP_OPTIONS).double()


def stat_fields(stats) -> dict:
    """The summed fields of SufficientStatistics as a dict (WᵀW as its stencil coefficients)."""
    out = {name: getattr(stats, name).detach().clone() for name in STAT_FIELDS}
    return {**out, "gram": stats.gram.coef.clone(), "n": stats.n}


def ggp_job(n: int, chunk: int, epochs: int) -> dict:
    """Reduced statistics (small chunks), loss, gradients, predictions and a short fit."""
    x_full, y_full, x_test = data(n)
    model = ggp_model(x_full, y_full)
    start, x, y = _shard(n, x_full, y_full)
    del x_full, y_full
    small = dggp.statistics(model, (x, y), start=start, num_points=n, chunk_size=chunk)
    stats = dggp.statistics(model, (x, y), start=start, num_points=n)  # default chunks
    loss = dggp.ShardedGGPLoss(stats)(model, x, y)
    loss.backward()
    reduce_gradients(model.parameters())
    out = {"stats": stat_fields(small), "loss": float(loss.detach()), "grads": grads(model)}
    pred = dggp.predict(model, stats, x_test)
    out["pred"] = (pred.mean, pred.variance)
    model.zero_grad(set_to_none=True)
    config = FitConfig(lr=0.05, epochs=epochs, progress=False)
    history = fit(model, dggp.ShardedGGPLoss(stats), (x, y), config,
                  parallel=DataParallel(n, kind="global"))
    out.update(history=history.column("loss"), params=params(model),
               spread=check_replicated(model))
    return out


# -- Minibatch methods: SoftKI and SOLVE-GP (DDP gradient averaging) ---------------------------

def softki_model(x, y, objective: str = "mll"):
    return build("softki", 2, init=(x, y), num_inducing=8, objective=objective, num_probes=3,
                 lengthscale=0.4, outputscale=1.3, noise=0.05).double()


def solvegp_model(x, y):
    return build("solvegp", 2, init=(x, y), num_inducing=6, num_orthogonal=5, **HYPER).double()


def probes_for(rows: torch.Tensor, num_probes: int = 3) -> torch.Tensor:
    """Fixed probes of the global rows ``rows`` (the same numbers in every process)."""
    g = torch.Generator().manual_seed(11)
    return torch.randn(10_000, num_probes, generator=g, dtype=torch.float64)[rows]


def minibatch_job(name: str, n: int, batch_size: int, epochs: int) -> dict:
    """One DDP step (loss, averaged gradients) on the rank batches, then a short fit."""
    x_full, y_full, x_test = data(n)
    make = {"softki": softki_model, "solvegp": solvegp_model}[name]
    model = make(x_full, y_full)
    start, x, y = _shard(n, x_full, y_full)
    parallel = DataParallel(n, kind="local")
    idx = next(iter(parallel.batches(x.shape[0], batch_size, torch.Generator().manual_seed(5))))
    out = {"batch": all_gather_rows(idx + start), "rows": idx.shape[0]}
    if name == "softki":  # the pseudoloss too, with probes fixed per global row
        pseudo = softki_model(x_full, y_full, objective="pseudoloss")
        value = pseudo.loss(pseudo.condition(x[idx], y[idx], probes_for(idx + start)))
        value.backward()
        parallel.reduce_gradients(pseudo, idx.shape[0])
        out.update(pseudo_loss=parallel.reduce_loss(value.detach(), idx.shape[0]),
                   pseudo_grads=grads(pseudo))
    del x_full, y_full
    loss = model.loss(model.condition(x[idx], y[idx]))
    loss.backward()
    parallel.reduce_gradients(model, idx.shape[0])
    out.update(grads=grads(model), loss=parallel.reduce_loss(loss.detach(), idx.shape[0]))
    model.zero_grad(set_to_none=True)
    config = FitConfig(lr=0.02, epochs=epochs, batch_size=batch_size, progress=False, seed=3)
    history = fit(model, None, (x, y), config, parallel=parallel)
    with torch.no_grad():
        state = model.condition(all_gather_rows(x), all_gather_rows(y)) if name == "softki" \
            else None
        pred = model.predict(state, x_test)
    out.update(history=history.column("loss"), params=params(model),
               spread=check_replicated(model), pred=(pred.mean, pred.variance))
    return out


def minibatch_methods_job(names: tuple, args: tuple) -> dict:
    """Several minibatch jobs in one launch."""
    return {name: minibatch_job(name, *args) for name in names}


def bad_input_job(rank_to_fail: int) -> int:
    """Rank ``rank_to_fail`` rejects its input as every rank would; the others return."""
    if current().rank == rank_to_fail:
        raise ValueError("option num_actions must be at least 1; got 0")
    return current().rank


def object_job() -> object:
    """A result that is not plain data (a result file holds data only)."""
    return Exception("not data")


def resume_job(checkpoint: str, n: int) -> dict:
    """Resume ``checkpoint`` (written by one process on ``data(n)``) on the ranks: first on
    other data of the same shape, then on its own data with more epochs. What each did: the
    epochs of its history, or the error's message."""
    config = FitConfig(lr=0.05, epochs=4, progress=False, checkpoint=checkpoint)
    out = {}
    for name, seed in (("other", 1), ("same", 0)):
        x, y, _ = data(n, seed=seed)
        model = svgp_model(x, y)
        _, x, y = _shard(n, x, y)
        try:
            out[name] = fit(model, None, (x, y), config, parallel=DataParallel(n)).column("epoch")
        except SavedFileError as err:  # every rank refuses: the check is on the global data
            out[name] = str(err)
    return out
