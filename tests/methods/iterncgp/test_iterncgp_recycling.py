"""IterNCGP (notes/000 §15): variance, recycling and compression invariants, line search, stopping
rules and the loss; the held kernel matrix and the trust radius. The predictive and bad inputs
are in test_iterncgp_predictive.py, the factories and SoD-Laplace in test_iterncgp_factory.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gpscale.likelihoods import Gaussian, Likelihood, Poisson
from gpscale.methods.iterncgp import (
    IterativeResidualPolicy,
    IterNCGP,
    Recycling,
    Stopping,
)
from gpscale.methods.iterncgp.newton import newton_step_size
from gpscale.methods.iterncgp.solver import (
    Belief,
    RegressionProblem,
    empty_belief,
    itergp,
    solve,
    virtual_solver_run,
)
from gpscale.testing import (
    block_kernel,
    laplace_mode,
    projected_precision,
)

from ._cases import (
    EXACT,
    KernelCounter,
    RandomPolicy,
    dense_K_hat,
    dense_posterior,
    flat,
    make_problem,
    problem_kernel,
    small_model,
)


# -- variance, recycling, compression -----------------------------------------------------------
def _second_step(generator, rank=None, name="bernoulli"):
    """(model, problem of Newton step 1, recycled belief, previous belief, x_test, dense K)."""
    lik, x, y, x_test = make_problem(name, generator)
    model = small_model(lik, x)
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
    _, K_xs, k_ss = dense_posterior(model, x, x_test)
    K_hat = dense_K_hat(model, x, problem)
    exact = k_ss - (K_xs * torch.linalg.solve(K_hat, K_xs)).sum(0)
    previous = k_ss
    for b in itergp(problem, belief, IterativeResidualPolicy(), Stopping(max_iterations=8, atol=0.0,
                                                                rtol=0.0)):
        var = k_ss - (K_xs.T @ flat(b.Q)).square().sum(1)
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
    lik, x, y, _ = make_problem("poisson", generator)
    model = small_model(lik, x, stopping=Stopping(max_iterations=2))
    counter = KernelCounter(monkeypatch)
    state = model.condition(x, y)
    assert counter.calls == sum(step.iterations for step in state.trace) > 0


def test_on_step_sees_every_newton_step(generator):
    """The hook gets one state per Newton step; the last one is the returned posterior."""
    lik, x, y, x_test = make_problem("bernoulli", generator)
    model = small_model(lik, x, stopping=Stopping(max_iterations=3))
    seen = []
    state = model.condition(x, y, on_step=seen.append)
    assert [len(s.trace) for s in seen] == list(range(1, len(state.trace) + 1))
    assert not any(s.converged for s in seen)
    torch.testing.assert_close(seen[-1].f, state.f, **EXACT)
    torch.testing.assert_close(model.predict(seen[-1], x_test).probs,
                               model.predict(state, x_test).probs, **EXACT)


def test_buffers_hold_kernel_products_and_recycled_precision(generator):
    """Alg. 3 / Eq. 11: T = K S after appends and rotation, and C_0 = S M⁻¹ Sᵀ with M built
    from the NEW W(f_{i+1})⁻¹ (notes §15.8)."""
    model, problem, belief, first, x, _ = _second_step(generator)
    K = dense_posterior(model, x)
    torch.testing.assert_close(flat(first.T), K @ flat(first.S), rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(flat(belief.T), K @ flat(belief.S), rtol=1e-11, atol=1e-12)
    Q = flat(belief.Q)
    torch.testing.assert_close(Q @ Q.T, projected_precision(dense_K_hat(model, x, problem),
                                                            flat(first.S)),
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
    K_hat = dense_K_hat(model, x, problem)
    r0 = next(iter(itergp(problem, belief, IterativeResidualPolicy(), Stopping()))).residual
    S = flat(first.S)
    torch.testing.assert_close(S.T @ flat(r0), torch.zeros(S.shape[1]), rtol=0, atol=1e-10)
    v_star = torch.linalg.solve(K_hat, flat(problem.b))
    Q = flat(belief.Q)
    torch.testing.assert_close(Q @ (Q.T @ (K_hat @ (v_star - flat(belief.v)))),
                               torch.zeros(x.shape[0]), rtol=0, atol=1e-9)


def test_compression_keeps_largest_eigenpairs(generator):
    """§3.4 / §15.10: R = B reproduces the uncompressed C_0; the rotated actions satisfy
    S̃ᵀK̂S̃ = diag(λ_1 ≥ … ≥ λ_R); C_0^full − C_0^(R) ⪰ 0, so variances only grow."""
    model, problem, full, first, x, x_test = _second_step(generator)
    same = virtual_solver_run(first, problem, Recycling(rank=first.rank))
    Q_full, Q_same = flat(full.Q), flat(same.Q)
    torch.testing.assert_close(Q_same @ Q_same.T, Q_full @ Q_full.T, rtol=1e-10, atol=1e-12)
    compressed = virtual_solver_run(first, problem, Recycling(rank=2))
    S = flat(compressed.S)
    K_hat = dense_K_hat(model, x, problem)
    M = S.T @ K_hat @ S
    lam = torch.linalg.eigvalsh(flat(first.S).T @ K_hat @ flat(first.S)).flip(0)
    torch.testing.assert_close(M, torch.diag(lam[:2]), rtol=1e-9, atol=1e-10)
    Q_R = flat(compressed.Q)
    assert float(torch.linalg.eigvalsh(Q_full @ Q_full.T - Q_R @ Q_R.T).min()) > -1e-10
    K_xs = block_kernel(model.kernel, x, x_test, 1)
    var_full = -(K_xs.T @ Q_full).square().sum(1)
    var_R = -(K_xs.T @ Q_R).square().sum(1)
    assert bool((var_R >= var_full - 1e-12).all())


@pytest.mark.parametrize("rank", [None, 3], ids=["no-compression", "R=3"])
def test_buffer_width(rank, generator):
    """B ≤ R + j_max with compression; B = total iterations J without (§3.5, §15.10). (A step
    the line search rejects continues its solve, so there B may pass R + j_max; off here.)"""
    lik, x, y, _ = make_problem("poisson", generator)
    model = IterNCGP(problem_kernel(x, lik), lik, recycling=Recycling(rank=rank),
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
    lik, x, _, _ = make_problem("poisson", generator)
    model = small_model(lik, x)
    K = dense_posterior(model, x)
    lam, V = torch.linalg.eigh(K)
    S = V[:, [1, 4, 7, 11]].reshape(1, x.shape[0], 4)
    problem = RegressionProblem(torch.zeros(1, x.shape[0]), None, lambda V: 0 * V)
    empty = empty_belief(problem.b)
    previous = Belief(S, (K @ flat(S)).reshape(S.shape), empty.A, empty.a)
    Q = flat(virtual_solver_run(previous, problem, Recycling()).Q)
    trace = torch.trace(K - K @ Q @ Q.T @ K)
    uncovered = lam.sum() - lam[[1, 4, 7, 11]].sum()
    torch.testing.assert_close(trace, uncovered, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["poisson", "bernoulli"])
def test_recycling_with_one_iteration_per_step_reaches_the_mode(name, generator):
    """§15.17: with recycling, R = ∞ and j ≤ 1 the outer loop converges to f_MAP."""
    lik, x, y, _ = make_problem(name, generator)
    model = small_model(lik, x, stopping=Stopping(max_iterations=1, outer_rtol=1e-12,
                                             max_newton_steps=300, atol=0.0, rtol=0.0))
    state = model.condition(x, y)
    f_map = laplace_mode(dense_posterior(model, x), lik, y, 0.0, state.f.shape)
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
    damped = small_model(lik, x, stopping=stopping).condition(x, y)
    psi = [float(lik.log_prob(torch.zeros(1, 10), y).sum())]  # Ψ(f_0 = m = 0)
    psi += [step.log_joint for step in damped.trace]
    assert all(b >= a - 1e-9 for a, b in zip(psi, psi[1:], strict=False))
    assert any(step.step_size < 1 for step in damped.trace) and damped.converged
    f_map = laplace_mode(dense_posterior(small_model(lik, x), x), lik, y, 0.0, damped.f.shape)
    torch.testing.assert_close(damped.f, f_map, rtol=1e-7, atol=1e-7)
    full = IterNCGP(problem_kernel(x, lik), lik, stopping=stopping,
                    line_search=False).condition(x, y)
    assert all(step.step_size == 1.0 for step in full.trace)
    assert full.trace[0].log_joint < psi[0]


def test_line_search_with_random_actions_still_reaches_the_mode(generator):
    """Random actions give poor Newton directions; with the line search (damping, or rejection
    and a longer solve of the same problem) Ψ never decreases and the mode is reached."""
    lik, x, y, _ = make_problem("bernoulli", generator)
    stopping = Stopping(max_iterations=2, outer_rtol=1e-10, max_newton_steps=200, atol=0.0,
                        rtol=0.0)
    state = small_model(lik, x, policy=RandomPolicy(3), stopping=stopping).condition(x, y)
    psi = [float(lik.log_prob(torch.zeros(1, x.shape[0]), y).sum())]
    psi += [step.log_joint for step in state.trace]
    assert all(b >= a - 1e-9 for a, b in zip(psi, psi[1:], strict=False))
    f_map = laplace_mode(dense_posterior(small_model(lik, x), x), lik, y, 0.0, state.f.shape)
    torch.testing.assert_close(state.f, f_map, rtol=1e-7, atol=1e-7)


# -- stopping rules --------------------------------------------------------------------------------
def test_outer_stopping_rule(generator):
    """Outer loop stops at the first step with ‖g_{i+1} − g_i‖/‖g_{i+1}‖ ≤ δ (§B.2)."""
    lik, x, y, _ = make_problem("poisson", generator)
    state = small_model(lik, x, stopping=Stopping(outer_rtol=0.01)).condition(x, y)
    changes = [step.relative_change for step in state.trace]
    assert state.converged and changes[-1] <= 0.01 and all(c > 0.01 for c in changes[:-1])


def test_inner_stopping_rules(generator):
    """The inner loop stops when ‖r_j‖ < max(δ_abs, δ_rel‖b‖) or at j_max (§B.2)."""
    lik, x, y, _ = make_problem("poisson", generator)
    model = small_model(lik, x)
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
    _, x, y, x_test = make_problem("gaussian", generator)
    model = IterNCGP(problem_kernel(x, Gaussian()), _NegativeNoise())
    state = model.condition(x, y)
    assert state.trace[0].stopped == "eta" and state.S.shape[-1] == 0
    mean, var = model.latent_marginals(state, x_test)
    assert bool(torch.isfinite(mean).all() and torch.isfinite(var).all())


def test_repeated_action_is_rejected(generator):
    """An action already in span(S) gives η at round-off level: rejected, not buffered."""
    lik, x, y, _ = make_problem("poisson", generator)
    model = small_model(lik, x)
    fixed = torch.randn(1, x.shape[0], generator=generator)
    belief = solve(model.regression_problem(x, y, torch.zeros(1, x.shape[0])),
                   empty_belief(fixed), lambda step: fixed, Stopping(max_iterations=5))
    assert belief.stopped == "eta" and belief.rank == 1


# -- loss and predictive ---------------------------------------------------------------------------
def test_loss_is_negative_log_joint_per_datum(generator):
    """loss = −Ψ(f)/n (up to a constant) = ½(f − m)ᵀK⁻¹(f − m)/n − mean log p(y | f)."""
    lik, x, y, _ = make_problem("poisson", generator)
    model = small_model(lik, x, prior_mean=0.5, lengthscale=0.2)
    state = model.condition(x, y)
    K = dense_posterior(model, x)
    g = flat(state.f) - 0.5
    expected = 0.5 * g @ torch.linalg.solve(K, g) / 12 - lik.log_prob(state.f, y).mean()
    torch.testing.assert_close(model.loss(state), expected, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(model.loss(state), model.prior_term(state) - model.log_lik(state),
                               **EXACT)


@pytest.mark.parametrize("name", ["bernoulli", "softmax", "poisson"])
def test_conditioning_with_the_held_kernel_matrix_equals_matrix_free(name, generator,
                                                                     monkeypatch):
    """Where K(X, X) fits in memory, one conditioning computes it once and multiplies by it
    (no kernel evaluations per solver iteration); the iterate, the weights and the precision
    root equal the matrix-free conditioning's, and a kernel with one GP per class (or no room)
    stays matrix-free."""
    import gpscale.methods.iterncgp.latent as latent
    from gpscale.methods.iterncgp.latent import LatentKernel

    lik, x, y, _ = make_problem(name, generator)
    calls = {"n": 0}
    matmul = LatentKernel.matmul

    def counting(self, x1, x2, V):
        calls["n"] += 1
        return matmul(self, x1, x2, V)

    monkeypatch.setattr(LatentKernel, "matmul", counting)
    held = small_model(lik, x).condition(x, y)
    held_calls, calls["n"] = calls["n"], 0
    monkeypatch.setattr(latent, "dense_operator_limit", lambda device=None: 0)
    free = small_model(lik, x).condition(x, y)
    assert held_calls == 0 < calls["n"]  # one product per solver iteration, matrix-free
    for a, b in ((held.f, free.f), (held.v, free.v), (held.Q, free.Q)):  # rounding apart
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    monkeypatch.undo()
    per_class = LatentKernel(problem_kernel(x, lik, shared=False), lik.num_latents)
    if lik.num_latents > 1:
        monkeypatch.setattr(LatentKernel, "matmul", counting)
        calls["n"] = 0
        per_class.training_matmul(x)(torch.ones(lik.num_latents, x.shape[0], 1))
        assert calls["n"] == 1


def test_buffers_grow_in_place_without_touching_earlier_beliefs(generator):
    """S and T grow into spare room in place (no copy per action), yet a belief that two solves
    branch from keeps its buffers, and the first branch keeps its own when the second writes
    where the first did: each equals the same solve with fresh buffers, T = K S throughout."""
    lik, x, y, _ = make_problem("bernoulli", generator)
    model = small_model(lik, x)
    K = dense_posterior(model, x)
    m = torch.zeros(1, x.shape[0])
    stop = Stopping(max_iterations=3, atol=0.0, rtol=0.0)
    problem = model.regression_problem(x, y, m)
    root = solve(problem, empty_belief(m), IterativeResidualPolicy(), stop)
    root = replace(root, iteration=0, stopped=None)  # three more iterations from here
    grown = solve(problem, root, IterativeResidualPolicy(), stop)
    assert grown.S.data_ptr() == root.S.data_ptr()  # the same storage: appended in place
    saved = root.S.clone(), root.T.clone()
    other = model.regression_problem(x, y, m + 0.5)  # a second branch from root
    first = solve(other, root, RandomPolicy(1), stop)
    first_S = first.S.clone()
    second = solve(other, root, RandomPolicy(2), stop)
    assert torch.equal(root.S, saved[0]) and torch.equal(root.T, saved[1])
    assert torch.equal(first.S, first_S)
    assert not torch.equal(first.S, second.S)
    fresh = replace(root, S=root.S.clone(), T=root.T.clone(), room=None)
    torch.testing.assert_close(second.S, solve(other, fresh, RandomPolicy(2), stop).S)
    for belief in (root, grown, first, second):
        torch.testing.assert_close(flat(belief.T), K @ flat(belief.S))


def test_trust_radius_bounds_every_step_and_still_reaches_the_mode(generator):
    """With ``max_step`` no Newton step moves a latent value by more than the radius (the full
    step from f_0 = 0 to counts around 50 would move log-rates by ~4), Ψ never decreases, and
    the mode is the dense one."""
    lik, x, y = _large_counts(generator)
    stopping = Stopping(max_iterations=10, outer_rtol=1e-10, max_newton_steps=100)
    iterates = [torch.zeros(1, 10, dtype=x.dtype)]
    model = IterNCGP(problem_kernel(x, lik), lik, stopping=stopping, max_step=0.5)
    state = model.condition(x, y, on_step=lambda s: iterates.append(s.f.clone()))
    moves = [float((b - a).abs().max()) for a, b in zip(iterates, iterates[1:], strict=False)]
    assert max(moves) <= 0.5 + 1e-12 and sum(m > 0.49 for m in moves) >= 4
    psi = [step.log_joint for step in state.trace]
    assert all(b >= a - 1e-9 for a, b in zip(psi, psi[1:], strict=False))
    f_map = laplace_mode(dense_posterior(small_model(lik, x), x), lik, y, 0.0, state.f.shape)
    assert state.converged
    torch.testing.assert_close(state.f, f_map, rtol=1e-7, atol=1e-7)


def test_newton_step_size_starts_inside_the_trust_radius():
    """α₀ = max_step/‖Δf‖∞ when the full step is longer, then halvings; 0 when none helps."""
    tried = []

    def concave(alpha: float) -> torch.Tensor:  # Ψ rises up to α = 0.3, then falls
        tried.append(alpha)
        return torch.tensor(-(alpha - 0.3) ** 2)

    assert newton_step_size(concave, 2.0, None) == 0.5  # 1 is worse than 0, ½ is not
    tried.clear()
    assert newton_step_size(concave, 10.0, 4.0) == 0.4 and tried == [0.0, 0.4]
    assert newton_step_size(concave, 1.0, 4.0) == 0.5  # a short step is not stretched
    assert newton_step_size(lambda a: torch.tensor(-a), 1.0, None) == 0.0
    with pytest.raises(ValueError, match="max_step"):
        IterNCGP(problem_kernel(torch.zeros(3, 1), Poisson()), Poisson(), max_step=0.0)
