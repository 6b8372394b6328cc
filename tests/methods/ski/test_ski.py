"""``ski`` and ``ggp`` against dense float64 SKI (notes/002 §10), streaming statistics, learning."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gpscale.methods.ski  # noqa: F401  (registers ski and ggp)
from gpscale.data.synthetic import FieldStream
from gpscale.kernels import kernel_hyperparameters
from gpscale.linalg.interpolation import interpolate, make_grid
from gpscale.linalg.toeplitz import grid_kernel
from gpscale.methods.registry import build
from gpscale.methods.ski import GGP, sufficient_statistics
from gpscale.training import FitConfig, fit

F64 = torch.float64
PRIOR = dict(lengthscale=0.4, outputscale=1.3, noise=0.05, mean_constant=0.1)


def _data(n=300, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=F64)
    y = torch.sin(3 * x.sum(1)) + 0.1 * torch.randn(n, generator=g, dtype=F64)
    return x, y


def _dense_reference(model, x, y, x_test):
    """Dense SKI (Def. 1): loss per datum, predictive mean and latent variance."""
    W = interpolate(model.grid, x).to_dense()
    Ws = interpolate(model.grid, x_test).to_dense()
    hp = kernel_hyperparameters(model.kernel)
    K = grid_kernel(model.grid, hp.profile, hp.lengthscale, hp.outputscale).to_dense()
    n = x.shape[0]
    Kt = W @ K @ W.T + PRIOR["noise"] * torch.eye(n, dtype=F64)
    r = y - PRIOR["mean_constant"]
    loss = (0.5 * (r @ torch.linalg.solve(Kt, r) + torch.logdet(Kt)) / n
            + 0.5 * math.log(2 * math.pi))
    mean = PRIOR["mean_constant"] + Ws @ K @ W.T @ torch.linalg.solve(Kt, r)
    var = (Ws @ K @ Ws.T - Ws @ K @ W.T @ torch.linalg.solve(Kt, W @ K @ Ws.T)).diagonal()
    return loss.detach(), mean.detach(), var.detach()


@pytest.mark.parametrize("key,options", [
    ("ggp", {}), ("ggp", {"solver": "iterative"}), ("ggp", {"variance": "exact"}),
    ("ggp", {"variance": "exact", "solver": "iterative"}),
    ("ggp", {"wtw_format": "stencil"}),
    ("ggp", {"solver": "dense"}), ("ski", {}), ("ski", {"variance": "exact"}),
])
def test_predictive_equals_dense_ski(key, options):
    """Theorem 1 / §10.1, §10.13: mean and variance from the statistics equal dense SKI."""
    x, y = _data()
    model = build(key, 2, init=(x, y), grid_size=[10, 9], rtol=1e-11, **PRIOR, **options)
    x_test = torch.rand(9, 2, dtype=F64, generator=torch.Generator().manual_seed(4))
    _, mean, var = _dense_reference(model, x, y, x_test)
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x_test)
    torch.testing.assert_close(pred.mean, mean, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(pred.variance, var, rtol=1e-6, atol=1e-8)


def test_ggp_and_ski_give_the_same_loss_and_gradient():
    """Prop. 1: factorized CG runs SKI's iterations, so with the same probes both agree."""
    x, y = _data()
    values = []
    for key, options in (("ggp", {"solver": "iterative"}), ("ski", {})):
        model = build(key, 2, init=(x, y), grid_size=[10, 9], rtol=1e-11, num_probes=8, **PRIOR,
                      **options)
        loss = model.loss(model.condition(x, y))
        loss.backward()
        values.append(torch.cat([loss.detach().reshape(1)]
                                + [p.grad.reshape(-1) for p in model.parameters()]))
    torch.testing.assert_close(values[0], values[1], rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("solver", ["iterative", "preconditioned"])
def test_iterative_loss_and_gradient_match_dense_reference(solver):
    """Eq. 9 + SLQ: the quadratic term is exact; log det and gradients within Monte-Carlo error."""
    x, y = _data()
    kw = dict(grid_size=[10, 9], rtol=1e-10, **PRIOR)
    dense = build("ggp", 2, init=(x, y), solver="dense", **kw)
    it = build("ggp", 2, init=(x, y), num_probes=256, solver=solver, **kw)
    ref_loss, _, _ = _dense_reference(dense, x, y, x[:2])
    sd, si = dense.condition(x, y), it.condition(x, y)
    torch.testing.assert_close(dense.loss(sd), ref_loss, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(si.quad.detach(), sd.quad.detach(), rtol=1e-8, atol=0)
    # The SLQ log-determinant per datum: Monte-Carlo error ~ 1e-2 with 256 probes here.
    torch.testing.assert_close(it.loss(si), ref_loss, rtol=0, atol=0.03)
    grads = []
    for model, state in ((dense, sd), (it, si)):
        model.loss(state).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    # Hutchinson trace estimates (256 probes): loose agreement; the mean gradient is exact.
    torch.testing.assert_close(grads[1], grads[0], rtol=0.15, atol=0.01)


def test_condition_needs_only_the_statistics_and_training_computes_them_once(monkeypatch):
    """§10.13: GGP conditions on (WᵀW, Wᵀy, yᵀy, n) alone; training computes them once (in
    the loss function training_loss returns), condition() keeps nothing on the module."""
    x, y = _data()
    model = build("ggp", 2, init=(x, y), grid_size=[10, 9], rtol=1e-10, **PRIOR)
    stats = model.statistics((x, y))
    state = model.condition_stats(stats)  # no x or y involved
    ref = model.condition(x, y)
    torch.testing.assert_close(state.mean_weights, ref.mean_weights)
    passes = []
    real = model.statistics
    monkeypatch.setattr(model, "statistics", lambda data: passes.append(1) or real(data))
    fit(model, None, (x, y), FitConfig(lr=0.05, epochs=3, progress=False))
    assert len(passes) == 1
    loss = model.training_loss(x, y)
    torch.testing.assert_close(loss(model, x, y), model.loss(model.condition(x, y)))


def test_statistics_memo_reuses_a_pass_over_the_same_tensors_only(monkeypatch):
    """Training's pass serves conditioning afterwards (the same x, y objects); an in-place
    change of y, other tensors with equal values, or a copy of the model pass again."""
    import copy

    import gpscale.methods.ski.model as ski_module

    x, y = _data()
    model = build("ggp", 2, init=(x, y), grid_size=[10, 9], rtol=1e-10, **PRIOR)
    passes = []
    real = ski_module.sufficient_statistics
    monkeypatch.setattr(ski_module, "sufficient_statistics",
                        lambda *a, **k: passes.append(1) or real(*a, **k))
    fit(model, None, (x, y), FitConfig(lr=0.05, epochs=2, progress=False))
    state = model.posterior(x, y)
    assert len(passes) == 1
    x2, y2 = x.clone(), y.clone()
    torch.testing.assert_close(model.condition(x2, y2).mean_weights, state.mean_weights,
                               rtol=0, atol=0)  # recomputed: the same numbers
    assert len(passes) == 2
    model.condition(x2, y2)
    assert len(passes) == 2
    y2.add_(1.0)  # in place: the memo no longer applies
    shifted = model.condition(x2, y2)
    assert len(passes) == 3
    assert not torch.allclose(shifted.mean_weights, state.mean_weights)
    copy.deepcopy(model).condition(x2, y2)
    assert len(passes) == 4


@pytest.mark.parametrize("chunk_size", [1, 37, 500])
def test_statistics_do_not_depend_on_chunking_or_order(chunk_size):
    """§10.7: WᵀW, Wᵀy, yᵀy, n over any chunking or permutation equal the one-shot values."""
    x, y = _data(n=400, d=3)
    grid = make_grid([0.0] * 3, [1.0] * 3, [7, 7, 6])
    ref = sufficient_statistics((x, y), grid, num_probes=0, chunk_size=400)
    perm = torch.randperm(400, generator=torch.Generator().manual_seed(chunk_size))
    got = sufficient_statistics((x[perm], y[perm]), grid, num_probes=0, chunk_size=chunk_size)
    torch.testing.assert_close(got.gram.coef, ref.gram.coef, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(got.wt_y, ref.wt_y, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(got.yty, ref.yty, rtol=1e-12, atol=0)
    assert got.n == ref.n == 400


def test_statistics_from_memmap_and_stream(tmp_path):
    """Out-of-core input: a NumPy memmap and a FieldStream give the in-memory statistics."""
    stream = FieldStream(n=2500, chunk_size=700, num_dims=3)
    grid = make_grid([0.0] * 3, [1.0] * 3, [6, 6, 6])
    x = torch.cat([c[0] for c in stream])
    y = torch.cat([c[1] for c in stream])
    ref = sufficient_statistics((x, y), grid, num_probes=0)
    from_stream = sufficient_statistics(stream, grid, num_probes=0)
    mx = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float64,
                                   shape=(2500, 3))
    mx[:] = x.numpy()
    from_memmap = sufficient_statistics((mx, y.numpy()), grid, num_probes=0, chunk_size=300)
    for got in (from_stream, from_memmap):
        torch.testing.assert_close(got.gram.coef, ref.gram.coef, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got.wt_y, ref.wt_y, rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # ~3 s alone, ~30 s on a loaded 2-core machine
def test_learning_recovers_generating_hyperparameters():
    """Learned ℓ, s, σ² from the statistics are near those that generated a 1-D GP sample."""
    from gpscale.training import fit
    from gpscale.training.config import FitConfig

    g = torch.Generator().manual_seed(0)
    n, ell, scale, noise = 1500, 0.1, 1.0, 0.01
    x = torch.rand(n, 1, generator=g, dtype=F64)
    K = scale * torch.exp(-0.5 * (x - x.T) ** 2 / ell**2) + 1e-8 * torch.eye(n, dtype=F64)
    f = torch.linalg.cholesky(K) @ torch.randn(n, generator=g, dtype=F64)
    y = f + noise**0.5 * torch.randn(n, generator=g, dtype=F64)
    model = build("ggp", 1, init=(x, y), grid_size=100, lengthscale=0.3, outputscale=0.5,
                  noise=0.1, num_probes=8, rtol=1e-3)
    fit(model, None, (x, y), FitConfig(optimizer="adam", lr=0.05, epochs=100, batch_size=None,
                                       progress=False))
    hp = kernel_hyperparameters(model.kernel)
    assert float(hp.lengthscale) == pytest.approx(ell, rel=0.25)
    assert float(model.noise) == pytest.approx(noise, rel=0.3)
    assert float(hp.outputscale) == pytest.approx(scale, rel=0.6)  # one sample: weakly identified


def test_regressor_and_clear_errors():
    """GPRegressor(method='ggp') works; d > 3, test points off the grid and bad options raise."""
    from gpscale.estimators import GPRegressor

    x, y = _data(n=200, d=1)
    est = GPRegressor(method="ggp", epochs=3, grid_size=64).fit(x.numpy(), y.numpy())
    pred = est.predict(x.numpy()[:5])
    assert np.all(np.isfinite(pred)) and np.abs(pred - y.numpy()[:5]).max() < 0.5
    with pytest.raises(ValueError, match="outside the interpolation grid"):
        est.predict(np.array([[50.0]]))
    with pytest.raises(ValueError, match="exponential in the input dimension"):
        build("ggp", 4, init=(torch.rand(10, 4, dtype=F64), torch.rand(10, dtype=F64)))
    with pytest.raises(ValueError, match="option variance='full' is invalid"):
        build("ski", 1, init=(x, y), variance="full")
    with pytest.raises(ValueError, match="grid_bounds"):
        build("ggp", 1)
    model = build("ggp", 1, init=(x, y), grid_size=32, num_probes=0)
    with pytest.raises(ValueError, match="num_probes"):
        model.loss(model.condition(x, y))
    rebuilt = build("ggp", 1, **model.options)
    assert isinstance(rebuilt, GGP) and rebuilt.grid == model.grid


def test_auto_solver_preconditions_kronecker_kernels_and_falls_back_otherwise():
    """'auto' = the whitened preconditioned solve for a Kronecker K_G (RBF), factorized CG for a
    BTTB one (Matérn, d > 1); both give the dense quadratic term; bad pairings raise clearly."""
    x, y = _data()
    kw = dict(grid_size=[10, 9], rtol=1e-10, num_probes=4)
    rbf = build("ggp", 2, init=(x, y), **kw, **PRIOR)
    dense = build("ggp", 2, init=(x, y), solver="dense", grid_size=[10, 9], **PRIOR)
    it = build("ggp", 2, init=(x, y), solver="iterative", **kw, **PRIOR)
    s_auto, s_it = rbf.condition(x, y), it.condition(x, y)
    torch.testing.assert_close(s_auto.quad.detach(), dense.condition(x, y).quad.detach(),
                               rtol=1e-8, atol=0)
    assert s_auto.iterations < s_it.iterations  # preconditioned: fewer iterations
    matern = build("ggp", 2, init=(x, y), kernel="matern52", **kw)
    matern_it = build("ggp", 2, init=(x, y), kernel="matern52", solver="iterative", **kw)
    assert matern.condition(x, y).iterations == matern_it.condition(x, y).iterations
    explicit = build("ggp", 2, init=(x, y), kernel="matern52", solver="preconditioned", **kw)
    with pytest.raises(ValueError, match="needs a Kronecker K_G"):
        explicit.condition(x, y)
    with pytest.raises(ValueError, match="is a ggp option"):
        build("ski", 2, init=(x, y), solver="preconditioned")
