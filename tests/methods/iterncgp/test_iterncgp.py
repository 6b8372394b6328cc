"""IterNCGP (notes/000 §15) against dense float64 references: Newton as GP regression, exact
limits, Eq. 10 and the inner solver, the Gaussian case."""

from __future__ import annotations

import pytest
import torch

from gpscale.linalg.solvers import ConjugateGradient
from gpscale.methods.iterncgp import (
    IterativeResidualPolicy,
    IterNCGP,
    PreconditionedResidualPolicy,
    Recycling,
    Stopping,
    UnitVectorPolicy,
)
from gpscale.methods.iterncgp.solver import (
    empty_belief,
    itergp,
    solve,
    virtual_solver_run,
)
from gpscale.testing import (
    dense_itergp_cg,
    dense_W_inv,
    gp_regression,
    laplace_mode,
    newton_step,
    projected_precision,
)

from ._cases import (
    RandomPolicy,
    dense_posterior,
    flat,
    full_rank_stopping,
    make_problem,
    problem_kernel,
    small_model,
)


# -- Newton as GP regression ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["poisson", "bernoulli"])
def test_newton_step_is_gp_regression(name, generator):
    """Prop. A.1: K K̂(f)⁻¹ (ŷ(f) − m) + m equals the dense Newton step f − (∇²Ψ)⁻¹∇Ψ."""
    lik, x, y, _ = make_problem(name, generator)
    model = small_model(lik, x, prior_mean=0.3)
    f = 0.3 + torch.randn(1, x.shape[0], generator=generator)
    problem = model.regression_problem(x, y, f)
    K = dense_posterior(model, x)
    K_hat = K + dense_W_inv(lik, f)
    f_next = 0.3 + K @ torch.linalg.solve(K_hat, flat(problem.b))
    torch.testing.assert_close(f_next.reshape(f.shape), newton_step(K, lik, f, y, 0.3),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["poisson", "bernoulli", "softmax"])
def test_full_rank_actions_give_exact_newton_step(name, generator):
    """§15.2: nL unit-vector actions give C_j = K̂⁻¹, so f_1 is the exact Newton iterate (for
    softmax with a shared kernel the W† step is exact Newton on Ψ, §15.18)."""
    lik, x, y, _ = make_problem(name, generator)
    model = small_model(lik, x, policy=UnitVectorPolicy(), recycling=Recycling(False),
                   stopping=full_rank_stopping(lik, x))
    state = model.condition(x, y)
    m = torch.zeros(lik.num_latents, x.shape[0])
    torch.testing.assert_close(state.f, newton_step(dense_posterior(model, x), lik, m, y, 0.0),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["poisson", "bernoulli", "softmax"])
def test_full_rank_actions_reproduce_laplace_posterior(name, generator):
    """§15.2: iterated exact steps reach f_MAP, and the predictive equals the Laplace predictive
    m + K⋄ᵀK̂⁻¹(ŷ − m), K⋄⋄ − K⋄ᵀ K̂⁻¹ K⋄ (Eqs. 4–7) with K̂ = K + W(f_MAP)⁻¹ (W† for softmax)."""
    lik, x, y, x_test = make_problem(name, generator)
    stopping = Stopping(max_iterations=lik.num_latents * x.shape[0], atol=0.0, rtol=0.0,
                        outer_rtol=1e-11, max_newton_steps=50)
    model = small_model(lik, x, policy=UnitVectorPolicy(), recycling=Recycling(False),
                   stopping=stopping)
    state = model.condition(x, y)
    K, K_xs, k_ss = dense_posterior(model, x, x_test)
    f_map = laplace_mode(K, lik, y, 0.0, state.f.shape)
    torch.testing.assert_close(state.f, f_map, rtol=1e-8, atol=1e-8)
    b = flat(f_map + lik.W_inv_matmul(f_map, lik.gradient(f_map, y)))
    mean, var = gp_regression(K + dense_W_inv(lik, f_map), K_xs, k_ss, b, 0.0)
    got_mean, got_var = model.latent_marginals(state, x_test)
    torch.testing.assert_close(flat(got_mean), mean, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(flat(got_var), var, rtol=1e-7, atol=1e-8)
    # the joint L × L covariance at each test point: blocks of K⋄⋄ − K⋄ᵀ K̂⁻¹ K⋄
    L, t = lik.num_latents, x_test.shape[0]
    full = K_xs.mT @ torch.linalg.solve(K + dense_W_inv(lik, f_map), K_xs)  # (L t, L t)
    expected = torch.diag_embed(k_ss.reshape(L, t).mT) - torch.einsum(
        "atbt->tab", full.reshape(L, t, L, t))
    torch.testing.assert_close(model.latent_covariance(state, x_test), expected,
                               rtol=1e-7, atol=1e-8)


def test_one_kernel_per_class_full_rank_step_is_regression_step(generator):
    """A batched kernel (one per class): the exact inner solve gives K K̂⁻¹(ŷ − m) + m with
    K = blockdiag(K_1, …, K_C) (the W† regression step of Prop. A.1, notes §7.4)."""
    lik, x, y, _ = make_problem("softmax", generator)
    kernel = problem_kernel(x, lik, shared=False)
    kernel.initialize(**{"base_kernel.lengthscale": torch.tensor([0.3, 0.5, 0.8]).reshape(3, 1, 1),
                         "outputscale": torch.tensor([1.0, 2.0, 3.0])})
    model = IterNCGP(kernel, lik, UnitVectorPolicy(), Recycling(False), full_rank_stopping(lik, x))
    state = model.condition(x, y)
    K = torch.block_diag(*kernel(x, x).to_dense())
    m = torch.zeros(3, x.shape[0])
    b = flat(lik.W_inv_matmul(m, lik.gradient(m, y)))
    expected = K @ torch.linalg.solve(K + dense_W_inv(lik, m), b)
    torch.testing.assert_close(flat(state.f), expected, rtol=1e-9, atol=1e-9)


# -- the inner solver: Eq. 10, SoD and CG equivalences ------------------------------------------
@pytest.mark.parametrize("rank", [None, 3], ids=["no-compression", "R=3"])
def test_precision_is_projected_inverse(rank, generator):
    """Eq. 10: Q_jQ_jᵀ = S_j (S_jᵀ K̂ S_j)⁻¹ S_jᵀ for random actions at every j, also on the next
    Newton step with S = [S U_R, new actions] (notes §15.3)."""
    lik, x, y, _ = make_problem("poisson", generator)
    model = small_model(lik, x)
    policy, stopping = RandomPolicy(1), Stopping(max_iterations=5, atol=0.0, rtol=0.0)
    K = dense_posterior(model, x)
    f = torch.zeros(1, x.shape[0])
    belief = empty_belief(f)
    for _ in range(2):
        problem = model.regression_problem(x, y, f)
        K_hat = K + dense_W_inv(lik, f)
        belief = virtual_solver_run(belief, problem, Recycling(rank=rank))
        for current in itergp(problem, belief, policy, stopping):
            S, Q = flat(current.S), flat(current.Q)
            torch.testing.assert_close(Q @ Q.T, projected_precision(K_hat, S), rtol=1e-9,
                                       atol=1e-10)
        belief = current
        f = f + belief.Kv
    assert belief.rank == (5 if rank is None else 0) + 5 + (rank or 0)


def test_unit_vector_policy_is_subset_of_data(generator):
    """§15.4: after j unit-vector actions the posterior is the exact GP regression on the first j
    points of the (seeded) order, with pseudo-targets ŷ and noise W⁻¹ (Prop. A.1)."""
    lik, x, y, x_test = make_problem("poisson", generator)
    policy = UnitVectorPolicy(seed=3)
    model = small_model(lik, x, policy=policy)
    f = torch.zeros(1, x.shape[0])
    problem = model.regression_problem(x, y, f)
    K, K_xs, k_ss = dense_posterior(model, x, x_test)
    K_hat = K + dense_W_inv(lik, f)
    b = flat(problem.b)
    beliefs = list(itergp(problem, empty_belief(f), policy, Stopping(max_iterations=6)))
    for j in (1, 3, 6):
        idx = policy.order(x.shape[0])[:j]
        mean, var = gp_regression(K_hat[idx][:, idx], K_xs[idx], k_ss, b[idx], 0.0)
        Q = flat(beliefs[j].Q)
        torch.testing.assert_close(K_xs.T @ flat(beliefs[j].v), mean, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(k_ss - (K_xs.T @ Q).square().sum(1), var, rtol=1e-10,
                                   atol=1e-10)


def test_unit_vector_policy_visits_all_classes_of_a_point(generator):
    """With C latents, C·m unit vectors condition on the first m points with all their classes:
    C = E (Eᵀ K̂ E)⁻¹ Eᵀ for the selected entries E."""
    lik, x, y, _ = make_problem("softmax", generator)
    policy = UnitVectorPolicy(seed=0)
    model = small_model(lik, x, policy=policy)
    f = torch.zeros(3, x.shape[0])
    problem = model.regression_problem(x, y, f)
    K_hat = dense_posterior(model, x) + dense_W_inv(lik, f)
    belief = solve(problem, empty_belief(f), policy, Stopping(max_iterations=6, atol=0.0,
                                                               rtol=0.0))
    points = policy.order(x.shape[0])[:2]
    entries = (torch.arange(3)[:, None] * x.shape[0] + points[None, :]).reshape(-1)
    E = torch.eye(3 * x.shape[0])[:, entries]
    Q = flat(belief.Q)
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
    lik, x, y, _ = make_problem("poisson", generator)
    policy = UnitVectorPolicy(seed=2)
    model = small_model(lik, x, policy=policy, stopping=Stopping(max_iterations=3,
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
    lik, x, y, _ = make_problem(name, generator)
    model = small_model(lik, x)
    f = 0.1 * torch.randn(lik.num_latents, x.shape[0], generator=generator)
    problem = model.regression_problem(x, y, f)
    K_hat = dense_posterior(model, x) + dense_W_inv(lik, f)
    cg = ConjugateGradient(rtol=0.0, atol=0.0, max_iters=6)
    cg_iterates = [s.solution[:, 0] for s in cg.iterate(cg.init(K_hat), flat(problem.b)[:, None])]
    beliefs = list(itergp(problem, empty_belief(f), IterativeResidualPolicy(),
                          Stopping(max_iterations=6, atol=0.0, rtol=0.0)))
    assert len(beliefs) == 7
    for belief, expected in zip(beliefs, cg_iterates, strict=True):
        torch.testing.assert_close(flat(belief.v), expected, rtol=1e-9, atol=1e-11)


class _DensePreconditioner:
    """P with P⁻¹ = M (dense), for ConjugateGradient."""

    def __init__(self, M):
        self.M = M

    def solve(self, R):
        return self.M @ R


@pytest.mark.parametrize("name", ["poisson", "bernoulli"])
def test_preconditioned_residual_policy_iterates_equal_pcg(name, generator):
    """Actions W r_{j−1} give v_j equal to the j-th preconditioned CG iterate (P = W⁻¹) from 0,
    and differ from plain CG's."""
    lik, x, y, _ = make_problem(name, generator)
    model = small_model(lik, x)
    f = 1.5 * torch.randn(lik.num_latents, x.shape[0], generator=generator)  # uneven W
    problem = model.regression_problem(x, y, f)
    W_inv = dense_W_inv(lik, f)
    K_hat = dense_posterior(model, x) + W_inv
    cg = ConjugateGradient(rtol=0.0, atol=0.0, max_iters=5)
    P = _DensePreconditioner(torch.linalg.inv(W_inv))
    b = flat(problem.b)[:, None]
    pcg = [s.solution[:, 0] for s in cg.iterate(cg.init(K_hat, P), b)]
    plain = [s.solution[:, 0] for s in cg.iterate(cg.init(K_hat), b)]
    beliefs = list(itergp(problem, empty_belief(f), PreconditionedResidualPolicy(),
                          Stopping(max_iterations=5, atol=0.0, rtol=0.0)))
    assert len(beliefs) == 6
    for belief, expected in zip(beliefs, pcg, strict=True):
        torch.testing.assert_close(flat(belief.v), expected, rtol=1e-9, atol=1e-11)
    assert float((flat(beliefs[2].v) - plain[2]).norm()) > 1e-3 * float(plain[2].norm())
    with pytest.raises(TypeError, match="bind"):
        PreconditionedResidualPolicy()(None)


def test_pcg_policy_from_the_factory_converges_like_cg(generator):
    """build_iterncgp(policy='pcg') reaches the same Laplace mode as the residual policy."""
    from gpscale.methods.registry import build

    lik, x, y, _ = make_problem("bernoulli", generator)
    modes = []
    for policy in ("cg", "pcg"):
        model = build("iterncgp", x.shape[1], task="classification", num_classes=2, init=(x, y),
                      policy=policy, lengthscale=0.5, outputscale=2.0, max_iterations=x.shape[0],
                      outer_rtol=1e-8, rtol=1e-10, max_newton_steps=50).double()
        modes.append(model.condition(x.double(), y).f)
    torch.testing.assert_close(modes[1], modes[0], rtol=1e-6, atol=1e-6)


# -- Gaussian likelihood: Thm. A.2 --------------------------------------------------------------
def test_gaussian_one_newton_step_is_exact(generator):
    """Thm. A.2: ŷ = y, and one exact step gives f_1 = f_MAP = m + K(K + Λ)⁻¹(y − m); the next
    step changes nothing, so the outer loop stops after two steps."""
    lik, x, y, _ = make_problem("gaussian", generator)
    stopping = Stopping(max_iterations=x.shape[0], atol=0.0, rtol=0.0, outer_rtol=1e-9)
    model = small_model(lik, x, stopping=stopping, policy=UnitVectorPolicy(), prior_mean=0.2)
    f = 0.2 + torch.randn(1, x.shape[0], generator=generator)
    torch.testing.assert_close(model.regression_problem(x, y, f).b + 0.2, y[None], rtol=1e-12,
                               atol=1e-12)
    state = model.condition(x, y)
    K = dense_posterior(model, x)
    f_map = 0.2 + K @ torch.linalg.solve(K + 0.05 * torch.eye(x.shape[0]), y - 0.2)
    torch.testing.assert_close(flat(state.f), f_map, rtol=1e-10, atol=1e-10)
    assert len(state.trace) == 2 and state.trace[1].relative_change < 1e-9


def test_gaussian_equals_itergp(generator):
    """Thm. A.2: IterNCGP with a Gaussian likelihood is IterGP: with 4 CG actions its predictive
    equals the dense IterGP posterior m + K⋄ᵀ C_4 y, K⋄⋄ − K⋄ᵀ C_4 K⋄ (Eqs. 8–10)."""
    lik, x, y, x_test = make_problem("gaussian", generator)
    model = small_model(lik, x, stopping=Stopping(max_iterations=4, max_newton_steps=1))
    state = model.condition(x, y)
    K, K_xs, k_ss = dense_posterior(model, x, x_test)
    C = dense_itergp_cg(K + 0.05 * torch.eye(x.shape[0]), y, 4)
    pred = model.predict(state, x_test)
    torch.testing.assert_close(pred.mean, K_xs.T @ C @ y, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(pred.variance, k_ss - (K_xs * (C @ K_xs)).sum(0), rtol=1e-9,
                               atol=1e-10)
    torch.testing.assert_close(pred.noise, torch.tensor(0.05))
