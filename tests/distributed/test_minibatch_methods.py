"""SoftKI and SOLVE-GP train through the DDP-style minibatch path (2 gloo ranks = 1 process).

Each rank takes its part of the global batch from its own shard; the ranks average their
gradients weighted by batch size (``DataParallel(kind='local')``), as DistributedDataParallel
does. So a step minimises Σ_r (b_r / b) L(batch_r), with L the method's per-datum batch loss:

- SOLVE-GP's ELBO (Eq. 8) is KL/N minus a mean over the batch, a sum over points, so this is
  exactly L(union of the batches), as for SVGP.
- SoftKI's batch loss treats the batch as the whole data set (notes/003 §2.6: a marginal
  likelihood or Hutchinson pseudoloss *of the batch*), which is not a sum over points; the
  data-parallel step is then the DDP average of the ranks' batch losses, not L(union). The
  one-process reference evaluates exactly that average on the same union batches.

Everything in float64, compared to 1e-8 relative.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gpscale.distributed import launch
from gpscale.training import FitConfig, fit

from . import _jobs

TOL = {"rtol": 1e-8, "atol": 1e-11}
ARGS = (201, 40, 2)  # n (shards 101 + 100), global batch (≤ 20 rows per rank), epochs


def _names() -> tuple[str, ...]:
    """SOLVE-GP only where its module exists (it may be absent from a checkout)."""
    present = importlib.util.find_spec("gpscale.methods.solvegp") is not None
    return ("softki", "solvegp") if present else ("softki",)


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """What the 2 ranks return from ``_jobs.minibatch_methods_job`` (one launch)."""
    return launch(_jobs.minibatch_methods_job, (_names(), ARGS), nproc=2, timeout=60)


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], **TOL, msg=key)


def _split_loss(union: _jobs.UnionBatches, **condition):
    """loss_fn of the union batch: Σ_r (b_r / b) L(rank r's part), the DDP objective."""

    def loss_fn(model, xb, yb):
        b, total = xb.shape[0], 0.0
        for x, y in zip(xb.split(union.sizes), yb.split(union.sizes), strict=True):
            total = total + x.shape[0] / b * model.loss(model.condition(x, y, **condition))
        return total

    return loss_fn


def _check_fit(ranks, name, model, x, y, x_test, loss_fn, union) -> None:
    n, batch, epochs = ARGS
    model.zero_grad(set_to_none=True)
    config = FitConfig(lr=0.02, epochs=epochs, batch_size=batch, progress=False, seed=3)
    history = fit(model, loss_fn, (x, y), config, parallel=union)
    assert len(history.column("loss")) == epochs
    with torch.no_grad():
        state = model.condition(x, y) if name == "softki" else None
        pred = model.predict(state, x_test)
    for r in ranks:
        assert r["spread"] == 0.0  # parameters bitwise identical across ranks
        assert r["history"] == pytest.approx(history.column("loss"), rel=1e-9)
        _close(r["params"], _jobs.params(model))
        torch.testing.assert_close(r["pred"][0], pred.mean, **TOL)
        torch.testing.assert_close(r["pred"][1], pred.variance, **TOL)


@pytest.mark.slow
def test_solvegp_two_ranks_equal_the_union_batch(ranks):
    """SOLVE-GP ELBO: DDP step = step on the union batch; fit and predictions equal (1e-8)."""
    pytest.importorskip("gpscale.methods.solvegp", reason="SOLVE-GP is not in this checkout")
    n, batch, _ = ARGS
    ranks = [r["solvegp"] for r in ranks]
    x, y, x_test = _jobs.data(n)
    model = _jobs.solvegp_model(x, y)
    union, first = ranks[0]["batch"], ranks[0]["rows"]
    assert union.shape[0] == first + ranks[1]["rows"] <= batch
    assert bool((union[:first] < 101).all() and (union[first:] >= 101).all())  # own shards
    loss = model.loss(model.condition(x[union], y[union]))
    loss.backward()
    for r in ranks:
        assert r["loss"] == pytest.approx(float(loss.detach()), rel=1e-10)
        _close(r["grads"], _jobs.grads(model))
    _check_fit(ranks, "solvegp", model, x, y, x_test, None, _jobs.UnionBatches(n))


def test_softki_two_ranks_equal_the_ddp_average_of_rank_batches(ranks):
    """SoftKI (mll): DDP step = Σ_r (b_r/b) ∇L(batch_r) in one process; fit equal (1e-8)."""
    n, _, _ = ARGS
    ranks = [r["softki"] for r in ranks]
    x, y, x_test = _jobs.data(n)
    model = _jobs.softki_model(x, y)
    union, first = ranks[0]["batch"], ranks[0]["rows"]
    parts = (union[:first], union[first:])
    b = union.shape[0]
    loss = sum(p.shape[0] / b * model.loss(model.condition(x[p], y[p])) for p in parts)
    loss.backward()
    for r in ranks:
        assert r["loss"] == pytest.approx(float(loss.detach()), rel=1e-10)
        _close(r["grads"], _jobs.grads(model))
    with torch.no_grad():  # not a sum over points (module docstring): L(union) is different
        union_loss = model.loss(model.condition(x[union], y[union]))
    assert abs(float(union_loss) - float(loss.detach())) > 1e-6
    split = _jobs.UnionBatches(n)
    _check_fit(ranks, "softki", model, x, y, x_test, _split_loss(split), split)


def test_softki_pseudoloss_step_with_fixed_probes(ranks):
    """SoftKI's Hutchinson pseudoloss (Eq. 19) with probes fixed per global row: DDP = 1 process."""
    n, _, _ = ARGS
    ranks = [r["softki"] for r in ranks]
    x, y, _ = _jobs.data(n)
    model = _jobs.softki_model(x, y, objective="pseudoloss")
    union, first = ranks[0]["batch"], ranks[0]["rows"]
    b = union.shape[0]
    loss = sum(p.shape[0] / b * model.loss(model.condition(x[p], y[p], _jobs.probes_for(p)))
               for p in (union[:first], union[first:]))
    loss.backward()
    for r in ranks:
        assert r["pseudo_loss"] == pytest.approx(float(loss.detach()), rel=1e-10)
        _close(r["pseudo_grads"], _jobs.grads(model))
