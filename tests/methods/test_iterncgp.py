"""IterNCGP (notes/000 §15) against dense float64 references: Newton as GP regression, exact
limits, Eq. 10, recycling and compression invariants, stopping rules, predictive, factory."""

from __future__ import annotations

import math

import pytest
import torch

import gpscale.methods._iterncgp_setup as iterncgp_setup
from gpscale.likelihoods import Bernoulli, Gaussian, Likelihood, Poisson, Softmax
from gpscale.linalg.solvers import ConjugateGradient
from gpscale.methods import build
from gpscale.methods._iterncgp_setup import fixed_kernel, probit_softmax_probs
from gpscale.methods._iterncgp_solver import (
    Belief,
    RegressionProblem,
    empty_belief,
    itergp,
    solve,
    virtual_solver_run,
)
from gpscale.methods.iterncgp import (
    IterativeResidualPolicy,
    IterNCGP,
    PredictiveOptions,
    Recycling,
    SoDLaplace,
    Stopping,
    UnitVectorPolicy,
)

from ._iterncgp_dense import (
    block_kernel,
    dense_itergp_cg,
    dense_W_inv,
    gp_regression,
    laplace_mode,
    newton_step,
    projected_precision,
)

EXACT = dict(atol=0.0, rtol=0.0)


# -- problems ------------------------------------------------------------------------------------
def _problem(name: str, generator: torch.Generator):
    """(likelihood, x (n, d), y, x_test) of a tiny problem."""
    if name == "poisson":
        x = torch.rand(12, 1, generator=generator)
        y = torch.poisson(torch.exp(1.5 * torch.sin(6 * x[:, 0])), generator=generator)
        return Poisson(), x, y, torch.rand(5, 1, generator=generator)
    if name == "bernoulli":
        x = torch.rand(14, 2, generator=generator) * 2 - 1
        y = (torch.sin(3 * x[:, 0]) + 0.5 * torch.randn(14, generator=generator) > 0).long()
        return Bernoulli(), x, y, torch.rand(5, 2, generator=generator) * 2 - 1
    if name == "softmax":
        x = torch.rand(8, 2, generator=generator) * 2 - 1
        y = torch.bucketize(x[:, 0].contiguous(), torch.tensor([-0.3, 0.3]))
        return Softmax(3), x, y, torch.rand(4, 2, generator=generator) * 2 - 1
    if name == "gaussian":
        x = torch.rand(10, 1, generator=generator)
        y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(10, generator=generator)
        return Gaussian(0.05), x, y, torch.rand(5, 1, generator=generator)
    raise KeyError(name)


def _kernel(x, lik, name="matern32", lengthscale=0.4, outputscale=2.0, shared=True):
    return fixed_kernel(name, x.shape[1], ard=False, num_latents=lik.num_latents, shared=shared,
                        lengthscale=lengthscale, outputscale=outputscale)


def _model(lik, x, *, policy=None, recycling=None, stopping=None, prior_mean=0.0, **kw):
    return IterNCGP(_kernel(x, lik, **kw), lik, policy, recycling, stopping,
                    prior_mean=prior_mean)


def _full_rank(lik, x) -> Stopping:
    """An exact inner solve: j_max = nL unit vectors, no tolerance stop."""
    return Stopping(max_iterations=lik.num_latents * x.shape[0], atol=0.0, rtol=0.0,
                    max_newton_steps=1)


def _dense(model, x, x_test=None):
    """(K, K(X, X⋄), diag K(X⋄, X⋄)) in latent-major order."""
    L = model.likelihood.num_latents
    K = block_kernel(model.kernel, x, x, L)
    if x_test is None:
        return K
    return K, block_kernel(model.kernel, x, x_test, L), model.latent_kernel.diag(x_test).reshape(-1)


def _K_hat(model, x, problem) -> torch.Tensor:
    """Dense K̂ = K + W⁻¹ of a regression problem (W⁻¹ from the problem's own closure)."""
    L, n = problem.b.shape
    eye = torch.eye(L * n).reshape(L, n, L * n)
    return _dense(model, x) + problem.W_inv_matmul(eye).reshape(L * n, L * n)


def _flat(t):
    """(L, n) → (L n,); (L, n, k) → (L n, k)."""
    return t.reshape(-1) if t.dim() == 2 else t.reshape(t.shape[0] * t.shape[1], t.shape[-1])


class RandomPolicy:
    """Gaussian random actions (any linearly independent actions satisfy Eq. 10)."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, step):
        return torch.randn(step.residual.shape, generator=self.generator)


class KernelCounter:
    """Counts kernel_matmul calls made by IterNCGP (monkeypatched into its module)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = iterncgp_setup.kernel_matmul

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(iterncgp_setup, "kernel_matmul", counted)


# -- Newton as GP regression ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["poisson", "bernoulli"])
def test_newton_step_is_gp_regression(name, generator):
    """Prop. A.1: K K̂(f)⁻¹ (ŷ(f) − m) + m equals the dense Newton step f − (∇²Ψ)⁻¹∇Ψ."""
    lik, x, y, _ = _problem(name, generator)
    model = _model(lik, x, prior_mean=0.3)
    f = 0.3 + torch.randn(1, x.shape[0], generator=generator)
    problem = model.regression_problem(x, y, f)
    K = _dense(model, x)
    K_hat = K + dense_W_inv(lik, f)
    f_next = 0.3 + K @ torch.linalg.solve(K_hat, _flat(problem.b))
    torch.testing.assert_close(f_next.reshape(f.shape), newton_step(K, lik, f, y, 0.3),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["poisson", "bernoulli", "softmax"])
def test_full_rank_actions_give_exact_newton_step(name, generator):
    """§15.2: nL unit-vector actions give C_j = K̂⁻¹, so f_1 is the exact Newton iterate (for
    softmax with a shared kernel the W† step is exact Newton on Ψ, §15.18)."""
    lik, x, y, _ = _problem(name, generator)
    model = _model(lik, x, policy=UnitVectorPolicy(), recycling=Recycling(False),
                   stopping=_full_rank(lik, x))
    state = model.condition(x, y)
    m = torch.zeros(lik.num_latents, x.shape[0])
    torch.testing.assert_close(state.f, newton_step(_dense(model, x), lik, m, y, 0.0),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["poisson", "bernoulli", "softmax"])
def test_full_rank_actions_reproduce_laplace_posterior(name, generator):
    """§15.2: iterated exact steps reach f_MAP, and the predictive equals the Laplace predictive
    m + K⋄ᵀK̂⁻¹(ŷ − m), K⋄⋄ − K⋄ᵀ K̂⁻¹ K⋄ (Eqs. 4–7) with K̂ = K + W(f_MAP)⁻¹ (W† for softmax)."""
    lik, x, y, x_test = _problem(name, generator)
    stopping = Stopping(max_iterations=lik.num_latents * x.shape[0], atol=0.0, rtol=0.0,
                        outer_rtol=1e-11, max_newton_steps=50)
    model = _model(lik, x, policy=UnitVectorPolicy(), recycling=Recycling(False),
                   stopping=stopping)
    state = model.condition(x, y)
    K, K_xs, k_ss = _dense(model, x, x_test)
    f_map = laplace_mode(K, lik, y, 0.0, state.f.shape)
    torch.testing.assert_close(state.f, f_map, rtol=1e-8, atol=1e-8)
    b = _flat(f_map + lik.W_inv_matmul(f_map, lik.gradient(f_map, y)))
    mean, var = gp_regression(K + dense_W_inv(lik, f_map), K_xs, k_ss, b, 0.0)
    got_mean, got_var = model.latent_marginals(state, x_test)
    torch.testing.assert_close(_flat(got_mean), mean, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(_flat(got_var), var, rtol=1e-7, atol=1e-8)


def test_one_kernel_per_class_full_rank_step_is_regression_step(generator):
    """A batched kernel (one per class): the exact inner solve gives K K̂⁻¹(ŷ − m) + m with
    K = blockdiag(K_1, …, K_C) (the W† regression step of Prop. A.1, notes §7.4)."""
    lik, x, y, _ = _problem("softmax", generator)
    kernel = _kernel(x, lik, shared=False)
    kernel.initialize(**{"base_kernel.lengthscale": torch.tensor([0.3, 0.5, 0.8]).reshape(3, 1, 1),
                         "outputscale": torch.tensor([1.0, 2.0, 3.0])})
    model = IterNCGP(kernel, lik, UnitVectorPolicy(), Recycling(False), _full_rank(lik, x))
    state = model.condition(x, y)
    K = torch.block_diag(*kernel(x, x).to_dense())
    m = torch.zeros(3, x.shape[0])
    b = _flat(lik.W_inv_matmul(m, lik.gradient(m, y)))
    expected = K @ torch.linalg.solve(K + dense_W_inv(lik, m), b)
    torch.testing.assert_close(_flat(state.f), expected, rtol=1e-9, atol=1e-9)


# -- the inner solver: Eq. 10, SoD and CG equivalences ------------------------------------------
@pytest.mark.parametrize("rank", [None, 3], ids=["no-compression", "R=3"])
def test_precision_is_projected_inverse(rank, generator):
    """Eq. 10: Q_jQ_jᵀ = S_j (S_jᵀ K̂ S_j)⁻¹ S_jᵀ for random actions at every j, also on the next
    Newton step with S = [S U_R, new actions] (notes §15.3)."""
    lik, x, y, _ = _problem("poisson", generator)
    model = _model(lik, x)
    policy, stopping = RandomPolicy(1), Stopping(max_iterations=5, atol=0.0, rtol=0.0)
    K = _dense(model, x)
    f = torch.zeros(1, x.shape[0])
    belief = empty_belief(f)
    for _ in range(2):
        problem = model.regression_problem(x, y, f)
        K_hat = K + dense_W_inv(lik, f)
        belief = virtual_solver_run(belief, problem, Recycling(rank=rank))
        for current in itergp(problem, belief, policy, stopping):
            S, Q = _flat(current.S), _flat(current.Q)
            torch.testing.assert_close(Q @ Q.T, projected_precision(K_hat, S), rtol=1e-9,
                                       atol=1e-10)
        belief = current
        f = f + belief.Kv
    assert belief.rank == (5 if rank is None else 0) + 5 + (rank or 0)


def test_unit_vector_policy_is_subset_of_data(generator):
    """§15.4: after j unit-vector actions the posterior is the exact GP regression on the first j
    points of the (seeded) order, with pseudo-targets ŷ and noise W⁻¹ (Prop. A.1)."""
    lik, x, y, x_test = _problem("poisson", generator)
    policy = UnitVectorPolicy(seed=3)
    model = _model(lik, x, policy=policy)
    f = torch.zeros(1, x.shape[0])
    problem = model.regression_problem(x, y, f)
    K, K_xs, k_ss = _dense(model, x, x_test)
    K_hat = K + dense_W_inv(lik, f)
    b = _flat(problem.b)
    beliefs = list(itergp(problem, empty_belief(f), policy, Stopping(max_iterations=6)))
    for j in (1, 3, 6):
        idx = policy.order(x.shape[0])[:j]
        mean, var = gp_regression(K_hat[idx][:, idx], K_xs[idx], k_ss, b[idx], 0.0)
        Q = _flat(beliefs[j].Q)
        torch.testing.assert_close(K_xs.T @ _flat(beliefs[j].v), mean, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(k_ss - (K_xs.T @ Q).square().sum(1), var, rtol=1e-10,
                                   atol=1e-10)


def test_unit_vector_policy_visits_all_classes_of_a_point(generator):
    """With C latents, C·m unit vectors condition on the first m points with all their classes:
    C = E (Eᵀ K̂ E)⁻¹ Eᵀ for the selected entries E."""
    lik, x, y, _ = _problem("softmax", generator)
    policy = UnitVectorPolicy(seed=0)
    model = _model(lik, x, policy=policy)
    f = torch.zeros(3, x.shape[0])
    problem = model.regression_problem(x, y, f)
    K_hat = _dense(model, x) + dense_W_inv(lik, f)
    belief = solve(problem, empty_belief(f), policy, Stopping(max_iterations=6, atol=0.0,
                                                               rtol=0.0))
    points = policy.order(x.shape[0])[:2]
    entries = (torch.arange(3)[:, None] * x.shape[0] + points[None, :]).reshape(-1)
    E = torch.eye(3 * x.shape[0])[:, entries]
    Q = _flat(belief.Q)
    torch.testing.assert_close(Q @ Q.T, projected_precision(K_hat, E), rtol=1e-9, atol=1e-10)


def test_unit_vector_policy_order_and_exhaustion():
    """Entry j is point order[j // L], latent j % L; ``None`` after all nL entries."""
    from gpscale.linalg.solvers import SolverStep

    policy = UnitVectorPolicy()
    r = torch.ones(2, 3)

    def action(j):
        return policy(SolverStep(j, r, r, r.norm(), r, None, torch.tensor(False)))

    assert action(0)[0, 0] == 1 and action(1)[1, 0] == 1 and action(2)[0, 1] == 1
    assert float(action(5).sum()) == 1 and action(6) is None
    shuffled = UnitVectorPolicy(seed=4).order(50)
    assert sorted(shuffled.tolist()) == list(range(50)) and shuffled.tolist() != list(range(50))


def test_unit_vectors_with_recycling_continue_with_new_points(generator):
    """With recycling the unit-vector index counts all actions taken, so two Newton steps with
    j ≤ 3 span exactly the first 6 points of the order (notes §14.12)."""
    lik, x, y, _ = _problem("poisson", generator)
    policy = UnitVectorPolicy(seed=2)
    model = _model(lik, x, policy=policy, stopping=Stopping(max_iterations=3,
                                                            max_newton_steps=2, outer_rtol=0.0))
    state = model.condition(x, y)
    assert [step.buffer_size for step in state.trace] == [3, 6]
    chosen = policy.order(x.shape[0])[:6]
    outside = torch.ones(x.shape[0], dtype=torch.bool)
    outside[chosen] = False
    torch.testing.assert_close(state.S[0, outside], torch.zeros(6, 6), rtol=0, atol=1e-14)
    assert int(torch.linalg.matrix_rank(state.S[0, chosen])) == 6


@pytest.mark.parametrize("name", ["poisson", "softmax"])
def test_residual_policy_iterates_equal_cg(name, generator):
    """§15.5: with C_0 = 0, residual actions give v_j equal to the j-th CG iterate from 0."""
    lik, x, y, _ = _problem(name, generator)
    model = _model(lik, x)
    f = 0.1 * torch.randn(lik.num_latents, x.shape[0], generator=generator)
    problem = model.regression_problem(x, y, f)
    K_hat = _dense(model, x) + dense_W_inv(lik, f)
    cg = ConjugateGradient(rtol=0.0, atol=0.0, max_iters=6)
    cg_iterates = [s.solution[:, 0] for s in cg.iterate(cg.init(K_hat), _flat(problem.b)[:, None])]
    beliefs = list(itergp(problem, empty_belief(f), IterativeResidualPolicy(),
                          Stopping(max_iterations=6, atol=0.0, rtol=0.0)))
    assert len(beliefs) == 7
    for belief, expected in zip(beliefs, cg_iterates, strict=True):
        torch.testing.assert_close(_flat(belief.v), expected, rtol=1e-9, atol=1e-11)


# -- Gaussian likelihood: Thm. A.2 --------------------------------------------------------------
def test_gaussian_one_newton_step_is_exact(generator):
    """Thm. A.2: ŷ = y, and one exact step gives f_1 = f_MAP = m + K(K + Λ)⁻¹(y − m); the next
    step changes nothing, so the outer loop stops after two steps."""
    lik, x, y, _ = _problem("gaussian", generator)
    stopping = Stopping(max_iterations=x.shape[0], atol=0.0, rtol=0.0, outer_rtol=1e-9)
    model = _model(lik, x, stopping=stopping, policy=UnitVectorPolicy(), prior_mean=0.2)
    f = 0.2 + torch.randn(1, x.shape[0], generator=generator)
    torch.testing.assert_close(model.regression_problem(x, y, f).b + 0.2, y[None], rtol=1e-12,
                               atol=1e-12)
    state = model.condition(x, y)
    K = _dense(model, x)
    f_map = 0.2 + K @ torch.linalg.solve(K + 0.05 * torch.eye(x.shape[0]), y - 0.2)
    torch.testing.assert_close(_flat(state.f), f_map, rtol=1e-10, atol=1e-10)
    assert len(state.trace) == 2 and state.trace[1].relative_change < 1e-9


def test_gaussian_equals_itergp(generator):
    """Thm. A.2: IterNCGP with a Gaussian likelihood is IterGP: with 4 CG actions its predictive
    equals the dense IterGP posterior m + K⋄ᵀ C_4 y, K⋄⋄ − K⋄ᵀ C_4 K⋄ (Eqs. 8–10)."""
    lik, x, y, x_test = _problem("gaussian", generator)
    model = _model(lik, x, stopping=Stopping(max_iterations=4, max_newton_steps=1))
    state = model.condition(x, y)
    K, K_xs, k_ss = _dense(model, x, x_test)
    C = dense_itergp_cg(K + 0.05 * torch.eye(x.shape[0]), y, 4)
    pred = model.predict(state, x_test)
    torch.testing.assert_close(pred.mean, K_xs.T @ C @ y, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(pred.variance, k_ss - (K_xs * (C @ K_xs)).sum(0), rtol=1e-9,
                               atol=1e-10)
    torch.testing.assert_close(pred.noise, torch.tensor(0.05))


# -- variance, recycling, compression -----------------------------------------------------------
def _second_step(generator, rank=None, name="bernoulli"):
    """(model, problem of Newton step 1, recycled belief, previous belief, x_test, dense K)."""
    lik, x, y, x_test = _problem(name, generator)
    model = _model(lik, x)
    m = torch.zeros(lik.num_latents, x.shape[0])
    first = solve(model.regression_problem(x, y, m), empty_belief(m), IterativeResidualPolicy(),
                  Stopping(max_iterations=5))
    problem = model.regression_problem(x, y, m + first.Kv)
    return model, problem, virtual_solver_run(first, problem, Recycling(rank=rank)), first, x, \
        x_test


def test_variance_non_increasing_within_newton_step(generator):
    """Prop. A.3: within a Newton step (here i = 1, started from the recycled C_0) the marginal
    variance is non-increasing in j and never below the exact Laplace-step variance (§15.7)."""
    model, problem, belief, _, x, x_test = _second_step(generator)
    _, K_xs, k_ss = _dense(model, x, x_test)
    K_hat = _K_hat(model, x, problem)
    exact = k_ss - (K_xs * torch.linalg.solve(K_hat, K_xs)).sum(0)
    previous = k_ss
    for b in itergp(problem, belief, IterativeResidualPolicy(), Stopping(max_iterations=8, atol=0.0,
                                                                rtol=0.0)):
        var = k_ss - (K_xs.T @ _flat(b.Q)).square().sum(1)
        assert bool((var <= previous + 1e-12).all())
        assert bool((var >= exact - 1e-10).all())
        previous = var


def test_virtual_solver_run_needs_no_kernel_products(generator, monkeypatch):
    """Alg. 3 recycles with zero K-products; an inner iteration costs exactly one (notes §15.8)."""
    model, problem, _, first, x, _ = _second_step(generator)
    counter = KernelCounter(monkeypatch)
    belief = virtual_solver_run(first, problem, Recycling())
    assert counter.calls == 0
    final = solve(problem, belief, IterativeResidualPolicy(),
                  Stopping(max_iterations=3, atol=0, rtol=0))
    assert counter.calls == final.iteration == 3


def test_condition_costs_one_kernel_product_per_iteration(generator, monkeypatch):
    """A whole run makes one K-product per inner iteration and none per outer step."""
    lik, x, y, _ = _problem("poisson", generator)
    model = _model(lik, x, stopping=Stopping(max_iterations=2))
    counter = KernelCounter(monkeypatch)
    state = model.condition(x, y)
    assert counter.calls == sum(step.iterations for step in state.trace) > 0


def test_step_callback_sees_every_newton_step(generator):
    """The hook gets one state per Newton step; the last one is the returned posterior."""
    lik, x, y, x_test = _problem("bernoulli", generator)
    model = _model(lik, x, stopping=Stopping(max_iterations=3))
    seen = []
    model.step_callback = seen.append
    state = model.condition(x, y)
    assert [len(s.trace) for s in seen] == list(range(1, len(state.trace) + 1))
    assert not any(s.converged for s in seen)
    torch.testing.assert_close(seen[-1].f, state.f, **EXACT)
    torch.testing.assert_close(model.predict(seen[-1], x_test).probs,
                               model.predict(state, x_test).probs, **EXACT)


def test_buffers_hold_kernel_products_and_recycled_precision(generator):
    """Alg. 3 / Eq. 11: T = K S after appends and rotation, and C_0 = S M⁻¹ Sᵀ with M built
    from the NEW W(f_{i+1})⁻¹ (notes §15.8)."""
    model, problem, belief, first, x, _ = _second_step(generator)
    K = _dense(model, x)
    torch.testing.assert_close(_flat(first.T), K @ _flat(first.S), rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(_flat(belief.T), K @ _flat(belief.S), rtol=1e-11, atol=1e-12)
    Q = _flat(belief.Q)
    torch.testing.assert_close(Q @ Q.T, projected_precision(_K_hat(model, x, problem),
                                                            _flat(first.S)),
                               rtol=1e-9, atol=1e-10)


def test_empty_or_rank_zero_recycling_gives_prior(generator):
    """R = 0 (or empty buffers) gives C_0 = 0 and v_0 = 0: the prior GP (notes §15.8)."""
    model, problem, _, first, x, x_test = _second_step(generator, rank=0)
    for belief in (virtual_solver_run(first, problem, Recycling(rank=0)),
                   virtual_solver_run(empty_belief(problem.b), problem, Recycling())):
        assert belief.rank == 0 and belief.Q.shape[-1] == 0
        torch.testing.assert_close(belief.v, torch.zeros_like(problem.b), **EXACT)


def test_recycled_residual_is_orthogonal_to_actions(generator):
    """Props. A.4–A.5: v_0 = C_0 b gives Sᵀ r_0 = 0 (so P_S r_0 = 0 and the first new CG action
    is orthogonal to span S) and C_0 K̂ (v⋆ − v_0) = 0 (notes §15.9)."""
    model, problem, belief, first, x, _ = _second_step(generator)
    K_hat = _K_hat(model, x, problem)
    r0 = next(iter(itergp(problem, belief, IterativeResidualPolicy(), Stopping()))).residual
    S = _flat(first.S)
    torch.testing.assert_close(S.T @ _flat(r0), torch.zeros(S.shape[1]), rtol=0, atol=1e-10)
    v_star = torch.linalg.solve(K_hat, _flat(problem.b))
    Q = _flat(belief.Q)
    torch.testing.assert_close(Q @ (Q.T @ (K_hat @ (v_star - _flat(belief.v)))),
                               torch.zeros(x.shape[0]), rtol=0, atol=1e-9)


def test_compression_keeps_largest_eigenpairs(generator):
    """§3.4 / §15.10: R = B reproduces the uncompressed C_0; the rotated actions satisfy
    S̃ᵀK̂S̃ = diag(λ_1 ≥ … ≥ λ_R); C_0^full − C_0^(R) ⪰ 0, so variances only grow."""
    model, problem, full, first, x, x_test = _second_step(generator)
    same = virtual_solver_run(first, problem, Recycling(rank=first.rank))
    Q_full, Q_same = _flat(full.Q), _flat(same.Q)
    torch.testing.assert_close(Q_same @ Q_same.T, Q_full @ Q_full.T, rtol=1e-10, atol=1e-12)
    compressed = virtual_solver_run(first, problem, Recycling(rank=2))
    S = _flat(compressed.S)
    K_hat = _K_hat(model, x, problem)
    M = S.T @ K_hat @ S
    lam = torch.linalg.eigvalsh(_flat(first.S).T @ K_hat @ _flat(first.S)).flip(0)
    torch.testing.assert_close(M, torch.diag(lam[:2]), rtol=1e-9, atol=1e-10)
    Q_R = _flat(compressed.Q)
    assert float(torch.linalg.eigvalsh(Q_full @ Q_full.T - Q_R @ Q_R.T).min()) > -1e-10
    K_xs = block_kernel(model.kernel, x, x_test, 1)
    var_full = -(K_xs.T @ Q_full).square().sum(1)
    var_R = -(K_xs.T @ Q_R).square().sum(1)
    assert bool((var_R >= var_full - 1e-12).all())


@pytest.mark.parametrize("rank", [None, 3], ids=["no-compression", "R=3"])
def test_buffer_width(rank, generator):
    """B ≤ R + j_max with compression; B = total iterations J without (§3.5, §15.10). (A step
    the line search rejects continues its solve, so there B may pass R + j_max; off here.)"""
    lik, x, y, _ = _problem("poisson", generator)
    model = IterNCGP(_kernel(x, lik), lik, recycling=Recycling(rank=rank),
                     stopping=Stopping(max_iterations=2), line_search=False)  # Alg. 1 as printed
    state = model.condition(x, y)
    total = 0
    for step in state.trace:
        total += step.iterations
        if rank is None:
            assert step.buffer_size == total
        else:
            assert step.buffer_size <= rank + 2


def test_trace_identity_for_eigenvector_actions(generator):
    """Prop. A.6: with W⁻¹ = 0 and eigenvector actions, Tr K_{i,0}(X, X) = Tr K − Tr M =
    the sum of the eigenvalues not covered (Eq. 12)."""
    lik, x, _, _ = _problem("poisson", generator)
    model = _model(lik, x)
    K = _dense(model, x)
    lam, V = torch.linalg.eigh(K)
    S = V[:, [1, 4, 7, 11]].reshape(1, x.shape[0], 4)
    problem = RegressionProblem(torch.zeros(1, x.shape[0]), None, lambda V: 0 * V)
    empty = empty_belief(problem.b)
    previous = Belief(S, (K @ _flat(S)).reshape(S.shape), empty.A, empty.a)
    Q = _flat(virtual_solver_run(previous, problem, Recycling()).Q)
    trace = torch.trace(K - K @ Q @ Q.T @ K)
    uncovered = lam.sum() - lam[[1, 4, 7, 11]].sum()
    torch.testing.assert_close(trace, uncovered, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["poisson", "bernoulli"])
def test_recycling_with_one_iteration_per_step_reaches_the_mode(name, generator):
    """§15.17: with recycling, R = ∞ and j ≤ 1 the outer loop converges to f_MAP."""
    lik, x, y, _ = _problem(name, generator)
    model = _model(lik, x, stopping=Stopping(max_iterations=1, outer_rtol=1e-12,
                                             max_newton_steps=300, atol=0.0, rtol=0.0))
    state = model.condition(x, y)
    f_map = laplace_mode(_dense(model, x), lik, y, 0.0, state.f.shape)
    assert state.converged
    torch.testing.assert_close(state.f, f_map, rtol=1e-8, atol=1e-8)


def _large_counts(generator):
    """Poisson counts around 50: the full Newton step from f_0 = 0 overshoots to f ≈ y − 1."""
    x = torch.rand(10, 1, generator=generator)
    y = torch.poisson(torch.full((10,), 50.0), generator=generator)
    return Poisson(), x, y


def test_line_search_keeps_log_joint_non_decreasing(generator):
    """With the line search Ψ(f_i) never decreases and the mode is reached; the full steps of
    Alg. 1 lower Ψ on the same problem (so the safeguard matters)."""
    lik, x, y = _large_counts(generator)
    stopping = Stopping(max_iterations=10, outer_rtol=1e-10, max_newton_steps=100)
    damped = _model(lik, x, stopping=stopping).condition(x, y)
    psi = [float(lik.log_prob(torch.zeros(1, 10), y).sum())]  # Ψ(f_0 = m = 0)
    psi += [step.log_joint for step in damped.trace]
    assert all(b >= a - 1e-9 for a, b in zip(psi, psi[1:], strict=False))
    assert any(step.step_size < 1 for step in damped.trace) and damped.converged
    f_map = laplace_mode(_dense(_model(lik, x), x), lik, y, 0.0, damped.f.shape)
    torch.testing.assert_close(damped.f, f_map, rtol=1e-7, atol=1e-7)
    full = IterNCGP(_kernel(x, lik), lik, stopping=stopping, line_search=False).condition(x, y)
    assert all(step.step_size == 1.0 for step in full.trace)
    assert full.trace[0].log_joint < psi[0]


def test_line_search_with_random_actions_still_reaches_the_mode(generator):
    """Random actions give poor Newton directions; with the line search (damping, or rejection
    and a longer solve of the same problem) Ψ never decreases and the mode is reached."""
    lik, x, y, _ = _problem("bernoulli", generator)
    stopping = Stopping(max_iterations=2, outer_rtol=1e-10, max_newton_steps=200, atol=0.0,
                        rtol=0.0)
    state = _model(lik, x, policy=RandomPolicy(3), stopping=stopping).condition(x, y)
    psi = [float(lik.log_prob(torch.zeros(1, x.shape[0]), y).sum())]
    psi += [step.log_joint for step in state.trace]
    assert all(b >= a - 1e-9 for a, b in zip(psi, psi[1:], strict=False))
    f_map = laplace_mode(_dense(_model(lik, x), x), lik, y, 0.0, state.f.shape)
    torch.testing.assert_close(state.f, f_map, rtol=1e-7, atol=1e-7)


# -- stopping rules --------------------------------------------------------------------------------
def test_outer_stopping_rule(generator):
    """Outer loop stops at the first step with ‖g_{i+1} − g_i‖/‖g_{i+1}‖ ≤ δ (§B.2)."""
    lik, x, y, _ = _problem("poisson", generator)
    state = _model(lik, x, stopping=Stopping(outer_rtol=0.01)).condition(x, y)
    changes = [step.relative_change for step in state.trace]
    assert state.converged and changes[-1] <= 0.01 and all(c > 0.01 for c in changes[:-1])


def test_inner_stopping_rules(generator):
    """The inner loop stops when ‖r_j‖ < max(δ_abs, δ_rel‖b‖) or at j_max (§B.2)."""
    lik, x, y, _ = _problem("poisson", generator)
    model = _model(lik, x)
    f = torch.zeros(1, x.shape[0])
    problem = model.regression_problem(x, y, f)
    stopping = Stopping(atol=1e-3, rtol=1e-4, max_iterations=50)
    bound = max(1e-3, 1e-4 * float(problem.b.norm()))
    beliefs = list(itergp(problem, empty_belief(f), IterativeResidualPolicy(), stopping))
    assert beliefs[-1].stopped == "tolerance"
    assert float(beliefs[-1].residual.norm()) < bound
    assert all(float(b.residual.norm()) >= bound for b in beliefs[:-1])
    capped = solve(problem, empty_belief(f), IterativeResidualPolicy(), Stopping(max_iterations=2))
    assert capped.stopped == "max_iterations" and capped.iteration == 2


class _NegativeNoise(Likelihood):
    """A (non-log-concave) test likelihood with W⁻¹ = −10 I, so K̂ is indefinite and η < 0."""

    task = "regression"

    def log_prob(self, f, y):
        return 0.05 * (f[0] - y).square()

    def gradient(self, f, y):
        return 0.1 * (f - y)

    def W_matmul(self, f, V):
        return -0.1 * V

    def W_inv_matmul(self, f, V):
        return -10.0 * V


def test_eta_guard_returns_current_belief(generator):
    """η_j ≤ 0 stops the inner loop without raising and keeps the current belief (§B.2)."""
    _, x, y, x_test = _problem("gaussian", generator)
    model = IterNCGP(_kernel(x, Gaussian()), _NegativeNoise())
    state = model.condition(x, y)
    assert state.trace[0].stopped == "eta" and state.S.shape[-1] == 0
    mean, var = model.latent_marginals(state, x_test)
    assert bool(torch.isfinite(mean).all() and torch.isfinite(var).all())


def test_repeated_action_is_rejected(generator):
    """An action already in span(S) gives η at round-off level: rejected, not buffered."""
    lik, x, y, _ = _problem("poisson", generator)
    model = _model(lik, x)
    fixed = torch.randn(1, x.shape[0], generator=generator)
    belief = solve(model.regression_problem(x, y, torch.zeros(1, x.shape[0])),
                   empty_belief(fixed), lambda step: fixed, Stopping(max_iterations=5))
    assert belief.stopped == "eta" and belief.rank == 1


# -- loss and predictive ---------------------------------------------------------------------------
def test_loss_is_negative_log_joint_per_datum(generator):
    """loss = −Ψ(f)/n (up to a constant) = ½(f − m)ᵀK⁻¹(f − m)/n − mean log p(y | f)."""
    lik, x, y, _ = _problem("poisson", generator)
    model = _model(lik, x, prior_mean=0.5, lengthscale=0.2)
    state = model.condition(x, y)
    K = _dense(model, x)
    g = _flat(state.f) - 0.5
    expected = 0.5 * g @ torch.linalg.solve(K, g) / 12 - lik.log_prob(state.f, y).mean()
    torch.testing.assert_close(model.loss(state), expected, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(model.loss(state), model.prior_term(state) - model.log_lik(state),
                               **EXACT)


def test_probit_softmax_probabilities():
    """§15.16: probit probabilities sum to 1 and equal softmax(m) at zero variance."""
    g = torch.Generator().manual_seed(0)
    mean, var = torch.randn(6, 4, generator=g), torch.rand(6, 4, generator=g)
    torch.testing.assert_close(probit_softmax_probs(mean, var).sum(-1), torch.ones(6))
    torch.testing.assert_close(probit_softmax_probs(mean, 0 * var), torch.softmax(mean, -1))
    expected = torch.softmax(mean / torch.sqrt(1 + math.pi / 8 * var), -1)
    torch.testing.assert_close(probit_softmax_probs(mean, var), expected, **EXACT)


@pytest.mark.parametrize("probs", ["probit", "mc"])
@pytest.mark.parametrize("name", ["bernoulli", "softmax"])
def test_predictive_probabilities(name, probs, generator):
    """Class probabilities sum to 1; Monte Carlo ≈ probit (same latent marginals)."""
    lik, x, y, x_test = _problem(name, generator)
    model = IterNCGP(_kernel(x, lik), lik, predictive=PredictiveOptions(probs, 20_000))
    pred = model.predict(model.condition(x, y), x_test)
    torch.testing.assert_close(pred.probs.sum(-1), torch.ones(x_test.shape[0]))
    probit = IterNCGP(_kernel(x, lik), lik).predict(model.condition(x, y), x_test)
    # loose: MC noise (~0.005) plus the probit approximation's own error (a few percent)
    torch.testing.assert_close(pred.probs, probit.probs, rtol=0, atol=0.05)


def test_poisson_rate_is_lognormal_mean(generator):
    """Predictive.rate = E[exp f] = exp(m + v/2) under the latent marginal."""
    lik, x, y, x_test = _problem("poisson", generator)
    model = _model(lik, x)
    pred = model.predict(model.condition(x, y), x_test)
    torch.testing.assert_close(pred.rate, torch.exp(pred.mean + pred.variance / 2), **EXACT)


@pytest.mark.parametrize("name", ["bernoulli", "softmax"])
def test_float32_stays_close_to_float64(name, generator):
    """A float32 run is finite and within 1e-3 of float64 (loose: float32 round-off in K̂ and
    the η/eigenvalue floors scale with eps(float32))."""
    lik, x, y, x_test = _problem(name, generator)
    stopping = Stopping(max_iterations=5)
    results = []
    for dtype in (torch.float64, torch.float32):
        model = _model(lik, x, stopping=stopping).to(dtype)
        pred = model.predict(model.condition(x.to(dtype), y), x_test.to(dtype))
        assert bool(torch.isfinite(pred.probs).all())
        results.append(pred.probs.double())
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-3)


# -- inputs, factory, registry, SoD ----------------------------------------------------------------
@pytest.mark.parametrize("case", ["label-too-large", "negative-count", "fractional-count"])
def test_bad_targets_raise(case, generator):
    """Labels outside 0..C−1, negative or non-integer counts: ValueError (validation.check_xy)."""
    name = "softmax" if case == "label-too-large" else "poisson"
    lik, x, y, _ = _problem(name, generator)
    y = y.clone()
    y[0] = {"label-too-large": 3, "negative-count": -1, "fractional-count": 1.5}[case]
    with pytest.raises(ValueError, match="labels|count"):
        _model(lik, x).condition(x, y)


def test_wrong_test_features_raise(generator):
    lik, x, y, _ = _problem("poisson", generator)
    model = _model(lik, x)
    with pytest.raises(ValueError, match="features"):
        model.predict(model.condition(x, y), torch.zeros(3, 2))


@pytest.mark.parametrize(("task", "labels", "expected"), [
    ("classification", 2, Bernoulli), ("classification", 3, Softmax), ("counts", None, Poisson)])
def test_factory_picks_likelihood_and_rebuilds(task, labels, expected, generator):
    """The factory maps the task to the likelihood; ``options`` + state dict rebuild the same
    predictions, and ``condition`` leaves the module unchanged."""
    x = torch.rand(20, 2, generator=generator)
    y = (torch.randint(0, labels, (20,), generator=generator) if labels else
         torch.randint(0, 5, (20,), generator=generator).double())
    model = build("iterncgp", 2, task=task, init=(x, y), lengthscale=0.5, outputscale=1.5)
    assert isinstance(model.likelihood, expected) and not model.trainable
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = model.condition(x, y)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], **EXACT)
    twin = build("iterncgp", 2, task=task, num_classes=model.num_classes, init=None,
                 **model.options)
    twin.load_state_dict(model.state_dict())
    a, b = model.predict(state, x[:5]), twin.predict(twin.condition(x, y), x[:5])
    torch.testing.assert_close(a.mean, b.mean, **EXACT)
    torch.testing.assert_close(a.variance, b.variance, **EXACT)


def test_factory_prefits_hyperparameters_with_svgp(generator):
    """Without lengthscale/outputscale the factory fits SVGP briefly and freezes its values."""
    x = torch.rand(40, 2, generator=generator)
    y = (x[:, 0] > 0.5).long()
    model = build("iterncgp", 2, task="classification", init=(x, y), prefit_steps=5,
                  prefit_num_inducing=8, policy="chol")
    ls, os_ = model.options["lengthscale"], model.options["outputscale"]
    assert isinstance(ls, float) and isinstance(os_, float) and ls > 0 and os_ > 0
    assert ls != pytest.approx(math.sqrt(2)) or os_ != pytest.approx(1.0)  # moved off SVGP init
    assert not any(p.requires_grad for p in model.parameters())
    assert isinstance(model.policy, UnitVectorPolicy)
    with pytest.raises(ValueError, match="policy"):
        build("iterncgp", 2, task="classification", init=(x, y), policy="lanczos",
              lengthscale=1.0, outputscale=1.0)


def test_factory_one_kernel_per_class(generator):
    """``shared_kernel=False`` keeps SVGP's per-class hyperparameters in a batched kernel, and
    prediction matches the dense per-class posterior mean m + K⋄ᵀ v."""
    x = torch.rand(30, 2, generator=generator)
    y = torch.bucketize(x[:, 0].contiguous(), torch.tensor([0.33, 0.66]))
    model = build("iterncgp", 2, task="classification", init=(x, y), shared_kernel=False,
                  prefit_steps=5, prefit_num_inducing=8)
    assert len(model.options["lengthscale"]) == 3 and len(model.options["outputscale"]) == 3
    assert tuple(model.kernel.batch_shape) == (3,)
    state = model.condition(x, y)
    pred = model.predict(state, x[:4])
    K_xs = torch.block_diag(*model.kernel(x, x[:4]).to_dense())  # (3 n, 3 t)
    torch.testing.assert_close(pred.mean.T.reshape(-1), K_xs.T @ _flat(state.v), rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize("name", ["poisson", "softmax"])
def test_sod_laplace_on_all_points_is_exact_laplace(name, generator):
    """SoD-Laplace with N_sub = n is the dense Laplace approximation (f_MAP and predictive)."""
    lik, x, y, x_test = _problem(name, generator)
    model = SoDLaplace(_kernel(x, lik), lik, num_subset=100,
                       stopping=Stopping(outer_rtol=1e-11))
    state = model.condition(x, y)
    assert sorted(state.index.tolist()) == list(range(x.shape[0]))
    K = block_kernel(model.kernel, state.x, state.x, lik.num_latents)
    f_map = laplace_mode(K, lik, state.y, 0.0, state.f.shape)
    torch.testing.assert_close(state.f, f_map, rtol=1e-8, atol=1e-8)
    K_xs = block_kernel(model.kernel, state.x, x_test, lik.num_latents)
    k_ss = model.latent_kernel.diag(x_test).reshape(-1)
    b = _flat(f_map + lik.W_inv_matmul(f_map, lik.gradient(f_map, state.y)))
    mean, var = gp_regression(K + dense_W_inv(lik, f_map), K_xs, k_ss, b, 0.0)
    pred = model.predict(state, x_test)
    torch.testing.assert_close(_flat(pred.mean.T if pred.mean.dim() == 2 else pred.mean[None]),
                               mean, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(_flat(pred.variance.T if pred.variance.dim() == 2
                                     else pred.variance[None]), var, rtol=1e-7, atol=1e-8)


def test_sod_laplace_registry_and_subset(generator):
    """``sod-laplace`` builds through the registry and conditions on N_sub seeded points."""
    lik, x, y, x_test = _problem("bernoulli", generator)
    model = build("sod-laplace", 2, task="classification", init=(x, y), num_subset=6,
                  lengthscale=0.5, outputscale=2.0, seed=1)
    state = model.condition(x, y)
    torch.testing.assert_close(state.x, x[model.subset(x.shape[0])], **EXACT)
    assert state.x.shape[0] == 6 and model.predict(state, x_test).probs.shape == (5, 2)
