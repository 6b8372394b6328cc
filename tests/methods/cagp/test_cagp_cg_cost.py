"""CaGP-CG's cost measures (gpscale.methods.cagp.cg): the cached kernel matrix for CG, and CG
actions recycled across training steps — each against the plain computation it replaces."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from gpscale.kernels import dense_kernel_matrix, kernel_matmul, kernel_matrix, make_kernel
from gpscale.linalg.policies.residual import ResidualPolicy
from gpscale.methods import _common, cagp
from gpscale.methods.cagp.cg import KernelOperator, recycling_loss
from gpscale.training import FitConfig, fit
from gpscale.training.fit import default_loss

from ._dense import HYPER, Dense, toy_data


@pytest.mark.parametrize("path", ["native", "fused"])
@pytest.mark.parametrize("name", ["rbf", "matern12", "matern32", "matern52"])
def test_dense_kernel_matrix_equals_gpytorch(name, path, monkeypatch):
    """Both CPU paths: the C rows (where native kernels build) and the fused blocks."""
    from gpscale.linalg import native

    if path == "fused":
        monkeypatch.setattr(native, "DENSE_MAX_DIMS", 0)
    elif not native.available():
        pytest.skip("no C compiler for the native kernels")
    g = torch.Generator().manual_seed(0)
    x = 50.0 + 3 * torch.randn(300, 4, generator=g, dtype=torch.float64)  # offset: cancellation
    kernel = make_kernel(name, 4).double()
    kernel.base_kernel.lengthscale = 0.5 + torch.rand(1, 4, generator=g, dtype=torch.float64)
    kernel.outputscale = 1.7
    # Matérn-1/2 has an infinite slope at distance 0: the rounding of D² ≈ 0 (1e-16 relative
    # to |x|²) shows as ~1e-7 on the diagonal; the others are smooth there.
    atol = 1e-6 if name == "matern12" else 1e-12
    torch.testing.assert_close(dense_kernel_matrix(kernel, x, rows=64),
                               kernel_matrix(kernel, x, x), rtol=0, atol=atol)


def test_dense_kernel_matrix_other_kernels_go_through_gpytorch():
    x = torch.randn(70, 2, dtype=torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel()).double()
    torch.testing.assert_close(dense_kernel_matrix(kernel, x, rows=16),
                               kernel_matrix(kernel, x, x))


def test_dense_kernel_matrix_keeps_no_graph():
    kernel = make_kernel("rbf", 2).double()
    assert not dense_kernel_matrix(kernel, torch.randn(20, 2, dtype=torch.float64)).requires_grad


def _model(x, y, **kw):
    return cagp.build_cagp_cg(x.shape[1], init=(x, y), num_actions=kw.pop("num_actions", 12),
                              **{**HYPER, **kw})


def test_kernel_operator_dense_equals_matrix_free_and_keeps_gradients_matrix_free():
    x, y = toy_data()
    model = _model(x, y)
    V = torch.randn(x.shape[0], 3, dtype=torch.float64)
    ref = Dense(model, x, y).Kh @ V
    op = KernelOperator(model.kernel, x, model.noise)
    with torch.no_grad():
        torch.testing.assert_close(op(V), ref)
    assert op.dense is not None  # cached for the gradient-free (CG) products
    op = KernelOperator(model.kernel, x, model.noise)
    out = op(V)  # gradients wanted: matrix-free, differentiable
    assert op.dense is None and out.requires_grad
    torch.testing.assert_close(out, ref)
    small = KernelOperator(model.kernel, x, model.noise, max_bytes=0)
    with torch.no_grad():
        torch.testing.assert_close(small(V), ref)
    assert small.dense is None


def test_cg_actions_same_with_cached_kernel():
    """The policy's actions from the cached matrix equal those of matrix-free products."""
    x, y = toy_data()
    model = _model(x, y)
    r = (y - model.mean(x)).detach()
    with torch.no_grad():
        cached = model.policy(KernelOperator(model.kernel, x, model.noise), r)
        free = model.policy(lambda V: kernel_matmul(model.kernel, x, x, V) + model.noise * V, r)
    torch.testing.assert_close(cached, free)


def test_refresh_every_validated():
    with pytest.raises(ValueError, match="refresh_every"):
        ResidualPolicy(4, refresh_every=0)
    x, y = toy_data()
    with pytest.raises(ValueError, match="refresh_every"):
        _model(x, y, refresh_every=0)
    with pytest.raises(ValueError, match="refresh_every"):
        recycling_loss(_model(x, y), x, y, 0)


def test_recycling_recomputes_actions_every_k_calls():
    x, y = toy_data()
    model = _model(x, y, refresh_every=3)
    calls = []
    original = model.actions_for

    def counting(xa, ya):
        calls.append(len(calls))
        return original(xa, ya)

    model.actions_for = counting
    loss = model.training_loss(x, y)
    for _ in range(7):
        loss(model, x, y)
    assert len(calls) == 3  # calls 1, 4 and 7


def test_recycled_loss_is_the_elbo_at_the_held_actions():
    """Between refreshes the loss is Eq. (11) with the earlier step's actions — still a bound:
    its gap to the exact −log p(y)/n is the KL of Eq. (10), ≥ 0."""
    x, y = toy_data()
    model = _model(x, y, refresh_every=5)
    loss = model.training_loss(x, y)
    with torch.no_grad():
        held = model.actions_for(x, y)
        first = loss(model, x, y)
        torch.testing.assert_close(first, model.loss(model.condition(x, y)))
        model.likelihood.noise = 0.02  # new hyperparameters; the actions are not recomputed
        model.kernel.base_kernel.lengthscale = 0.7
        second = loss(model, x, y)
        torch.testing.assert_close(second, model.loss(model.condition(x, y, actions=held)))
        fresh = model.loss(model.condition(x, y))
        assert float(second) >= float(Dense(model, x, y).nll()) - 1e-12  # a bound still
        assert float(second) >= float(fresh) - 1e-9  # looser than fresh CG actions here
        # A minibatch (other tensors) conditions from scratch.
        xb, yb = x[:20], y[:20]
        torch.testing.assert_close(loss(model, xb, yb), model.loss(model.condition(xb, yb)))


def test_refresh_every_one_trains_as_the_plain_loss():
    x, y = toy_data()
    config = FitConfig(epochs=4, lr=0.05, progress=False)
    a, b = _model(x, y, refresh_every=1), _model(x, y, refresh_every=1)
    ha = fit(a, None, (x, y), config)
    hb = fit(b, default_loss, (x, y), config)
    assert [r["loss"] for r in ha.rows] == pytest.approx([r["loss"] for r in hb.rows], rel=1e-12)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-12, atol=0)


def test_posterior_after_recycled_training_uses_fresh_actions():
    x, y = toy_data()
    model = _model(x, y, refresh_every=10)
    fit(model, None, (x, y), FitConfig(epochs=3, lr=0.1, progress=False))
    state = model.posterior(x, y)
    with torch.no_grad():
        torch.testing.assert_close(state.actions, model.actions_for(x, y))


@pytest.mark.parametrize("spare", [0, -1])
def test_cache_holds_one_n_by_n_matrix_exactly_within_its_limit(spare, largest_tensor,
                                                                 monkeypatch):
    """n² entries of float64 = the limit: one n × n matrix for CG; one byte less: none."""
    n = 120
    x, y = toy_data(n)
    model = _model(x, y, num_actions=10, chunk_size=16, backend="fused")
    monkeypatch.setattr(_common, "DENSE_OPERATOR_BYTES", n * n * 8 + spare)
    with largest_tensor() as mode:
        model.loss(model.condition(x, y)).backward()
    assert (mode.largest == n * n) == (spare == 0)
    assert mode.largest <= n * n


def test_learned_actions_train_with_the_plain_loss():
    """CaGP-Opt's actions are parameters: no recycling, fit's default loss (None here)."""
    x, y = toy_data()
    model = cagp.build_cagp_opt(x.shape[1], init=(x, y), num_actions=6, **HYPER)
    assert model.training_loss(x, y) is None
    config = FitConfig(epochs=2, lr=0.05, progress=False)
    other = cagp.build_cagp_opt(x.shape[1], init=(x, y), num_actions=6, **HYPER)
    ha, hb = fit(model, None, (x, y), config), fit(other, default_loss, (x, y), config)
    assert [r["loss"] for r in ha.rows] == [r["loss"] for r in hb.rows]
