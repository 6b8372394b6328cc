"""SOLVE-GP (notes/004 §6): minibatches, gradients, likelihoods, training, estimators and the method
contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.func import functional_call

import gpscale.methods.solvegp  # noqa: F401  (registers the key)
from gpscale.estimators import GPClassifier, GPRegressor
from gpscale.io import load, save
from gpscale.kernels import kernel_matrix, make_kernel
from gpscale.methods import build, get_spec
from gpscale.methods.solvegp import (
    build_solvegp,
    gauss_hermite,
)
from gpscale.methods.solvegp.parts import (
    cholesky_and_inverse,
    gram,
    kernel_matrix_fused,
    mean_and_quadratic,
)
from gpscale.training import FitConfig, default_fit_config, fit

from ._dense import (
    HYPER,
    JITTER,
    D,
    N,
    randomise_q,
    small_model,
    toy_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems


# -- minibatches and gradients -------------------------------------------------------------------
@pytest.mark.parametrize("task", ["regression", "binary"])
def test_minibatch_losses_are_unbiased(task):
    """Prop. 12: the minibatch losses of a partition average to the full loss (so a uniformly
    drawn batch of the partition is an unbiased estimate)."""
    x, y = toy_data()
    kw = {}
    if task == "binary":
        y, kw = (y > 0).double(), {"task": "classification"}
        kw.update({k: v for k, v in HYPER.items() if k != "noise"})
        model = randomise_q(build_solvegp(D, init=(x, y), num_inducing=6, num_orthogonal=5,
                                           jitter=JITTER, **kw))
    else:
        model = randomise_q(small_model(x, y))
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model.loss(model.condition(x, y))
        parts = [model.loss(model.condition(x[i], y[i])) for i in perm.split(12)]
    torch.testing.assert_close(torch.stack(parts).mean(), full, rtol=1e-10, atol=1e-12)


def test_gradients_reach_every_parameter():
    """Prop. 12: gradients flow to Z, O, the hyperparameters and all variational parameters."""
    x, y = toy_data()
    model = randomise_q(small_model(x, y))
    model.loss(model.condition(x[:16], y[:16])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name


class _Loss(torch.nn.Module):
    """forward(x, y) = model.loss(model.condition(x, y)), so functional_call can swap parameters."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return self.model.loss(self.model.condition(x, y))


def test_loss_gradcheck():
    """Autograd gradients of the loss w.r.t. Z, O, q(u) and q(v⊥) match finite differences."""
    x, y = toy_data(n=10)
    wrapper = _Loss(randomise_q(small_model(x, y, M=3, M2=3, jitter=1e-6)))
    names = ("inducing_points", "orthogonal_points", "q_mean_u", "q_chol_u", "q_mean_v",
             "q_chol_v")
    params = dict(wrapper.model.named_parameters())

    def loss(*values):
        swapped = {f"model.{n}": v for n, v in zip(names, values, strict=True)}
        return functional_call(wrapper, swapped, (x, y), strict=False)

    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-6)


def test_hyperparameter_gradcheck():
    """Gradients w.r.t. the kernel hyperparameters, prior mean and noise (through the fused
    kernel and the Cholesky/inverse backward) match finite differences."""
    x, y = toy_data(n=10)
    wrapper = _Loss(randomise_q(small_model(x, y, M=3, M2=3, jitter=1e-6)))
    covered = {"inducing_points", "orthogonal_points", "q_mean_u", "q_chol_u", "q_mean_v",
               "q_chol_v"}
    params = {n: p for n, p in wrapper.model.named_parameters() if n not in covered}
    assert any("lengthscale" in n for n in params) and any("outputscale" in n for n in params)
    names = tuple(params)

    def loss(*values):
        swapped = {f"model.{n}": v for n, v in zip(names, values, strict=True)}
        return functional_call(wrapper, swapped, (x, y), strict=False)

    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", ["rbf", "matern32", "matern52", "matern12"])
@pytest.mark.parametrize("latents", [1, 3])
def test_fused_kernel_matrix_matches_gpytorch(kernel, latents):
    """kernel_matrix_fused = GPyTorch's K(x1, x2), values and gradients w.r.t. both inputs,
    the ARD lengthscales and the outputscale (the profiles of linalg/fused.py)."""
    g = torch.Generator().manual_seed(3)
    batch = torch.Size([latents]) if latents > 1 else torch.Size()
    k = make_kernel(kernel, 3, ard=True, batch_shape=batch).double()
    with torch.no_grad():
        k.base_kernel.lengthscale = torch.rand(*batch, 1, 3, generator=g, dtype=torch.float64) + .5
        k.outputscale = torch.rand(batch, generator=g, dtype=torch.float64) + 0.5
    x1 = torch.randn(latents, 7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(latents, 9, 3, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(latents, 7, 9, generator=g, dtype=torch.float64)
    leaves = [x1, x2, k.raw_outputscale, k.base_kernel.raw_lengthscale]
    results = []
    for fn in (lambda kernel, a, b: kernel(a, b).to_dense(), kernel_matrix_fused):
        K = fn(k, x1, x2)
        results.append((K, torch.autograd.grad((K * weights).sum(), leaves)))
    (K_ref, grads_ref), (K_fused, grads_fused) = results
    torch.testing.assert_close(K_fused, K_ref, rtol=1e-12, atol=1e-12)
    for ours, theirs in zip(grads_fused, grads_ref, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-11)
    with torch.no_grad():  # at coincident points: k(x, x) = outputscale, finite gradients
        K_self = kernel_matrix_fused(k, x1, x1)
    torch.testing.assert_close(K_self.diagonal(dim1=-2, dim2=-1),
                               k.outputscale.reshape(-1, 1).expand(latents, 7))


def test_fused_kernel_matrix_keeps_float32_accuracy_at_tiny_lengthscales():
    """A lengthscale of 1e-3 on one standardised input: its scaled coordinates (~10³) enter D²
    exactly, so float32 values stay within 1e-4 of the float64 kernel (the norm expansion alone
    errs by ~0.1 in D² there)."""
    g = torch.Generator().manual_seed(5)
    k = make_kernel("matern32", 2, ard=True).double()
    with torch.no_grad():
        k.base_kernel.lengthscale = torch.tensor([[1e-3, 1.0]], dtype=torch.float64)
    x = torch.randn(1, 40, 2, generator=g, dtype=torch.float64)
    x[:, 20:] = x[:, :20] + 1e-3 * torch.randn(1, 20, 2, generator=g, dtype=torch.float64)
    reference = kernel_matrix(k, x, x)
    ours = kernel_matrix_fused(k.float(), x.float(), x.float())
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), reference, rtol=0, atol=1e-4)


def test_cholesky_and_inverse_and_their_gradients():
    """(L, L⁻¹) and the hand-written backward equal torch's cholesky + inverse under autograd."""
    g = torch.Generator().manual_seed(4)
    R = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)
    K0 = R @ R.mT + 6 * torch.eye(6, dtype=torch.float64)
    G1, G2 = torch.randn(2, 2, 6, 6, generator=g, dtype=torch.float64)
    results = []
    for fn in (lambda K: cholesky_and_inverse(K),
               lambda K: (torch.linalg.cholesky(K), torch.linalg.inv(torch.linalg.cholesky(K)))):
        K = K0.clone().requires_grad_(True)
        L, L_inv = fn(K)
        results.append((L, L_inv, *torch.autograd.grad((G1 * L).sum() + (G2 * L_inv).sum(), K)))
        K = K0.clone().requires_grad_(True)  # one output only (the other gradient is None)
        results[-1] += torch.autograd.grad((G2 * fn(K)[1]).sum(), K)
    for ours, theirs in zip(*results, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_gram_and_quadratic_forms_gradcheck():
    """gram(X) = XXᵀ and mean_and_quadratic(a, S, X) = (aᵀX, colsum(X ⊙ SX)): values, and
    their symmetry-based backward against finite differences (S = R + Rᵀ)."""
    g = torch.Generator().manual_seed(5)
    a, R, X = (torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
               for shape in ((2, 4), (2, 4, 4), (2, 4, 5)))
    S = R + R.mT
    mean, quad = mean_and_quadratic(a, S, X)
    torch.testing.assert_close(mean, torch.einsum("lk,lkb->lb", a, X))
    torch.testing.assert_close(quad, torch.einsum("lkb,lkj,ljb->lb", X, S, X))
    torch.testing.assert_close(gram(X), X @ X.mT)
    assert torch.autograd.gradcheck(lambda a, R, X: mean_and_quadratic(a, R + R.mT, X),
                                    (a, R, X))
    assert torch.autograd.gradcheck(lambda a, R, X: mean_and_quadratic(a, R + R.mT, X)[1],
                                    (a, R, X))
    assert torch.autograd.gradcheck(lambda a, X: mean_and_quadratic(a, S.detach(), X)[0], (a, X))
    assert torch.autograd.gradcheck(gram, (X,))


def test_float32_loss_and_gradients_match_float64():
    """The float32 path (inverse factors cast to float32, batch products in float32) gives the
    float64 loss, gradients and predictive to float32 accuracy on a 300-point batch."""
    x, y = toy_data(n=300)
    results = []
    for dtype in (torch.float64, torch.float32):
        model = randomise_q(build_solvegp(D, init=(x.to(dtype), y.to(dtype)), num_inducing=20,
                                           num_orthogonal=20, jitter=1e-4, **HYPER))
        loss = model.loss(model.condition(x.to(dtype), y.to(dtype)))
        loss.backward()
        with torch.no_grad():
            pred = model.predict(None, x[:50].to(dtype))
        grads = {n: p.grad.double() for n, p in model.named_parameters()}
        results.append((loss.double(), grads, pred.mean.double(), pred.variance.double()))
    (l64, g64, m64, v64), (l32, g32, m32, v32) = results
    torch.testing.assert_close(l32, l64, rtol=1e-4, atol=1e-5)
    for name, grad in g64.items():
        err = (g32[name] - grad).norm() / grad.norm().clamp_min(1e-3)
        assert err < 1e-2, (name, float(err))
    torch.testing.assert_close(m32, m64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(v32, v64, rtol=1e-3, atol=1e-4)


# -- likelihoods -----------------------------------------------------------------------------------
def test_gauss_hermite_is_exact_for_the_gaussian_expected_log_lik():
    """Prop. 13: the closed-form Gaussian ELL equals quadrature (exact for quadratics) and a large
    Monte Carlo estimate."""
    g = torch.Generator().manual_seed(0)
    mean, var = torch.randn(7, generator=g), torch.rand(7, generator=g) + 0.1
    y = torch.randn(7, generator=g)
    s2 = 0.3
    closed = -0.5 * math.log(2 * math.pi * s2) - 0.5 * ((y - mean) ** 2 + var) / s2

    def logp(f):
        return -0.5 * math.log(2 * math.pi * s2) - 0.5 * (y[:, None] - f) ** 2 / s2

    torch.testing.assert_close(gauss_hermite(logp, mean, var, 5), closed, rtol=1e-12, atol=1e-12)
    f = mean + var.sqrt() * torch.randn(200_000, 7, generator=g)
    draws = -0.5 * math.log(2 * math.pi * s2) - 0.5 * (y - f) ** 2 / s2
    std_err = draws.std(0) / math.sqrt(f.shape[0])
    assert bool(((draws.mean(0) - closed).abs() < 5 * std_err).all())


def test_bernoulli_expected_log_lik_matches_numerical_integration():
    """Binary ELL by Gauss–Hermite equals a fine trapezoid integral of log σ(±f) N(f)."""
    x, y = toy_data()
    yb = (y > 0).double()
    model = randomise_q(build_solvegp(D, task="classification", init=(x, yb), num_inducing=6,
                                       num_orthogonal=5, num_quadrature=30))
    with torch.no_grad():
        state = model.condition(x, yb)
        mean, var = model.marginals(state.q, model.projections(state.factors, x))
        ell = model.expected_log_lik(state)
    grid = torch.linspace(-12, 12, 20001)
    m, s = mean[0][:, None], var[0].sqrt()[:, None]
    f = m + s * grid
    dens = torch.exp(-0.5 * grid ** 2) / math.sqrt(2 * math.pi)
    logp = -torch.nn.functional.softplus(-(2 * yb[:, None] - 1) * f)
    ref = torch.trapezoid(logp * dens, grid, dim=1).mean()
    torch.testing.assert_close(ell, ref, rtol=1e-7, atol=1e-8)


def test_softmax_expected_log_lik_matches_quadrature():
    """Softmax ELL by Monte Carlo (many samples) matches a product Gauss–Hermite rule (C = 3)."""
    x, y = toy_data()
    yc = torch.bucketize(y.contiguous(), torch.tensor([-0.5, 0.5]))
    model = randomise_q(build_solvegp(D, task="classification", init=(x, yc), num_inducing=6,
                                       num_orthogonal=5, num_likelihood_samples=4000))
    with torch.no_grad():
        state = model.condition(x, yc)
        mean, var = model.marginals(state.q, model.projections(state.factors, x))  # (3, n)
        ell = model.expected_log_lik(state, torch.Generator().manual_seed(0))
    t, w = np.polynomial.hermite.hermgauss(16)
    t, w = torch.as_tensor(t), torch.as_tensor(w) / math.sqrt(math.pi)
    grids = torch.stack(torch.meshgrid(t, t, t, indexing="ij"), 0).reshape(3, -1)  # (3, K³)
    weights = torch.stack(torch.meshgrid(w, w, w, indexing="ij"), 0).reshape(3, -1).prod(0)
    f = mean[:, :, None] + (2 * var).sqrt()[:, :, None] * grids[:, None, :]  # (3, n, K³)
    logp = f.gather(0, yc[None, :, None].expand(1, -1, f.shape[-1]))[0] - f.logsumexp(0)
    ref = (logp * weights).sum(-1).mean()
    torch.testing.assert_close(ell, ref, rtol=0, atol=0.01)  # MC error with 4000 draws


def test_binary_probabilities_are_the_logistic_marginal():
    """p(y = 1) = E_{N(μ, σ²)}[σ(f)] (trapezoid reference); rows sum to one."""
    x, y = toy_data()
    yb = (y > 0).double()
    model = randomise_q(build_solvegp(D, task="classification", init=(x, yb), num_inducing=6,
                                       num_orthogonal=5, num_quadrature=40))
    with torch.no_grad():
        pred = model.predict(None, x[:10])
    grid = torch.linspace(-12, 12, 20001)
    f = pred.mean[:, None] + pred.variance.sqrt()[:, None] * grid
    dens = torch.exp(-0.5 * grid ** 2) / math.sqrt(2 * math.pi)
    ref = torch.trapezoid(torch.sigmoid(f) * dens, grid, dim=1)
    torch.testing.assert_close(pred.probs[:, 1], ref, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(pred.probs.sum(1), torch.ones(10), rtol=0, atol=1e-12)


def test_multiclass_predictive_shapes_and_probabilities():
    """C > 2: (t, C) latent marginals and probabilities that sum to one, seeded (reproducible)."""
    x, y = toy_data()
    yc = torch.bucketize(y.contiguous(), torch.tensor([-0.5, 0.5]))
    model = build_solvegp(D, task="classification", init=(x, yc), num_inducing=6,
                          num_orthogonal=5)
    assert model.inducing_points.shape == (3, 6, D)
    with torch.no_grad():
        a, b = model.predict(None, x[:7]), model.predict(None, x[:7])
    assert a.mean.shape == a.variance.shape == a.probs.shape == (7, 3)
    torch.testing.assert_close(a.probs.sum(1), torch.ones(7), rtol=0, atol=1e-12)
    torch.testing.assert_close(a.probs, b.probs, rtol=0, atol=0)


# -- training, estimators, contract ----------------------------------------------------------------
def test_solvegp_beats_svgp_with_the_same_m_on_a_toy_problem():
    """Prop. 18 (toy): trained SOLVE-GP (5+5) reaches a higher ELBO than SVGP (5)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(100, 1, generator=g) * 6
    y = torch.sin(3 * x[:, 0]) + 0.3 * torch.cos(7 * x[:, 0]) + 0.1 * torch.randn(100,
                                                                                 generator=g)
    config = FitConfig(optimizer="adam", lr=0.05, epochs=100, progress=False)
    losses = {}
    for M2 in (0, 5):
        model = build_solvegp(1, init=(x, y), num_inducing=5, num_orthogonal=M2, lengthscale=1.0,
                              outputscale=1.0, noise=0.1)
        fit(model, None, (x, y), config)
        with torch.no_grad():
            losses[M2] = float(model.loss(model.condition(x, y)))
    assert losses[5] < losses[0] - 0.2, losses


def test_float32_training_is_finite():
    """float32 minibatch training stays finite and lowers the loss."""
    x, y = toy_data(n=200)
    x, y = x.float(), y.float()
    model = build_solvegp(D, init=(x, y), num_inducing=10, num_orthogonal=10)
    assert model.inducing_points.dtype == torch.float32
    history = fit(model, None, (x, y), FitConfig(lr=0.05, epochs=5, batch_size=64,
                                                 progress=False))
    losses = history.column("loss")
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x[:20])
    assert pred.mean.dtype == torch.float32 and bool(torch.isfinite(pred.variance).all())


def test_estimators_fit_and_predict():
    """GPRegressor / GPClassifier(method='solvegp') train and predict sensibly."""
    x, y = toy_data(n=150)
    reg = GPRegressor(method="solvegp", epochs=30, batch_size=50, lr=0.05, num_inducing=8,
                      num_orthogonal=8, dtype="float64").fit(x.numpy(), y.numpy())
    assert reg.score(x.numpy(), y.numpy()) > 0.8
    labels = np.asarray(["a", "b", "c"])[torch.bucketize(y.contiguous(),
                                                         torch.tensor([-0.5, 0.5])).numpy()]
    clf = GPClassifier(method="solvegp", epochs=30, batch_size=50, lr=0.05, num_inducing=8,
                       num_orthogonal=8, dtype="float64").fit(x.numpy(), labels)
    assert clf.predict_proba(x.numpy()).shape == (150, 3)
    assert (clf.predict(x.numpy()) == labels).mean() > 0.7


def test_registry_entry():
    spec = get_spec("solvegp")
    assert spec.tasks == ("regression", "classification")
    config = default_fit_config("solvegp", "paper")
    assert (config.optimizer, config.lr, config.epochs, config.batch_size, config.dtype) == (
        "adam", 0.01, 50, 1024, "float32")


CASES = {
    "regression": ("regression", {}),
    "unwhitened": ("regression", {"whiten": False}),
    "odvgp": ("regression", {"orthogonal_q": "mean"}),
    "collapsed": ("regression", {"objective": "collapsed"}),
    "binary": ("binary", {}),
    "3class": ("3class", {"num_likelihood_samples": 8}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_save_load_round_trip(case, tmp_path):
    """gpscale.save / load rebuild a model with identical predictions."""
    kind, options = CASES[case]
    x, y = toy_data()
    task = "regression" if kind == "regression" else "classification"
    if kind == "binary":
        y = (y > 0).double()
    elif kind == "3class":
        y = torch.bucketize(y.contiguous(), torch.tensor([-0.5, 0.5]))
    model = randomise_q(build("solvegp", D, task=task, init=(x, y), num_inducing=6,
                               num_orthogonal=4, **options))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        state = model.condition(x, y)
        model.loss(state)
        pred = model.predict(state, x[:9])
    for k, v in model.state_dict().items():  # condition/loss/predict never mutate the module
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    save(model, tmp_path / "m.pt", data=(x, y))
    loaded = load(tmp_path / "m.pt")
    with torch.no_grad():
        again = loaded.predict(loaded.condition(x, y), x[:9])
    for name in ("mean", "variance", "noise", "probs"):
        a, b = getattr(pred, name), getattr(again, name)
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize(("options", "match"), [
    ({"objective": "exact"}, "unknown objective"),
    ({"orthogonal_q": "diag"}, "unknown orthogonal_q"),
    ({"num_orthogonal": -1}, "num_orthogonal must be"),
    ({"num_inducing": 0}, "num_inducing must be"),
    ({"num_inducing": 40, "num_orthogonal": 20}, "inducing points"),
    ({"jitter": -1.0}, "jitter must be"),
    ({"kmeans_max_points": 5}, "kmeans_max_points"),
])
def test_bad_options_raise(options, match):
    x, y = toy_data()
    with pytest.raises(ValueError, match=match):
        build_solvegp(D, init=(x, y), **{"num_inducing": 6, "num_orthogonal": 4, **options})


def test_bad_inputs_raise():
    x, y = toy_data()
    yb = (y > 0).double()
    with pytest.raises(ValueError, match="collapsed"):
        build_solvegp(D, task="classification", init=(x, yb), num_inducing=4, num_orthogonal=4,
                      objective="collapsed")
    with pytest.raises(ValueError, match="num_data"):
        build_solvegp(D, init=None, num_inducing=4, num_orthogonal=4)
    model = small_model(x, y, objective="collapsed")
    with pytest.raises(ValueError, match="full-batch"):
        model.loss(model.condition(x[:10], y[:10]))
    with pytest.raises(ValueError, match="condition"):
        model.predict(None, x[:3])
    with pytest.raises(ValueError, match="features"):
        small_model(x, y).predict(None, torch.zeros(3, D + 1))
    with pytest.raises(ValueError, match="NaN"):
        small_model(x, y).condition(torch.full((4, D), float("nan")), torch.zeros(4))
