"""Without a process group everything is a no-op, and the data-parallel loss is CaGP's."""

from __future__ import annotations

import pytest
import torch

from gpscale.distributed import (
    all_gather_rows,
    all_reduce_sum,
    all_reduce_sums,
    current,
    init_from_env,
)
from gpscale.distributed.reduce import gather_predictive, reduce_gradients, weighted_mean
from gpscale.distributions import Predictive
from gpscale.methods import build
from gpscale.methods.cagp import sharded as dcagp
from gpscale.training import FitConfig, fit
from gpscale.training.parallel import DataParallel

from . import _jobs


@pytest.fixture
def no_torchrun(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_single_process_fallback_is_the_identity(no_torchrun):
    env = init_from_env()
    assert not env.active and env.is_main and current() == env
    t = torch.randn(4, 3, requires_grad=True)
    assert all_reduce_sum(t) is t and all_gather_rows(t) is t
    row = t[0]
    assert all(a is b for a, b in zip(all_reduce_sums(t, row), (t, row), strict=True))
    assert weighted_mean(2.5, 3.0) == (2.5, 3.0)
    (t.square().sum()).backward()
    g = t.grad.clone()
    reduce_gradients([t], 5.0)
    assert torch.equal(t.grad, g)
    pred = Predictive(torch.zeros(3), torch.ones(3), noise=torch.tensor(0.1))
    assert gather_predictive(pred) is pred


@pytest.mark.parametrize("env,match", [
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "1"}, "MASTER_ADDR"),
    ({"WORLD_SIZE": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "RANK"),
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "RANK must"),
    ({"WORLD_SIZE": "two"}, "integer"),
])
def test_bad_torchrun_environment_is_named(no_torchrun, monkeypatch, env, match):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=match):
        init_from_env()


def test_bad_arguments_are_refused(no_torchrun):
    with pytest.raises(ValueError, match="backend"):
        init_from_env(backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        init_from_env(timeout=0)
    with pytest.raises(ValueError, match="loss kind"):
        DataParallel(10, kind="both")


def test_sharded_cagp_loss_on_one_rank_equals_cagp(no_torchrun):
    x, y, x_test = _jobs.data(90)
    model = _jobs.cagp_model(x, y, num_actions=9)
    loss = model.loss(model.condition(x, y))
    loss.backward()
    ref = _jobs.grads(model)
    model.zero_grad(set_to_none=True)
    state = dcagp.condition(model, x, x, y, 0)
    value = dcagp.loss(model, state)
    value.backward()
    torch.testing.assert_close(value, loss, rtol=1e-10, atol=0)
    for key, grad in _jobs.grads(model).items():
        torch.testing.assert_close(grad, ref[key], rtol=1e-8, atol=1e-12, msg=key)
    pred, ref_pred = dcagp.predict(model, state, x_test), model.predict(model.condition(x, y),
                                                                         x_test)
    torch.testing.assert_close(pred.mean, ref_pred.mean, rtol=1e-10, atol=1e-12)


def test_sharded_cagp_projected_nll_and_bad_models(no_torchrun):
    x, y, _ = _jobs.data(60)
    model = _jobs.cagp_model(x, y, num_actions=6)
    model.objective = "projected_nll"
    state = dcagp.condition(model, x, x, y, 0)
    torch.testing.assert_close(dcagp.loss(model, state),
                               model.loss(model.condition(x, y)), rtol=1e-10, atol=0)
    with pytest.raises(ValueError, match="outside"):
        dcagp.condition(model, x, x[:30], y[:30], 40)
    with pytest.raises(ValueError, match="learned for 60"):
        dcagp.condition(model, x[:50], x[:50], y[:50], 0)
    cg = build("cagp-cg", 2, init=(x, y), num_actions=4)
    with pytest.raises(ValueError, match="cagp-opt"):
        dcagp.condition(cg, x, x, y, 0)


def test_fit_with_a_one_rank_hook_equals_plain_fit(no_torchrun):
    x, y, _ = _jobs.data(80)
    config = FitConfig(lr=0.05, epochs=3, progress=False)
    plain = _jobs.cagp_model(x, y, num_actions=8)
    hooked = _jobs.cagp_model(x, y, num_actions=8)
    h1 = fit(plain, None, (x, y), config)
    h2 = fit(hooked, dcagp.ShardedCaGPLoss(x, 0), (x, y), config,
             parallel=DataParallel(80, kind="global"))
    assert h2.column("loss") == pytest.approx(h1.column("loss"), rel=1e-10)
    for key, value in _jobs.params(hooked).items():
        torch.testing.assert_close(value, _jobs.params(plain)[key], rtol=1e-8, atol=1e-12)


def test_sharded_cagp_falls_back_to_float64_like_cagp(no_torchrun, monkeypatch):
    """A float32 SᵀK̂S that needs jitter beyond a tenth of the noise term (KEGGu's trap, see
    test_cagp_training) is not factored with that jitter on the data-parallel path either: the
    products are recomputed in float64 (every rank alike: G_K is reduced first) and the loss
    equals the float64 model's."""
    from gpscale.methods.cagp import sharded as cagp_sharded

    x, y, _ = _jobs.data(120)
    prior = {"lengthscale": 3.0, "outputscale": 1e4, "noise": 1e-4}
    model = build("cagp-opt", 2, init=(x.float(), y.float()), num_actions=12, **prior)
    reference = build("cagp-opt", 2, init=(x, y), num_actions=12, **prior)
    reference.load_state_dict(model.state_dict())
    real = cagp_sharded._kernel_rows_times_actions
    with torch.no_grad():
        state = dcagp.condition(model, x.float(), x.float(), y.float(), 0)
        root = state.gram_actions.diagonal().rsqrt()  # SᵀS is diagonal: scale it out
        gram = state.gram_K + 1e-4 * state.gram_actions
        shift = float(torch.linalg.eigvalsh(root[:, None] * gram * root).min())

    def lossy(model, x_all, S, start, stop):  # SᵀK̂S's least eigenvalue ≈ −1e-3 (σ² = 1e-4)
        Z = real(model, x_all, S, start, stop)
        if x_all.dtype == torch.float32:
            return Z - (shift + 1e-3) * S.to_dense()[start:stop]
        return Z

    monkeypatch.setattr(cagp_sharded, "_kernel_rows_times_actions", lossy)
    with pytest.warns(RuntimeWarning, match="within a tenth of the noise"):
        state = dcagp.condition(model, x.float(), x.float(), y.float(), 0)
    assert state.K_S.dtype == torch.float64
    with torch.no_grad():
        expected = reference.loss(reference.condition(x, y))
        torch.testing.assert_close(dcagp.loss(model, state).double(), expected,
                                   rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(cagp_sharded, "_kernel_rows_times_actions", real)
    state = dcagp.condition(model, x.float(), x.float(), y.float(), 0)  # no fallback needed
    assert state.K_S.dtype == torch.float32
