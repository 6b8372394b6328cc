"""Module-level rank bodies for the spawned 2-process tests (pickled by reference)."""

from __future__ import annotations

import os
import time

import torch

from gpscale.distributed import all_gather_rows, all_reduce_sum, current, shard_range
from gpscale.distributed import cagp as dcagp
from gpscale.distributed.reduce import check_replicated, reduce_gradients
from gpscale.distributed.train import DataParallel
from gpscale.methods import build
from gpscale.methods.baselines import svgp  # noqa: F401  (registers svgp)
from gpscale.training import FitConfig, fit

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


def failing_job(mode: str, wait: float) -> float:
    """Rank 1 dies (``'die'``) or stalls (``'hang'``); rank 0 runs a collective."""
    env = current()
    if env.rank == 1:
        if mode == "die":
            os._exit(3)
        time.sleep(wait)
    tic = time.monotonic()
    all_reduce_sum(torch.ones(3))
    return time.monotonic() - tic


def equivalence_job(cagp_args: tuple, svgp_args: tuple) -> dict:
    """Both jobs in one launch (one process start-up instead of two)."""
    return {"cagp": cagp_job(*cagp_args), "svgp": svgp_job(*svgp_args)}
