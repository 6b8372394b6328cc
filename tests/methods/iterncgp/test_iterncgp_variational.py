"""IterNCGP's variational refinement (issue #21): the Gaussian sites, the KL from the buffers,
the expectations under q, and the fixed point of the refinement against dense float64 algebra."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gpscale.errors import ConvergenceWarning
from gpscale.kernels import kernel_matrix
from gpscale.likelihoods import Bernoulli, Gaussian, Poisson, Softmax
from gpscale.methods.iterncgp import IterNCGP, Stopping, build_iterncgp
from gpscale.methods.iterncgp.evidence import KernelLearning
from gpscale.methods.iterncgp.latent import LatentKernel, fixed_kernel
from gpscale.methods.iterncgp.variational import (
    Sites,
    Variational,
    expected_terms,
    kl_divergence,
    training_covariance,
)
from gpscale.methods.registry import get_spec
from gpscale.testing import block_kernel, gaussian_kl
from gpscale.training.config import FitConfig
from gpscale.training.laplace import learn_kernel

F64 = torch.float64


def _problem(name: str, n: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=F64) * 2 - 1
    if name == "bernoulli":
        lik = Bernoulli()
        y = (torch.sin(3 * x[:, 0]) + 0.3 * torch.randn(n, generator=g, dtype=F64) > 0).long()
    elif name == "poisson":
        lik = Poisson()
        y = torch.poisson(torch.exp(1.0 + torch.sin(3 * x[:, 0])), generator=g)
    elif name == "gaussian":
        lik, y = Gaussian(noise=0.3), torch.sin(3 * x[:, 0]) + 0.5 * x[:, 1]
    else:
        lik = Softmax(3)
        y = torch.bucketize(x[:, 0].contiguous(), torch.tensor([-0.3, 0.3], dtype=F64))
    kernel = fixed_kernel("matern32", 2, ard=False, num_latents=lik.num_latents, shared=True,
                          lengthscale=0.7, outputscale=2.0).double()
    return lik, x, y, kernel


def _full_rank_model(lik, kernel, n: int, **variational) -> IterNCGP:
    """Enough inner iterations that every solve is exact (the actions span everything)."""
    steps = Stopping(outer_rtol=1e-10, max_newton_steps=60, atol=1e-12, rtol=1e-12,
                     max_iterations=lik.num_latents * n)
    return IterNCGP(kernel, lik, stopping=steps,
                    variational=Variational(**{"max_steps": 50, **variational}))


def _dense_q(model, state):
    """(mean (L n,), covariance (L n, L n), K) of q = N(m + K v, K − K Q Qᵀ K)."""
    L, n = state.f.shape
    K = block_kernel(model.kernel, state.x, state.x, L)
    Q = state.Q.reshape(L * n, -1)
    return state.f.reshape(-1), K - K @ Q @ Q.T @ K, K


# -- pieces ----------------------------------------------------------------------------------
def test_sites_pseudo_inverse_drops_the_softmax_null_direction():
    g = torch.Generator().manual_seed(1)
    f = torch.randn(4, 7, generator=g, dtype=F64)
    E = torch.eye(4, dtype=F64)[:, None, :].expand(4, 7, 4)
    blocks = Softmax(4).W_matmul(f, E).transpose(0, 1)  # (n, C, C), each with W 1 = 0
    sites = Sites(blocks, torch.randn(4, 7, generator=g, dtype=F64))
    V = torch.randn(4, 7, 3, generator=g, dtype=F64)
    assert torch.allclose(sites.W_inv_matmul(None, V), Softmax(4).W_inv_matmul(f, V),
                          atol=1e-9)  # Lemma A.7's W† for the softmax's own blocks
    WWp = sites.W_matmul(None, sites.W_inv_matmul(None, V))
    assert torch.allclose(WWp, V - V.mean(0, keepdim=True), atol=1e-9)  # W W† = P


def test_kl_from_the_buffers_equals_the_dense_gaussian_kl():
    lik, x, y, kernel = _problem("softmax", n=12)
    model = _full_rank_model(lik, kernel, 12, enabled=False)
    model.stopping = Stopping(max_iterations=4, max_newton_steps=3)  # a low-rank Q
    state = model.condition(x, y)
    mean, cov, K = _dense_q(model, state)
    L, n = state.f.shape
    KQ = (K @ state.Q.reshape(L * n, -1)).reshape(L, n, -1)
    kl = kl_divergence(state.v, state.f, state.Q, KQ)
    dense = gaussian_kl(mean, cov + 1e-12 * torch.eye(L * n, dtype=F64), torch.zeros_like(mean),
                        K)
    assert state.Q.shape[-1] < L * n
    assert float(kl) == pytest.approx(float(dense), rel=1e-6)
    blocks = training_covariance(model.latent_kernel.diag(x), KQ)
    idx = torch.arange(L)[:, None] * n + torch.arange(n)  # (L, n) rows of each point
    assert torch.allclose(blocks, cov[idx.T[:, :, None], idx.T[:, None, :]], atol=1e-10)


def test_poisson_expectations_are_the_log_normal_closed_forms():
    g = torch.Generator().manual_seed(2)
    mean = torch.randn(1, 9, generator=g, dtype=F64)
    var = torch.rand(9, generator=g, dtype=F64)
    y = torch.poisson(torch.full((9,), 3.0, dtype=F64), generator=g)
    total, grad, W = expected_terms(Poisson(), y, mean, var[:, None, None], Variational())
    rate = torch.exp(mean[0] + var / 2)
    assert float(total) == pytest.approx(
        float((y * mean[0] - rate - torch.lgamma(y + 1)).sum()), rel=1e-10)
    assert torch.allclose(grad[0], y - rate, rtol=1e-10)
    assert torch.allclose(W[:, 0, 0], rate, rtol=1e-10)


@pytest.mark.slow
def test_softmax_expectations_match_a_large_monte_carlo_and_keep_the_null_direction():
    g = torch.Generator().manual_seed(3)
    mean = torch.randn(3, 5, generator=g, dtype=F64)
    A = torch.randn(5, 3, 3, generator=g, dtype=F64)
    cov = A @ A.mT * 0.5
    y = torch.tensor([0, 1, 2, 1, 0])
    total, grad, W = expected_terms(Softmax(3), y, mean, cov, Variational(num_samples=20000))
    draws = mean.mT + torch.einsum("nlm,snm->snl", torch.linalg.cholesky(cov),
                                   torch.randn(200_000, 5, 3, generator=g, dtype=F64))
    pi = torch.softmax(draws, -1)
    reference = (draws.gather(-1, y[None, :, None].expand(200_000, 5, 1))[..., 0]
                 - torch.logsumexp(draws, -1)).sum(-1).mean()
    assert float(total) == pytest.approx(float(reference), abs=0.05)
    assert torch.allclose(grad, (torch.eye(3, dtype=F64)[y] - pi.mean(0)).mT, atol=0.01)
    assert torch.allclose(grad.sum(0), torch.zeros(5, dtype=F64), atol=1e-12)
    assert torch.allclose(W @ torch.ones(3, dtype=F64), torch.zeros(5, 3, dtype=F64),
                          atol=1e-12)


# -- the refinement --------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["bernoulli", "poisson", "softmax"])
def test_full_rank_refinement_reaches_the_variational_fixed_point(name):
    """μ − m = K E_q[∇ log p] and Σ⁻¹ = K⁻¹ + E_q[−∇² log p] (Opper & Archambeau) at the end,
    with the expectations under the final q itself; the Laplace start does not satisfy it."""
    lik, x, y, kernel = _problem(name)
    # the softmax's Monte Carlo fixed point is stationary for the ELBO up to the draws' error
    # (Price's identity holds in expectation): enough draws that the ELBO keeps rising
    model = _full_rank_model(lik, kernel, x.shape[0],
                             num_samples=2000 if name == "softmax" else 32)
    state = model.condition(x, y)
    laplace = model.newton(x, y, *_cold(model, x))
    mean, cov, K = _dense_q(model, state)
    L, n = state.f.shape
    idx = torch.arange(L)[:, None] * n + torch.arange(n)
    blocks = cov[idx.T[:, :, None], idx.T[:, None, :]]
    _, grad, W = expected_terms(lik, y, state.f, blocks, model.variational)
    assert torch.allclose(mean, (K @ grad.reshape(-1)), rtol=1e-5, atol=1e-7)
    W_dense = torch.zeros(L * n, L * n, dtype=F64)
    W_dense[idx.T[:, :, None], idx.T[:, None, :]] = W
    precision = torch.linalg.inv(K) + W_dense
    assert torch.allclose(torch.linalg.inv(precision), cov, rtol=1e-5, atol=1e-7)
    assert (state.f - laplace.f).norm() > 1e-3 * laplace.f.norm()  # it moved


def _cold(model, x):
    from gpscale.methods.iterncgp.solver import empty_belief
    m = x.new_zeros(model.likelihood.num_latents, x.shape[0])
    return m.clone(), torch.zeros_like(m), empty_belief(m)


def test_gaussian_likelihood_elbo_is_the_exact_log_marginal_likelihood():
    """With a Gaussian likelihood the Laplace posterior is exact, the refinement changes nothing
    and its ELBO equals log N(y; 0, K + σ²I)."""
    lik, x, y, kernel = _problem("gaussian")
    model = _full_rank_model(lik, kernel, x.shape[0])
    laplace = model.newton(x, y, *_cold(model, x))
    from gpscale.methods.iterncgp.variational import _elbo
    KQ = model.latent_kernel.training_matmul(x)(laplace.Q)
    elbo, _, _ = _elbo(lik, y, laplace.f, laplace.v, laplace.f, laplace.Q, KQ,
                       model.latent_kernel.diag(x), model.variational)
    K = block_kernel(kernel, x, x, 1) + 0.3 * torch.eye(x.shape[0], dtype=F64)
    exact = torch.distributions.MultivariateNormal(torch.zeros_like(y), K).log_prob(y)
    assert elbo == pytest.approx(float(exact) / x.shape[0], rel=1e-8)
    state = model.refine(laplace)
    assert torch.allclose(state.f, laplace.f, atol=1e-8)


@pytest.mark.parametrize("name", ["bernoulli", "softmax"])
def test_refinement_raises_the_elbo_with_few_actions(name):
    """Truncated solves (computational uncertainty in q): every accepted step raises the ELBO."""
    lik, x, y, kernel = _problem(name, n=60)
    model = IterNCGP(kernel, lik, stopping=Stopping(max_iterations=3),
                     variational=Variational(max_steps=6))
    state = model.condition(x, y)
    laplace_steps = len(model.newton(x, y, *_cold(model, x)).trace)
    elbos = [s.log_joint for s in state.trace[laplace_steps:]]
    assert len(elbos) >= 1
    assert all(b >= a - 1e-9 for a, b in zip(elbos, elbos[1:], strict=False))
    assert all(math.isfinite(e) for e in elbos)


def test_inference_option_selects_laplace_or_variational():
    spec = get_spec("iterncgp")
    names = {o.name: o for o in spec.options}
    assert names["inference"].default == "variational"
    lik, x, y, _ = _problem("bernoulli", n=30)
    runs = {}
    for inference in ("laplace", "variational"):
        model = build_iterncgp(2, num_classes=2, lengthscale=0.7, outputscale=2.0,
                               inference=inference).double()
        runs[inference] = model.condition(x, y)
        assert model.options["inference"] == inference
    assert len(runs["variational"].trace) > len(runs["laplace"].trace)
    with pytest.raises(ValueError, match="unknown inference 'ep'"):
        build_iterncgp(2, num_classes=2, lengthscale=0.7, outputscale=2.0, inference="ep")
    with pytest.raises(ValueError, match="num_samples ≥ 1"):
        Variational(num_samples=0)


# -- the kernel-learning objective -----------------------------------------------------------
def _objective_model(name: str, n: int = 20, **variational):
    lik, x, y, kernel = _problem(name, n=n)
    model = _full_rank_model(lik, kernel, n, **variational)
    model.kernel_learning = KernelLearning(rank=None)
    return model, x, y


@pytest.mark.parametrize("name", ["bernoulli", "poisson", "softmax"])
def test_variational_objective_is_the_dense_elbo_of_the_site_posterior(name):
    """Full-rank actions: the objective equals E_q[log p] − KL(q ‖ p) for the dense site
    posterior q = N(K(K + Λ†)^† ỹ, (K⁻¹ + Λ)⁻¹) under a kernel different from the sites' one."""
    model, x, y = _objective_model(name)
    state = model.condition(x, y)
    problem = model.evidence_problem(state)
    sites = problem.likelihood
    model.kernel.base_kernel.lengthscale = 0.45  # θ moves, the sites and actions stay
    model.kernel.outputscale = 3.0
    L, n = state.f.shape
    K = block_kernel(model.kernel, x, x, L)
    idx = torch.arange(L)[:, None] * n + torch.arange(n)
    Lam = torch.zeros(L * n, L * n, dtype=F64)
    Lam[idx.T[:, :, None], idx.T[:, None, :]] = sites.precision
    cov = torch.linalg.inv(torch.linalg.inv(K) + Lam)
    mean = cov @ sites.location.reshape(-1)  # zero prior mean
    blocks = cov[idx.T[:, :, None], idx.T[:, None, :]]
    # the same draws through the same root as the objective (a Cholesky factor, jittered)
    jitter = 1e-8 * model.latent_kernel.diag(x).mean() * torch.eye(L, dtype=F64)
    expected = expected_terms(model.likelihood, y, mean.reshape(L, n), blocks,
                              model.variational, derivatives=False,
                              root=torch.linalg.cholesky(blocks + jitter))[0]
    dense = (expected - gaussian_kl(mean, cov, torch.zeros_like(mean), K)) / n
    assert float(model.learning_objective(problem)) == pytest.approx(float(dense), rel=1e-6)


def test_variational_objective_of_exact_gaussian_sites_is_the_log_marginal_likelihood():
    """Gaussian likelihood: the sites are exact (Λ = 1/σ²), so for every θ the bound is tight:
    it equals log N(y; 0, K_θ + σ²I) / n."""
    model, x, y = _objective_model("gaussian")
    problem = model.evidence_problem(model.condition(x, y))
    for lengthscale, outputscale in ((0.7, 2.0), (0.3, 0.5), (1.5, 4.0)):
        model.kernel.base_kernel.lengthscale = lengthscale
        model.kernel.outputscale = outputscale
        K = block_kernel(model.kernel, x, x, 1) + 0.3 * torch.eye(x.shape[0], dtype=F64)
        exact = torch.distributions.MultivariateNormal(torch.zeros_like(y), K).log_prob(y)
        assert float(model.learning_objective(problem)) == pytest.approx(
            float(exact) / x.shape[0], rel=1e-7)


@pytest.mark.parametrize("name", ["bernoulli", "softmax"])
def test_variational_objective_gradient_matches_finite_differences(name):
    model, x, y = _objective_model(name, num_samples=8)
    model.stopping = Stopping(max_iterations=5)  # a few actions: the bound with rank < L n
    state = model.condition(x, y)
    problem = model.evidence_problem(state)
    kernel = model.kernel
    kernel.requires_grad_(True)
    value = model.learning_objective(problem)
    value.backward()
    grads = [p.grad.clone() for p in kernel.parameters()]
    kernel.requires_grad_(False)
    h = 1e-6
    with torch.no_grad():
        for p, grad in zip(kernel.parameters(), grads, strict=True):
            for i in range(p.numel()):
                p.view(-1)[i] += h
                up = float(model.learning_objective(problem))
                p.view(-1)[i] -= 2 * h
                down = float(model.learning_objective(problem))
                p.view(-1)[i] += h
                assert float(grad.view(-1)[i]) == pytest.approx((up - down) / (2 * h),
                                                                rel=1e-5, abs=1e-8)


def test_variational_learning_recovers_a_binary_lengthscale():
    """1-D binary data drawn from a GP (ℓ = 0.5, s = 9, n = 600): kernel learning on the
    variational objective from ℓ = 1.0, s = 2 ends within 20 % of the generating ℓ."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(600, 1, generator=g, dtype=F64) * 10
    k = fixed_kernel("matern32", 1, ard=False, num_latents=1, shared=True, lengthscale=0.5,
                     outputscale=9.0).double()
    K = block_kernel(k, x, x, 1) + 1e-8 * torch.eye(600, dtype=F64)
    f = torch.linalg.cholesky(K) @ torch.randn(600, generator=g, dtype=F64)
    y = torch.bernoulli(torch.sigmoid(f), generator=g).long()
    model = build_iterncgp(1, num_classes=2, lengthscale=1.0, outputscale=2.0,
                           learn_kernel=True, max_iterations=10).double()
    assert model.kernel_objective == "variational"
    history, _ = learn_kernel(model, (x, y), FitConfig(progress=False))
    assert float(model.kernel.base_kernel.lengthscale) == pytest.approx(0.5, rel=0.2), history


@pytest.mark.parametrize("profile", ["rbf", "matern12", "matern32", "matern52"])
def test_learning_product_from_held_distances_equals_the_matrix_free_one(profile):
    """Values and hyperparameter gradients of the round's product (held distances, blocks of
    rows under checkpointing) equal those of GPyTorch's dense kernel matrix."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(70, 6, generator=g, dtype=F64)
    V = torch.randn(3, 70, 4, generator=g, dtype=F64)
    kernel = fixed_kernel(profile, 6, ard=False, num_latents=3, shared=True, lengthscale=1.7,
                          outputscale=2.5).double()
    lk = LatentKernel(kernel, 3)
    held = lk.learning_matmul(x, rows=16)
    results = []
    for product in (held, lambda W: torch.einsum("ij,ljk->lik", kernel_matrix(kernel, x, x), W)):
        kernel.requires_grad_(True)
        for p in kernel.parameters():
            p.grad = None
        out = product(V)
        (out * torch.linspace(-1, 1, out.numel(), dtype=F64).reshape(out.shape)).sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in kernel.parameters()]))
        kernel.requires_grad_(False)
    (a, ga), (b, gb) = results
    assert torch.allclose(a, b, rtol=1e-9, atol=1e-10)
    for x1, x2 in zip(ga, gb, strict=True):
        assert torch.allclose(x1, x2, rtol=1e-7, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bernoulli", "softmax"])
def test_warm_restart_from_the_sites_reaches_the_cold_fixed_point(name):
    """After a kernel change, refining from the previous q's sites (no Laplace steps) ends at
    the fixed point that conditioning from scratch under the new kernel reaches."""
    model, x, y = _objective_model(name, num_samples=2000 if name == "softmax" else 32)
    state = model.condition(x, y)
    sites = model.evidence_problem(state).likelihood
    model.kernel.base_kernel.lengthscale = 0.5
    model.kernel.outputscale = 3.0
    warm = model.warm_condition(state, sites)
    cold = model.condition(x, y)
    assert not any(step.log_joint != step.log_joint for step in warm.trace)  # no NaN
    assert torch.allclose(warm.f, cold.f, rtol=1e-4, atol=1e-5)


def test_learning_classifier_starts_from_the_median_distance():
    """``gpscale fit``'s build of a classifier that learns its kernel skips the SVGP pre-fit and
    starts from the median distance between training points (outputscale 1)."""
    from gpscale.training.config import FitConfig as Config
    from gpscale.training.harness import build_method
    g = torch.Generator().manual_seed(7)
    x = torch.rand(50, 3, generator=g, dtype=F64)
    y = (x[:, 0] > 0.5).long()
    model = build_method("iterncgp", (x, y), task="classification", num_classes=None,
                         options={}, config=Config(), seed=0)[0]
    D = torch.cdist(x, x)
    assert model.options["lengthscale"] == pytest.approx(float(D[D > 0].median()))
    assert model.options["outputscale"] == 1.0 and model.learns_kernel


def test_warm_restart_that_diverges_raises_so_the_caller_conditions_from_scratch():
    """A non-finite first step from given sites leaves no posterior to return: it raises
    (kernel learning's restart then conditions from scratch) instead of handing back the
    warm-started iterate without a precision root."""
    from gpscale.errors import NumericalError
    model, x, y = _objective_model("bernoulli")
    state = model.condition(x, y)
    sites = model.evidence_problem(state).likelihood
    broken = Sites(sites.precision, torch.full_like(sites.location, float("inf")))
    with pytest.raises(NumericalError, match="from the given sites"):
        model.warm_condition(state, broken)


def test_refinement_that_runs_out_of_steps_warns_naming_the_change():
    """A mean still moving after vi_steps is not returned silently: a ConvergenceWarning names
    its relative change; with steps enough there is none, and kernel-learning rounds (whose
    states are replaced) stay quiet until the final conditioning."""
    lik, x, y, kernel = _problem("bernoulli", n=30)
    short = _full_rank_model(lik, kernel, 30, max_steps=1)
    short.stopping = Stopping(outer_rtol=1e-12, max_newton_steps=2, max_iterations=60)
    with pytest.warns(ConvergenceWarning, match=r"changed by [0-9.e+-]+ \(relative\).*vi_steps"):
        state = short.condition(x, y)
    assert not state.converged
    full = _full_rank_model(lik, kernel, 30)
    full.stopping = Stopping(outer_rtol=1e-6, max_newton_steps=60, max_iterations=60)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        assert full.condition(x, y).converged
    short.kernel = kernel.requires_grad_(True)
    short.kernel_learning = KernelLearning(enabled=True, rounds=3, steps=3)
    with pytest.warns(ConvergenceWarning) as record:
        learn_kernel(short, (x, y), FitConfig(progress=False))
    assert sum(r.category is ConvergenceWarning for r in record) == 1  # the final state only


def test_refinement_without_an_improving_step_is_no_convergence(monkeypatch):
    """When no step size raises the ELBO the refinement stops, and that stop is no evidence of
    convergence: a Newton state that had not converged stays unconverged and ``condition``
    warns (such a stop once returned a poor posterior as converged, silently)."""
    from gpscale.methods.iterncgp import variational

    lik, x, y, kernel = _problem("bernoulli", n=30)
    model = _full_rank_model(lik, kernel, 30)
    model.stopping = Stopping(outer_rtol=1e-12, max_newton_steps=1, max_iterations=60)
    real, values = variational._elbo, []

    def every_step_worse(*args):
        elbo, g, W = real(*args)
        values.append(elbo)
        return (elbo if len(values) == 1 else elbo - 1.0), g, W  # the start, then only losses

    monkeypatch.setattr(variational, "_elbo", every_step_worse)
    with pytest.warns(ConvergenceWarning, match=r"changed by [0-9.e+-]+ \(relative\)"):
        state = model.condition(x, y)
    assert not state.converged and len(state.trace) == 1  # Newton's one step, none refined
    assert len(values) == 1 + variational.DAMPING_HALVINGS + 1  # every step size was tried


def test_kernel_rounds_on_a_subset_then_condition_on_all_points(monkeypatch):
    """``learn_points``: the rounds see a seeded random subset (the θ they reach is the θ of
    learning on that subset alone), the final state conditions on every point; by default the
    subset is the largest with n²·L ≤ LEARNING_ENTRIES, and 0 means all."""
    from gpscale.training import laplace

    lik, x, y, _ = _problem("bernoulli", n=90)

    def learned(data, points):
        model = build_iterncgp(2, num_classes=2, lengthscale=1.0, outputscale=2.0,
                               max_iterations=10, learn_points=points).double()
        history, state = learn_kernel(model, data, FitConfig(progress=False))
        return model, history, state

    model, history, state = learned((x, y), 40)
    assert set(history.column("points")) == {40}
    assert state.x.shape[0] == 90 and torch.equal(state.x, x)  # the final state: all points
    sub = laplace.learning_subset((x, y), 40, seed=0)
    assert sub[0].shape == (40, 2) and not torch.equal(sub[0], x[:40])  # random, not the first
    alone, _, _ = learned(sub, 0)
    for mine, theirs in zip(model.kernel.parameters(), alone.kernel.parameters(), strict=True):
        assert torch.allclose(mine, theirs, rtol=1e-6)
    from gpscale.methods.iterncgp import evidence

    monkeypatch.setattr(evidence, "LEARNING_ENTRIES", 50**2 * 3)
    assert KernelLearning(points=None).points_for(90, 3) == 50  # n² L ≤ the bound
    assert KernelLearning(points=0).points_for(90, 3) == 90
    assert KernelLearning(points=200).points_for(90, 1) == 90
    assert laplace.learning_subset((x, y), 90)[0] is x
    with pytest.raises(ValueError, match="points ≥ 0"):
        KernelLearning(points=-1)


def test_fit_plan_names_the_learning_subset():
    """``gpscale fit`` says when the kernel rounds see a subset, and how to see all."""
    from gpscale.run import plan_text

    config = FitConfig(max_time=300)
    assert "4,000 random points of 20,000" in plan_text("iterncgp", config, {}, 20_000, 10)
    assert "learn_points=0" in plan_text("iterncgp", config, {}, 20_000, 10)
    assert "random points" not in plan_text("iterncgp", config, {}, 4_000, 10)
    assert "random points" not in plan_text("iterncgp", config, {"learn_points": 0}, 20_000, 10)
    assert "5,000 random" in plan_text("iterncgp", config, {"learn_points": 5000}, 20_000, 1)


def test_kernel_rounds_stop_when_the_evidence_gains_less_than_its_noise(monkeypatch):
    """With the variational objective a round knows its posterior's ELBO before its step: once
    that gained less than LOSS_SD/√n over the last round's, the rounds stop there (θ kept,
    no step taken, "converged"). A noise of 0 never stops them this way."""
    from gpscale.training import laplace

    g = torch.Generator().manual_seed(3)
    x = torch.rand(200, 1, generator=g, dtype=F64) * 10
    y = (torch.sin(x[:, 0]) + 0.3 * torch.randn(200, generator=g, dtype=F64) > 0).long()

    def rounds(sd):
        monkeypatch.setattr(laplace, "LOSS_SD", sd)
        model = build_iterncgp(1, num_classes=2, lengthscale=3.0, outputscale=0.5,
                               learn_kernel=True, kernel_rtol=0.0, kernel_rounds=4,
                               max_iterations=10).double()
        history, _ = learn_kernel(model, (x, y), FitConfig(progress=False))
        return history

    quiet = rounds(0.0)
    assert quiet.stopped == "epochs" and len(quiet.rows) == 4
    gains = [a["loss"] - b["loss"] for a, b in zip(quiet.rows, quiet.rows[1:], strict=False)]
    assert gains[0] > 0  # the first step raised the ELBO
    # a noise just above the first round's gain: the second round stops before its step
    noisy = rounds(1.01 * gains[0] * math.sqrt(200))
    assert noisy.stopped == "converged" and len(noisy.rows) == 2
    second = noisy.rows[1]
    assert second["change"] == 0.0 and second["stepped_evidence"] == second["log_evidence"]
    assert second["lengthscale"] == pytest.approx(quiet.rows[0]["lengthscale"], rel=1e-9)
