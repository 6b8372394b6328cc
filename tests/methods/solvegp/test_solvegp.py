"""SOLVE-GP (notes/004 §6): Alg. 1, the ELBO, the collapsed bound and the predictive against dense
float64 formulas (torch.linalg)."""

from __future__ import annotations

import pytest
import torch

import gpscale.methods.solvegp  # noqa: F401  (registers the key)
from gpscale.methods import build
from gpscale.methods.solvegp import (
    collapsed_bound,
    kl_whitened,
    optimal_q_u,
    optimal_q_v,
)

from ._dense import (
    HYPER,
    JITTER,
    TOL,
    D,
    Dense,
    N,
    gaussian_logpdf,
    randomise_q,
    small_model,
    state_terms,
    toy_data,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems


# -- Alg. 1 and the ELBO -----------------------------------------------------------------------
@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
def test_algorithm_1_matches_eqs_33_to_36(whiten):
    """Prop. 8: Alg. 1's μ, σ² and Compute_KL equal the direct formulas (33)–(36)."""
    x, y = toy_data()
    model = randomise_q(small_model(x, y, whiten=whiten))
    dense = Dense(model, x)
    m_u, S_u, m_v, S_v = dense.q(model)
    with torch.no_grad():
        state, proj = state_terms(model, x, y)
        mean, var = model.marginals(state.q, proj)
        kl_u = kl_whitened(state.q.mean_u, state.q.chol_u).sum()
        kl_v = kl_whitened(state.q.mean_v, state.q.chol_v).sum()
    mean_d, cov_d = dense.marginals(m_u, S_u, m_v, S_v)
    torch.testing.assert_close(mean[0], mean_d, **TOL)
    torch.testing.assert_close(var[0], cov_d.diagonal(), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(kl_u, dense.kl(m_u, S_u, dense.Kuu), rtol=1e-7, atol=1e-8)
    # Eq. (36) with M2 (the paper's "−M" is a typo, notes §5).
    torch.testing.assert_close(kl_v, dense.kl(m_v, S_v, dense.Cvv), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
def test_loss_is_negative_eq_31_per_datum(whiten):
    """loss = −ELBO(8)/N on the full data (N = n)."""
    x, y = toy_data()
    model = randomise_q(small_model(x, y, whiten=whiten))
    dense = Dense(model, x)
    with torch.no_grad():
        loss = model.loss(model.condition(x, y))
    torch.testing.assert_close(-loss * N, dense.elbo(y, *dense.q(model)), rtol=1e-8, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prior_q_v_gives_the_svgp_elbo_for_any_o(seed):
    """Prop. 1: with q(v⊥) = p⊥(v⊥) the ELBO is SVGP's (Eq. 2) for any O, and KL_v = 0."""
    x, y = toy_data()
    model = randomise_q(small_model(x, y))
    g = torch.Generator().manual_seed(10 + seed)
    with torch.no_grad():
        model.orthogonal_points.copy_(torch.rand(model.orthogonal_points.shape, generator=g) * 4
                                      - 2)
        model.q_mean_v.zero_()
        model.q_chol_v.copy_(torch.eye(model.q_chol_v.shape[-1]))
        state = model.condition(x, y)
        loss = model.loss(state)
        kl_v = kl_whitened(state.q.mean_v, state.q.chol_v)
    dense = Dense(model, x)
    m_u, S_u, _, _ = dense.q(model)
    torch.testing.assert_close(kl_v, torch.zeros(1), rtol=0, atol=1e-12)
    torch.testing.assert_close(-loss * N, dense.svgp_elbo(y, m_u, S_u), rtol=1e-8, atol=1e-7)


@pytest.mark.parametrize("num_orthogonal", [0, 4], ids=["M2=0", "q(v)=prior"])
def test_matches_gpytorch_svgp_elbo(num_orthogonal):
    """Prop. 1 against GPyTorch: the same Z, q(u) and hyperparameters give GPyTorch's SVGP loss."""
    x, y = toy_data()
    model = randomise_q(small_model(x, y, M=6, M2=num_orthogonal))
    with torch.no_grad():
        model.q_mean_v.zero_()
        model.q_chol_v.copy_(torch.eye(num_orthogonal))
    svgp = build("svgp", D, init=(x, y), num_inducing=6, variational_jitter_double=JITTER,
                 **HYPER)
    strategy = svgp.gp.variational_strategy
    with torch.no_grad():
        strategy.inducing_points.copy_(model.inducing_points[0])
        q = strategy._variational_distribution
        q.variational_mean.copy_(model.q_mean_u[0])
        q.chol_variational_covar.copy_(model.q_chol_u[0])
        ours = model.loss(model.condition(x, y))
        theirs = svgp.loss(svgp.condition(x, y))
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-8)


def test_whitened_and_unwhitened_agree():
    """Prop. 11: mapping m → L⁰m, L → L⁰L gives the same ELBO and predictions."""
    x, y = toy_data()
    white = randomise_q(small_model(x, y))
    plain = small_model(x, y, whiten=False)
    with torch.no_grad():
        factors = white.factors()
        L0u, L0v = factors.chol_uu, factors.chol_vv
        plain.q_mean_u.copy_((L0u @ white.q_mean_u[..., None])[..., 0])
        plain.q_chol_u.copy_(L0u @ white.q_chol_u)
        plain.q_mean_v.copy_((L0v @ white.q_mean_v[..., None])[..., 0])
        plain.q_chol_v.copy_(L0v @ white.q_chol_v)
        x_test = torch.rand(9, D) * 4 - 2
        pw, pp = white.predict(None, x_test), plain.predict(None, x_test)
        lw, lp = white.loss(white.condition(x, y)), plain.loss(plain.condition(x, y))
    torch.testing.assert_close(lw, lp, **TOL)
    torch.testing.assert_close(pw.mean, pp.mean, **TOL)
    torch.testing.assert_close(pw.variance, pp.variance, **TOL)


def test_unwhitened_starts_at_the_prior():
    """App. G: q starts at the prior, L_u = L_u⁰ and L_v = L_v⁰, so KL_u = KL_v = 0."""
    x, y = toy_data()
    model = small_model(x, y, whiten=False)
    with torch.no_grad():
        torch.testing.assert_close(model.kl(model.condition(x, y)), torch.tensor(0.0),
                                   rtol=0, atol=1e-10)


def test_odvgp_special_case():
    """Prop. 6: orthogonal_q='mean' is S_v = C_vv (no covariance parameter); its collapsed
    bound Eq. (9) equals Eq. (10)."""
    x, y = toy_data()
    full = randomise_q(small_model(x, y))
    odvgp = small_model(x, y, orthogonal_q="mean")
    assert odvgp.q_chol_v is None
    with torch.no_grad():
        for name in ("q_mean_u", "q_chol_u", "q_mean_v"):
            getattr(odvgp, name).copy_(getattr(full, name))
        full.q_chol_v.copy_(torch.eye(full.q_chol_v.shape[-1]))
        torch.testing.assert_close(odvgp.loss(odvgp.condition(x, y)),
                                   full.loss(full.condition(x, y)), **TOL)
        state, proj = state_terms(odvgp, x, y)
        r = y - odvgp.mean.constant
        eq9 = collapsed_bound(proj, r, odvgp.noise, state.q.mean_v, state.q.chol_v)
    dense = Dense(odvgp, x)
    m_v = dense.q(odvgp)[2]
    Bv = torch.linalg.solve(dense.Cvv, dense.Cvf)
    eq10 = (gaussian_logpdf(y, dense.mu0 + Bv.T @ m_v, dense.Qff + dense.noise * torch.eye(N))
            - 0.5 / dense.noise * torch.trace(dense.Cff)
            - 0.5 * m_v @ torch.linalg.solve(dense.Cvv, m_v))
    torch.testing.assert_close(eq9, eq10, rtol=1e-8, atol=1e-7)


def test_residual_process_vanishes_at_z():
    """Prop. 10: c(x, x) = k(x, x) − ‖L_u⁰⁻¹k(Z, x)‖² ≥ 0 and c(z_j, z_j) ≈ 0."""
    x, y = toy_data()
    model = small_model(x, y)
    with torch.no_grad():
        factors = model.factors()
        at_z = model.projections(factors, model.inducing_points[0])
        at_x = model.projections(factors, x)
        c_z = at_z.prior_var - at_z.B.square().sum(-2)
        c_x = at_x.prior_var - at_x.B.square().sum(-2)
    assert bool((c_x > -1e-10).all())
    torch.testing.assert_close(c_z, torch.zeros_like(c_z), rtol=0, atol=1e-8)


# -- the collapsed bound ---------------------------------------------------------------------------
def test_collapsed_bound_at_prior_q_v_is_titsias():
    """Prop. 2: Eq. (9) at q(v⊥) = p⊥(v⊥) equals the Titsias bound, Eq. (3)."""
    x, y = toy_data()
    model = small_model(x, y)
    with torch.no_grad():
        _, proj = state_terms(model, x, y)
        M2 = proj.D.shape[1]
        value = collapsed_bound(proj, y - model.mean.constant, model.noise,
                                torch.zeros(1, M2), torch.eye(M2)[None])
    torch.testing.assert_close(value, Dense(model, x).titsias(y), rtol=1e-8, atol=1e-7)


def test_collapsed_bound_matches_eq_9_for_any_q_v():
    """Eq. (9) by Woodbury equals the dense Eq. (9) at a random q(v⊥)."""
    x, y = toy_data()
    model = randomise_q(small_model(x, y))
    dense = Dense(model, x)
    with torch.no_grad():
        state, proj = state_terms(model, x, y)
        value = collapsed_bound(proj, y - model.mean.constant, model.noise, state.q.mean_v,
                                state.q.chol_v)
    _, _, m_v, S_v = dense.q(model)
    torch.testing.assert_close(value, dense.collapsed(y, m_v, S_v), rtol=1e-8, atol=1e-7)


def test_collapsing_q_u_is_exact():
    """Prop. 3: Eq. (8) at the optimal q(u) for a given q(v⊥) equals Eq. (9)."""
    x, y = toy_data()
    model = randomise_q(small_model(x, y))
    with torch.no_grad():
        state, proj = state_terms(model, x, y)
        r = y - model.mean.constant
        mean_u, chol_u = optimal_q_u(proj, r, model.noise, state.q.mean_v)
        model.q_mean_u.copy_(mean_u)
        model.q_chol_u.copy_(chol_u)
        elbo = -model.loss(model.condition(x, y)) * N
        eq9 = collapsed_bound(proj, r, model.noise, state.q.mean_v, state.q.chol_v)
    torch.testing.assert_close(elbo, eq9, rtol=1e-8, atol=1e-7)


def test_optimal_q_v_is_eqs_28_29_and_a_maximum():
    """Prop. 4: the whitened optimum maps to Eqs. (28)–(29); perturbing it lowers Eq. (9)."""
    x, y = toy_data()
    model = small_model(x, y)
    dense = Dense(model, x)
    with torch.no_grad():
        _, proj = state_terms(model, x, y)
        r = y - model.mean.constant
        mean_v, chol_v = optimal_q_v(proj, r, model.noise)
        best = collapsed_bound(proj, r, model.noise, mean_v, chol_v)
        g = torch.Generator().manual_seed(3)
        for _ in range(5):
            dm = 0.05 * torch.randn(mean_v.shape, generator=g)
            dL = 0.05 * torch.tril(torch.randn(chol_v.shape, generator=g))
            assert collapsed_bound(proj, r, model.noise, mean_v + dm, chol_v + dL) < best
    L0v = torch.linalg.cholesky(dense.Cvv)
    m_d, S_d = dense.optimal_q_v(y)
    torch.testing.assert_close(L0v @ mean_v[0], m_d, rtol=1e-6, atol=1e-8)
    S = L0v @ chol_v[0] @ chol_v[0].T @ L0v.T
    torch.testing.assert_close(S, S_d, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bound_ordering(seed):
    """Prop. 5: Titsias(Z) ≤ Eq. (30) ≤ Titsias(Z ∪ O) ≤ log p(y); any ELBO ≤ log p(y)."""
    x, y = toy_data(seed=seed)
    model = randomise_q(small_model(x, y, objective="collapsed"), seed=seed)
    dense = Dense(model, x)
    with torch.no_grad():
        eq30 = model.condition(x, y).bound
        elbo = -randomise_q(small_model(x, y), seed=seed).loss(model.condition(x, y)) * N
    titsias, union = dense.titsias(y), dense.titsias(y, dense.Qff_union)
    exact = dense.log_marginal(y)
    assert titsias <= eq30 <= union <= exact, (titsias, eq30, union, exact)
    assert elbo <= exact


def test_collapsed_objective_loss_and_prediction():
    """objective='collapsed': loss = −Eq. (30)/n, = −(uncollapsed ELBO at q*)/n; predictions use
    q*, and the uncollapsed terms at q* reproduce the bound."""
    x, y = toy_data()
    model = small_model(x, y, objective="collapsed")
    assert model.needs_data_for_prediction and not model.minibatch
    dense = Dense(model, x)
    with torch.no_grad():
        state = model.condition(x, y)
        loss = model.loss(state)
        terms = model.kl(state) - model.expected_log_lik(state)
    m_v, S_v = dense.optimal_q_v(y)
    torch.testing.assert_close(-loss * N, dense.collapsed(y, m_v, S_v), rtol=1e-8, atol=1e-7)
    torch.testing.assert_close(terms, loss, rtol=1e-8, atol=1e-9)


# -- predictive -----------------------------------------------------------------------------------
@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
def test_predictive_matches_eqs_37_38(whiten):
    """Eqs. (37)–(38) marginals at test inputs, plus σ² as the noise."""
    x, y = toy_data()
    model = randomise_q(small_model(x, y, whiten=whiten))
    x_test = torch.rand(13, D, generator=torch.Generator().manual_seed(5)) * 5 - 2.5
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x_test, chunk_size=5)
    dense = Dense(model, x_test)
    mean, cov = dense.marginals(*dense.q(model))
    torch.testing.assert_close(pred.mean, mean, **TOL)
    torch.testing.assert_close(pred.variance, cov.diagonal(), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(pred.noise, torch.tensor(HYPER["noise"]), rtol=1e-6, atol=0)


# -- the closed-form step after training (methods/solvegp/optimal.py) ------------------------------
def test_statistics_give_the_collapsed_bound_and_its_optimal_q():
    """From the streamed sums, q and Eq. (30) equal what ``objective='collapsed'`` computes
    from the full projections at the same σ²."""
    from gpscale.methods.solvegp.optimal import optimal_solve_q, solve_statistics

    x, y = toy_data()
    x, y = x.double(), y.double()
    model = small_model(x, y)
    collapsed = small_model(x, y, objective="collapsed")
    collapsed.load_state_dict(model.state_dict())
    with torch.no_grad():
        state = collapsed.condition(x, y)
        stats = solve_statistics(model, x, y, chunk_size=7)  # several chunks
        q = optimal_solve_q(stats, float(model.noise))
    torch.testing.assert_close(q["bound"] * x.shape[0], state.bound, rtol=1e-8, atol=1e-8)
    for name in ("mean_u", "chol_u", "mean_v", "chol_v"):
        torch.testing.assert_close(q[name], getattr(state.q, name)[0], rtol=1e-7, atol=1e-9)


def test_finalize_sets_q_and_the_noise_that_maximise_the_bound():
    """After ``finalize`` the minibatch ELBO on all rows equals Eq. (30) at a σ² where Eq. (30)
    is maximal, and is above the ELBO before; ``optimal_q=False`` changes nothing."""
    from gpscale.methods.solvegp.optimal import solve_bound, solve_statistics

    x, y = toy_data()
    x, y = x.double(), y.double()
    model = randomise_q(small_model(x, y))
    before = -float(model.loss(model.condition(x, y)).detach())
    changed = model.finalize(x, y)
    noise = float(model.noise.detach())
    assert changed == {"noise_trained": pytest.approx(HYPER["noise"]), "noise_calibrated": noise}
    elbo = -float(model.loss(model.condition(x, y)).detach())
    stats = solve_statistics(model, x, y)
    assert elbo == pytest.approx(solve_bound(stats, noise), rel=1e-7)
    assert elbo > before
    for factor in (0.97, 1.03):
        assert solve_bound(stats, noise * factor) < elbo
    off = small_model(x, y, optimal_q=False)
    assert off.finalize(x, y) is None and float(off.noise.detach()) == HYPER["noise"]
