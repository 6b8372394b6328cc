"""Data-parallel GGP: per-rank sufficient statistics, summed, equal the single-process ones.

The 2-process test spawns 2 gloo ranks (``_jobs.ggp_job``) and compares the reduced
statistics (1e-12), the loss, gradients, predictions and a short fit (1e-8 relative, float64)
with one process.
"""

from __future__ import annotations

import json

import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.distributed import launch
from gpscale.distributed.shard import shard_range
from gpscale.methods.ski import sharded as dggp
from gpscale.training import FitConfig, fit

from . import _jobs

TOL = {"rtol": 1e-8, "atol": 1e-11}
STAT_TOL = {"rtol": 1e-12, "atol": 1e-12}
GGP = (301, 64, 3)  # n (shards 151 + 150: rank 1 starts inside probe chunk 2), chunk, epochs


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """What the 2 ranks return from ``_jobs.ggp_job`` (one launch for the module)."""
    return launch(_jobs.ggp_job, GGP, nproc=2, timeout=60)


def _halves(n: int):
    return [shard_range(n, r, 2) for r in range(2)]


def _add(a, b):
    """Two ranks' statistics summed by hand (what the all-reduce does)."""
    return {k: a[k] + b[k] for k in a}


@pytest.mark.parametrize("chunk", [1, 7, 64, 151, 1000])
def test_shard_statistics_add_up_to_the_single_process_statistics(chunk):
    """§4.5: WᵀW, Wᵀy, Wᵀ1, yᵀy, Σy, n and the probe sketches Wᵀz are sums over the shards."""
    x, y, _ = _jobs.data(301)
    model = _jobs.ggp_model(x, y)
    full = _jobs.stat_fields(model.statistics((x, y), chunk_size=chunk))
    parts = [_jobs.stat_fields(dggp.shard_statistics(
        model.grid, (x[a:b], y[a:b]), start=a, num_points=301, num_probes=4, seed=0,
        chunk_size=chunk)) for a, b in _halves(301)]
    assert [p["n"] for p in parts] == [151, 150]
    total = _add(*parts)
    assert total["n"] == full["n"] == 301
    for key in full:
        torch.testing.assert_close(total[key], full[key], **STAT_TOL, msg=key)


def test_probe_rows_follow_the_global_stream_whatever_the_local_chunking():
    """A shard read in odd chunks gets exactly its rows of the one-process probe stream."""
    x, y, _ = _jobs.data(200)
    model = _jobs.ggp_model(x, y)
    a, b = 37, 200
    chunks = [(x[s:t], y[s:t]) for s, t in ((37, 40), (40, 111), (111, 200))]
    local = dggp.shard_statistics(model.grid, chunks, start=a, num_points=200, num_probes=4,
                                  seed=0, chunk_size=50)
    head = dggp.shard_statistics(model.grid, (x[:a], y[:a]), start=0, num_points=200,
                                 num_probes=4, seed=0, chunk_size=50)
    full = model.statistics((x, y), chunk_size=50)
    torch.testing.assert_close(local.wt_probes + head.wt_probes, full.wt_probes, **STAT_TOL)
    assert local.n == b - a


def test_one_process_statistics_function_equals_ggp(monkeypatch):
    """Without a process group ``statistics`` is ``GGP.statistics`` (CSR included)."""
    x, y, _ = _jobs.data(90)
    model = _jobs.ggp_model(x, y)
    stats = dggp.statistics(model, (x, y), start=0, num_points=90)
    ref = model.statistics((x, y))
    for key, value in _jobs.stat_fields(ref).items():
        torch.testing.assert_close(_jobs.stat_fields(stats)[key], value, **STAT_TOL, msg=key)
    torch.testing.assert_close(stats.gram_csr.to_dense(), ref.gram_csr.to_dense(), **STAT_TOL)
    loss = dggp.ShardedGGPLoss(stats)(model, x, y)
    torch.testing.assert_close(loss, model.loss(model.condition(x, y)), rtol=1e-12, atol=0)


def test_bad_input_is_named():
    """Shards past n, an empty shard, a non-GGP model, shards not adding up: ValueError."""
    x, y, _ = _jobs.data(40)
    model = _jobs.ggp_model(x, y)
    with pytest.raises(ValueError, match="past the 40"):
        dggp.shard_statistics(model.grid, (x, y), start=10, num_points=40)
    with pytest.raises(ValueError, match="start"):
        dggp.shard_statistics(model.grid, (x, y), start=40, num_points=40)
    with pytest.raises(ValueError, match="no data"):
        dggp.shard_statistics(model.grid, [], start=0, num_points=40)
    with pytest.raises(ValueError, match="not num_points = 50"):
        dggp.statistics(model, (x, y), start=0, num_points=50)
    with pytest.raises(ValueError, match="ggp model"):
        dggp.statistics(_jobs.svgp_model(x, y), (x, y), start=0, num_points=40)


@pytest.mark.slow
def test_two_ranks_give_the_single_process_statistics(ranks):
    """The all-reduced statistics on both ranks = one pass over all rows (1e-12)."""
    n, chunk, _ = GGP
    x, y, _ = _jobs.data(n)
    ref = _jobs.stat_fields(_jobs.ggp_model(x, y).statistics((x, y), chunk_size=chunk))
    for r in ranks:
        assert r["stats"]["n"] == n
        for key, value in ref.items():
            torch.testing.assert_close(r["stats"][key], value, **STAT_TOL, msg=key)


def test_two_ranks_give_the_single_process_loss_gradients_predictions_and_fit(ranks):
    """Loss, gradients, predictive and a 3-epoch Adam run equal one process (1e-8)."""
    n, _, epochs = GGP
    x, y, x_test = _jobs.data(n)
    model = _jobs.ggp_model(x, y)
    state = model.condition(x, y)
    loss = model.loss(state)
    loss.backward()
    ref_grads = _jobs.grads(model)
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x_test)
    for r in ranks:
        assert r["loss"] == pytest.approx(float(loss.detach()), rel=1e-10)
        assert r["grads"].keys() == ref_grads.keys()
        for key, grad in ref_grads.items():
            torch.testing.assert_close(r["grads"][key], grad, **TOL, msg=key)
        for got, ref in zip(r["pred"], (pred.mean, pred.variance), strict=True):
            # relative to the largest entry: the mean comes from a CG solve to rtol 1e-10, so
            # entries near 0 differ by ~1e-10 absolute (measured 9e-11), not 1e-8 relative
            torch.testing.assert_close(got, ref, rtol=1e-8, atol=1e-8 * float(ref.abs().max()))
    model.zero_grad(set_to_none=True)
    history = fit(model, None, (x, y), FitConfig(lr=0.05, epochs=epochs, progress=False))
    for r in ranks:
        assert r["spread"] == 0.0  # parameters bitwise identical across ranks
        assert r["history"] == pytest.approx(history.column("loss"), rel=1e-9)
        for key, value in _jobs.params(model).items():
            torch.testing.assert_close(r["params"][key], value, **TOL, msg=key)


def test_reduce_is_the_identity_without_a_group():
    """One process: ``reduce_statistics`` returns its argument."""
    x, y, _ = _jobs.data(30)
    stats = _jobs.ggp_model(x, y).statistics((x, y))
    assert dggp.reduce_statistics(stats) is stats


@pytest.mark.slow
def test_cli_fit_ggp_nproc_2_writes_what_one_process_writes(tmp_path):
    common = ["fit", "--dataset", "sine", "--data-option", "n=160", "--method", "ggp",
              "-o", "grid_size=64", "-o", "num_probes=4", "-o", "rtol=1e-10", "--epochs", "2",
              "--dtype", "float64", "--no-progress"]
    assert main([*common, "--nproc", "2", "--out", str(tmp_path / "p2")]) == 0
    torch.set_default_dtype(torch.float32)  # as in the spawned ranks (conftest restores it)
    assert main([*common, "--out", str(tmp_path / "p1")]) == 0
    p1, p2 = (json.loads((tmp_path / p / "metrics.json").read_text()) for p in ("p1", "p2"))
    assert p2["nproc"] == 2 and p2["n_train"] == p1["n_train"] == 160
    for key in ("test_rmse", "test_nll", "noise"):
        assert p2[key] == pytest.approx(p1[key], rel=1e-8), key
    assert (tmp_path / "p2" / "model.pt").exists()

