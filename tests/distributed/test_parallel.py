"""Two gloo processes on this machine reproduce one process (issue #8's tests).

Each test spawns 2 ranks (``gpscale.distributed.launch``) running a body from ``_jobs.py`` and
compares what they return with the single-process computation in float64 to 1e-8 relative.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.distributed import DistributedError, launch
from gpscale.training import FitConfig, fit
from gpscale.training.harness import load_warm

from . import _jobs

TOL = {"rtol": 1e-8, "atol": 1e-11}
CAGP = (150, 3)  # n, epochs
SVGP = (201, 40, 2)  # n (uneven shards: 101 + 100), global batch (≤ 20 rows per rank), epochs


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """What the 2 ranks return from ``_jobs.equivalence_job`` (one launch for the module)."""
    return launch(_jobs.equivalence_job, (CAGP, SVGP), nproc=2, timeout=60)


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], **TOL, msg=key)


@pytest.mark.slow
def test_cagp_opt_two_ranks_equal_one_process(ranks):
    (n, epochs), ranks = CAGP, [r["cagp"] for r in ranks]
    x, y, x_test = _jobs.data(n)
    model = _jobs.cagp_model(x, y)
    state = model.condition(x, y)
    loss = model.loss(state)
    loss.backward()
    ref_grads = _jobs.grads(model)
    with torch.no_grad():
        pred = model.predict(state, x_test)
    assert [r["rows"] for r in ranks] == [75, 75]  # each rank holds only its K(X_r, X) S
    for r in ranks:
        assert r["loss"] == pytest.approx(float(loss.detach()), rel=1e-10)
        kl, ell = model.kl(state).detach(), model.expected_log_lik(state).detach()
        assert r["terms"] == pytest.approx((float(kl), float(ell)), rel=1e-10)
        _close(r["grads"], ref_grads)
        torch.testing.assert_close(r["pred"][0], pred.mean, **TOL)
        torch.testing.assert_close(r["pred"][1], pred.variance, **TOL)
    model.zero_grad(set_to_none=True)
    history = fit(model, None, (x, y), FitConfig(lr=0.05, epochs=epochs, progress=False))
    for r in ranks:
        assert r["spread"] == 0.0  # parameters bitwise identical across ranks
        assert r["history"] == pytest.approx(history.column("loss"), rel=1e-9)
        _close(r["params"], _jobs.params(model))


@pytest.mark.slow
def test_grown_cagp_opt_actions_reach_both_ranks():
    """``auto``'s CaGP-Opt winner under --nproc 2: the actions rank 0 grew from the race's rows
    to every row reach both ranks with their block order, and the sharded model started from
    them has the one-process loss and prediction, which is the race model's prediction (the
    added rows' entries are zero)."""
    n, kept = 150, 118
    ranks = launch(_jobs.grown_cagp_job, (n, kept), nproc=2, timeout=60)
    x, y, x_test = _jobs.data(n)
    warm = ranks[0]["warm"]
    model = _jobs.cagp_model(x, y)
    assert "policy.index" in load_warm(model, warm)
    race = _jobs.cagp_model(x[:kept], y[:kept])
    with torch.no_grad():
        state = model.condition(x, y)
        loss, pred = float(model.loss(state)), model.predict(state, x_test)
        before = race.predict(race.condition(x[:kept], y[:kept]), x_test)
    torch.testing.assert_close(pred.mean, before.mean, **TOL)
    for r in ranks:
        assert torch.equal(r["index"], warm["policy.index"])
        assert r["loss"] == pytest.approx(loss, rel=1e-10)
        torch.testing.assert_close(r["pred"][0], pred.mean, **TOL)
        torch.testing.assert_close(r["pred"][1], pred.variance, **TOL)


def test_svgp_minibatch_two_ranks_equal_global_batch(ranks):
    (n, batch, epochs), ranks = SVGP, [r["svgp"] for r in ranks]
    x, y, x_test = _jobs.data(n)
    model = _jobs.svgp_model(x, y)
    union, first = ranks[0]["batch"], ranks[0]["rows"]
    assert union.shape[0] == first + ranks[1]["rows"] <= batch  # at most 20 rows per rank
    assert union.unique().numel() == union.shape[0]
    assert bool((union[:first] < 101).all() and (union[first:] >= 101).all())  # own shards
    loss = model.loss(model.condition(x[union], y[union]))
    loss.backward()
    for r in ranks:
        assert r["loss"] == pytest.approx(float(loss.detach()), rel=1e-10)
        _close(r["grads"], _jobs.grads(model))
    model.zero_grad(set_to_none=True)
    config = FitConfig(lr=0.05, epochs=epochs, batch_size=batch, progress=False, seed=3)
    history = fit(model, None, (x, y), config, parallel=_jobs.UnionBatches(n))
    assert len(history.column("loss")) == epochs
    with torch.no_grad():
        pred = model.predict(None, x_test)
    for r in ranks:
        assert r["spread"] == 0.0
        assert r["history"] == pytest.approx(history.column("loss"), rel=1e-9)
        _close(r["params"], _jobs.params(model))
        torch.testing.assert_close(r["pred"][0], pred.mean, **TOL)
        torch.testing.assert_close(r["pred"][1], pred.variance, **TOL)


def test_dead_rank_stops_the_other_with_a_clear_error():
    with pytest.raises(DistributedError) as info:
        launch(_jobs.failing_job, ("die", 0.0), nproc=2, timeout=5, grace=5)
    text = str(info.value)
    assert "rank 1/2 died with exit code 3" in text
    # rank 0 stopped by itself (it reported), naming the failed collective and the timeout
    assert "rank 0/2 raised DistributedError: rank 0/2: all_reduce (forward) failed" in text
    assert "5 s timeout" in text


@pytest.mark.slow
def test_bad_input_on_a_rank_is_one_value_error():
    """A rank that rejects its input reports that error alone (a ValueError, no traceback);
    a result that is not plain data fails its rank with the type named."""
    with pytest.raises(ValueError, match=r"^option num_actions must be at least 1; got 0$"):
        launch(_jobs.bad_input_job, (0,), nproc=2, timeout=5, grace=5)
    with pytest.raises(DistributedError, match="cannot store a builtins.Exception"):
        launch(_jobs.object_job, (), nproc=2, timeout=5, grace=5)


@pytest.mark.slow
def test_stopped_rank_is_noticed_by_its_heartbeat():
    """A SIGSTOPped rank (which ignores SIGTERM) is killed once its heartbeat is older than
    the timeout: the job ends after about the timeout, not after timeout + grace."""
    tic = time.monotonic()
    with pytest.raises(DistributedError) as info:
        launch(_jobs.failing_job, ("stop", 0.0), nproc=2, timeout=3, grace=60)
    elapsed = time.monotonic() - tic
    text = str(info.value)
    assert "rank 1/2 stopped making progress (no heartbeat for" in text
    assert "killed by the launcher" in text
    assert elapsed < 30  # the grace path (3 + 60 s) was not needed


@pytest.mark.slow
def test_stalled_rank_times_out():
    with pytest.raises(DistributedError) as info:
        launch(_jobs.failing_job, ("hang", 120.0), nproc=2, timeout=2, grace=2)
    text = str(info.value)
    assert "rank 0/2 raised DistributedError" in text and "2 s timeout" in text
    assert "rank 1/2 died with exit code -9" in text  # killed by the launcher


@pytest.mark.slow
def test_cli_fit_nproc_2_writes_what_one_process_writes(tmp_path):
    common = ["fit", "--dataset", "sine", "--data-option", "n=160", "--method", "cagp-opt",
              "-o", "num_actions=8", "--epochs", "2", "--dtype", "float64", "--no-progress"]
    assert main([*common, "--nproc", "2", "--out", str(tmp_path / "p2")]) == 0
    torch.set_default_dtype(torch.float32)  # as in the spawned ranks (conftest restores it)
    assert main([*common, "--out", str(tmp_path / "p1")]) == 0
    p1, p2 = (json.loads((tmp_path / p / "metrics.json").read_text()) for p in ("p1", "p2"))
    assert p2["nproc"] == 2 and p2["n_train"] == p1["n_train"] == 160
    for key in ("test_rmse", "test_nll", "noise"):
        assert p2[key] == pytest.approx(p1[key], rel=1e-8), key
    assert (tmp_path / "p2" / "model.pt").exists() and (tmp_path / "p2" / "history.csv").exists()
