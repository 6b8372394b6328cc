"""SOLVE-GP (notes/004 §6): every identity against dense float64 formulas (torch.linalg)."""

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
from gpscale.methods._solvegp_parts import (
    cholesky_and_inverse,
    gram,
    kernel_matrix_fused,
    mean_and_quadratic,
)
from gpscale.methods.solvegp import (
    build_solvegp,
    collapsed_bound,
    gauss_hermite,
    kl_whitened,
    optimal_q_u,
    optimal_q_v,
)
from gpscale.training import FitConfig, fit

N, D = 48, 2
HYPER = {"lengthscale": 0.6, "outputscale": 1.3, "noise": 0.05, "mean_constant": 0.2}
JITTER = 1e-10  # tiny, so that the bounds compare with exact (unjittered) dense quantities
TOL = {"rtol": 1e-7, "atol": 1e-9}


@pytest.fixture(autouse=True)
def _one_thread():
    """These problems are tiny: one thread avoids thread-pool contention on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data(n: int = N, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, D, generator=g) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.5 * torch.cos(x[:, 1]) + 0.1 * torch.randn(n, generator=g)
    return x, y


def _model(x, y, M=6, M2=5, **kw):
    return build_solvegp(D, init=(x, y), num_inducing=M, num_orthogonal=M2,
                         **{"jitter": JITTER, **HYPER, **kw})


def _randomise_q(model, seed: int = 1):
    """Random q(u), q(v⊥): means N(0, 1), Cholesky factors with entries ~0.3 and diag ≥ 0.5."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (model.q_mean_u, model.q_mean_v):
            p.copy_(torch.randn(p.shape, generator=g))
        for p in (model.q_chol_u, model.q_chol_v):
            if p is not None:
                L = torch.tril(torch.randn(p.shape, generator=g)) * 0.3
                L.diagonal(dim1=-2, dim2=-1).copy_(L.diagonal(dim1=-2, dim2=-1).abs() + 0.5)
                p.copy_(L)
    return model


def _gaussian_logpdf(y, mean, cov):
    return torch.distributions.MultivariateNormal(mean, cov).log_prob(y)


class Dense:
    """Eqs. (31)–(38), (3), (9), (28)–(30) densely for one model's prior on inputs x."""

    def __init__(self, model, x):
        with torch.no_grad():
            def k(a, b):
                return kernel_matrix(model.kernel, a, b)
            z, o = model.inducing_points[0], model.orthogonal_points[0]
            J = model._jitter()
            self.Kuu = k(z, z) + J * torch.eye(z.shape[0])
            Kuv, Kvv = k(z, o), k(o, o)
            self.Kuf, self.Kff = k(z, x), k(x, x)
            solve = torch.linalg.solve
            self.Cvv = Kvv - Kuv.T @ solve(self.Kuu, Kuv) + J * torch.eye(o.shape[0])
            self.Cvf = k(o, x) - Kuv.T @ solve(self.Kuu, self.Kuf)
            self.Qff = self.Kuf.T @ solve(self.Kuu, self.Kuf)
            self.Cff = self.Kff - self.Qff
            w = torch.cat([z, o])
            Kwf = k(w, x)
            self.Qff_union = Kwf.T @ solve(k(w, w) + J * torch.eye(w.shape[0]), Kwf)
            self.mu0 = float(model.mean.constant)
            self.noise = float(model.noise) if model.task == "regression" else None
        self.n = x.shape[0]

    def q(self, model):
        """The model's (m_u, S_u, m_v, S_v) in unwhitened coordinates."""
        with torch.no_grad():
            m_u, L_u = model.q_mean_u[0], torch.tril(model.q_chol_u[0])
            m_v = model.q_mean_v[0]
            L_v = (torch.tril(model.q_chol_v[0]) if model.q_chol_v is not None
                   else torch.linalg.cholesky(self.Cvv))
            if model.whiten:
                L0u, L0v = torch.linalg.cholesky(self.Kuu), torch.linalg.cholesky(self.Cvv)
                m_u, L_u, m_v = L0u @ m_u, L0u @ L_u, L0v @ m_v
                if model.q_chol_v is not None:
                    L_v = L0v @ L_v
        return m_u, L_u @ L_u.T, m_v, L_v @ L_v.T

    def marginals(self, m_u, S_u, m_v, S_v):
        """Eqs. (33)–(34) / (37)–(38): mean and full covariance."""
        Au = torch.linalg.solve(self.Kuu, self.Kuf)
        Bv = torch.linalg.solve(self.Cvv, self.Cvf)
        mean = self.mu0 + Au.T @ m_u + Bv.T @ m_v
        return mean, Au.T @ S_u @ Au + self.Cff + Bv.T @ (S_v - self.Cvv) @ Bv

    @staticmethod
    def kl(m, S, K):
        """KL[N(m, S) ‖ N(0, K)], Eqs. (35)–(36)."""
        return 0.5 * (torch.logdet(K) - torch.logdet(S) - m.shape[0]
                      + torch.trace(torch.linalg.solve(K, S)) + m @ torch.linalg.solve(K, m))

    def elbo(self, y, m_u, S_u, m_v, S_v):
        """Eq. (31) with the Gaussian closed form."""
        mean, cov = self.marginals(m_u, S_u, m_v, S_v)
        s2 = self.noise
        ell = (-0.5 * math.log(2 * math.pi * s2) - 0.5 * ((y - mean) ** 2 + cov.diagonal()) / s2)
        return ell.sum() - self.kl(m_u, S_u, self.Kuu) - self.kl(m_v, S_v, self.Cvv)

    def svgp_elbo(self, y, m_u, S_u):
        """Hensman et al.'s SVGP ELBO, Eq. (2)."""
        Au = torch.linalg.solve(self.Kuu, self.Kuf)
        mean = self.mu0 + Au.T @ m_u
        var = (Au.T @ S_u @ Au + self.Cff).diagonal()
        s2 = self.noise
        ell = -0.5 * math.log(2 * math.pi * s2) - 0.5 * ((y - mean) ** 2 + var) / s2
        return ell.sum() - self.kl(m_u, S_u, self.Kuu)

    def titsias(self, y, Q=None):
        """Eq. (3) for the Nyström matrix Q (default Q_ff on Z)."""
        Q = self.Qff if Q is None else Q
        eye = torch.eye(self.n)
        return (_gaussian_logpdf(y, torch.full_like(y, self.mu0), Q + self.noise * eye)
                - 0.5 / self.noise * torch.trace(self.Kff - Q))

    def collapsed(self, y, m_v, S_v):
        """Eq. (9)."""
        Bv = torch.linalg.solve(self.Cvv, self.Cvf)
        S_f = self.Cff + Bv.T @ (S_v - self.Cvv) @ Bv
        cov = self.Qff + self.noise * torch.eye(self.n)
        return (_gaussian_logpdf(y, self.mu0 + Bv.T @ m_v, cov)
                - 0.5 / self.noise * torch.trace(S_f) - self.kl(m_v, S_v, self.Cvv))

    def optimal_q_v(self, y):
        """Eqs. (28)–(29)."""
        A = self.Qff + self.noise * torch.eye(self.n)
        r = y - self.mu0
        CAi = torch.linalg.solve(A, self.Cvf.T).T  # C_vf A⁻¹
        m_v = self.Cvv @ torch.linalg.solve(self.Cvv + CAi @ self.Cvf.T, CAi @ r)
        S_v = self.Cvv @ torch.linalg.solve(self.Cvv + self.Cvf @ self.Cvf.T / self.noise,
                                            self.Cvv)
        return m_v, S_v

    def log_marginal(self, y):
        return _gaussian_logpdf(y, torch.full_like(y, self.mu0),
                                self.Kff + self.noise * torch.eye(self.n))


def _state_terms(model, x, y):
    state = model.condition(x, y)
    return state, model.projections(state.factors, x)


# -- Alg. 1 and the ELBO -----------------------------------------------------------------------
@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
def test_algorithm_1_matches_eqs_33_to_36(whiten):
    """Prop. 8: Alg. 1's μ, σ² and Compute_KL equal the direct formulas (33)–(36)."""
    x, y = _data()
    model = _randomise_q(_model(x, y, whiten=whiten))
    dense = Dense(model, x)
    m_u, S_u, m_v, S_v = dense.q(model)
    with torch.no_grad():
        state, proj = _state_terms(model, x, y)
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
    x, y = _data()
    model = _randomise_q(_model(x, y, whiten=whiten))
    dense = Dense(model, x)
    with torch.no_grad():
        loss = model.loss(model.condition(x, y))
    torch.testing.assert_close(-loss * N, dense.elbo(y, *dense.q(model)), rtol=1e-8, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prior_q_v_gives_the_svgp_elbo_for_any_o(seed):
    """Prop. 1: with q(v⊥) = p⊥(v⊥) the ELBO is SVGP's (Eq. 2) for any O, and KL_v = 0."""
    x, y = _data()
    model = _randomise_q(_model(x, y))
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
    x, y = _data()
    model = _randomise_q(_model(x, y, M=6, M2=num_orthogonal))
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
    x, y = _data()
    white = _randomise_q(_model(x, y))
    plain = _model(x, y, whiten=False)
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
    x, y = _data()
    model = _model(x, y, whiten=False)
    with torch.no_grad():
        torch.testing.assert_close(model.kl(model.condition(x, y)), torch.tensor(0.0),
                                   rtol=0, atol=1e-10)


def test_odvgp_special_case():
    """Prop. 6: orthogonal_q='mean' is S_v = C_vv (no covariance parameter); its collapsed
    bound Eq. (9) equals Eq. (10)."""
    x, y = _data()
    full = _randomise_q(_model(x, y))
    odvgp = _model(x, y, orthogonal_q="mean")
    assert odvgp.q_chol_v is None
    with torch.no_grad():
        for name in ("q_mean_u", "q_chol_u", "q_mean_v"):
            getattr(odvgp, name).copy_(getattr(full, name))
        full.q_chol_v.copy_(torch.eye(full.q_chol_v.shape[-1]))
        torch.testing.assert_close(odvgp.loss(odvgp.condition(x, y)),
                                   full.loss(full.condition(x, y)), **TOL)
        state, proj = _state_terms(odvgp, x, y)
        r = y - odvgp.mean.constant
        eq9 = collapsed_bound(proj, r, odvgp.noise, state.q.mean_v, state.q.chol_v)
    dense = Dense(odvgp, x)
    m_v = dense.q(odvgp)[2]
    Bv = torch.linalg.solve(dense.Cvv, dense.Cvf)
    eq10 = (_gaussian_logpdf(y, dense.mu0 + Bv.T @ m_v, dense.Qff + dense.noise * torch.eye(N))
            - 0.5 / dense.noise * torch.trace(dense.Cff)
            - 0.5 * m_v @ torch.linalg.solve(dense.Cvv, m_v))
    torch.testing.assert_close(eq9, eq10, rtol=1e-8, atol=1e-7)


def test_residual_process_vanishes_at_z():
    """Prop. 10: c(x, x) = k(x, x) − ‖L_u⁰⁻¹k(Z, x)‖² ≥ 0 and c(z_j, z_j) ≈ 0."""
    x, y = _data()
    model = _model(x, y)
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
    x, y = _data()
    model = _model(x, y)
    with torch.no_grad():
        _, proj = _state_terms(model, x, y)
        M2 = proj.D.shape[1]
        value = collapsed_bound(proj, y - model.mean.constant, model.noise,
                                torch.zeros(1, M2), torch.eye(M2)[None])
    torch.testing.assert_close(value, Dense(model, x).titsias(y), rtol=1e-8, atol=1e-7)


def test_collapsed_bound_matches_eq_9_for_any_q_v():
    """Eq. (9) by Woodbury equals the dense Eq. (9) at a random q(v⊥)."""
    x, y = _data()
    model = _randomise_q(_model(x, y))
    dense = Dense(model, x)
    with torch.no_grad():
        state, proj = _state_terms(model, x, y)
        value = collapsed_bound(proj, y - model.mean.constant, model.noise, state.q.mean_v,
                                state.q.chol_v)
    _, _, m_v, S_v = dense.q(model)
    torch.testing.assert_close(value, dense.collapsed(y, m_v, S_v), rtol=1e-8, atol=1e-7)


def test_collapsing_q_u_is_exact():
    """Prop. 3: Eq. (8) at the optimal q(u) for a given q(v⊥) equals Eq. (9)."""
    x, y = _data()
    model = _randomise_q(_model(x, y))
    with torch.no_grad():
        state, proj = _state_terms(model, x, y)
        r = y - model.mean.constant
        mean_u, chol_u = optimal_q_u(proj, r, model.noise, state.q.mean_v)
        model.q_mean_u.copy_(mean_u)
        model.q_chol_u.copy_(chol_u)
        elbo = -model.loss(model.condition(x, y)) * N
        eq9 = collapsed_bound(proj, r, model.noise, state.q.mean_v, state.q.chol_v)
    torch.testing.assert_close(elbo, eq9, rtol=1e-8, atol=1e-7)


def test_optimal_q_v_is_eqs_28_29_and_a_maximum():
    """Prop. 4: the whitened optimum maps to Eqs. (28)–(29); perturbing it lowers Eq. (9)."""
    x, y = _data()
    model = _model(x, y)
    dense = Dense(model, x)
    with torch.no_grad():
        _, proj = _state_terms(model, x, y)
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
    x, y = _data(seed=seed)
    model = _randomise_q(_model(x, y, objective="collapsed"), seed=seed)
    dense = Dense(model, x)
    with torch.no_grad():
        eq30 = model.condition(x, y).bound
        elbo = -_randomise_q(_model(x, y), seed=seed).loss(model.condition(x, y)) * N
    titsias, union = dense.titsias(y), dense.titsias(y, dense.Qff_union)
    exact = dense.log_marginal(y)
    assert titsias <= eq30 <= union <= exact, (titsias, eq30, union, exact)
    assert elbo <= exact


def test_collapsed_objective_loss_and_prediction():
    """objective='collapsed': loss = −Eq. (30)/n, = −(uncollapsed ELBO at q*)/n; predictions use
    q*, and the uncollapsed terms at q* reproduce the bound."""
    x, y = _data()
    model = _model(x, y, objective="collapsed")
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
    x, y = _data()
    model = _randomise_q(_model(x, y, whiten=whiten))
    x_test = torch.rand(13, D, generator=torch.Generator().manual_seed(5)) * 5 - 2.5
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x_test, chunk_size=5)
    dense = Dense(model, x_test)
    mean, cov = dense.marginals(*dense.q(model))
    torch.testing.assert_close(pred.mean, mean, **TOL)
    torch.testing.assert_close(pred.variance, cov.diagonal(), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(pred.noise, torch.tensor(HYPER["noise"]), rtol=1e-6, atol=0)


# -- minibatches and gradients -------------------------------------------------------------------
@pytest.mark.parametrize("task", ["regression", "binary"])
def test_minibatch_losses_are_unbiased(task):
    """Prop. 12: the minibatch losses of a partition average to the full loss (so a uniformly
    drawn batch of the partition is an unbiased estimate)."""
    x, y = _data()
    kw = {}
    if task == "binary":
        y, kw = (y > 0).double(), {"task": "classification"}
        kw.update({k: v for k, v in HYPER.items() if k != "noise"})
        model = _randomise_q(build_solvegp(D, init=(x, y), num_inducing=6, num_orthogonal=5,
                                           jitter=JITTER, **kw))
    else:
        model = _randomise_q(_model(x, y))
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model.loss(model.condition(x, y))
        parts = [model.loss(model.condition(x[i], y[i])) for i in perm.split(12)]
    torch.testing.assert_close(torch.stack(parts).mean(), full, rtol=1e-10, atol=1e-12)


def test_gradients_reach_every_parameter():
    """Prop. 12: gradients flow to Z, O, the hyperparameters and all variational parameters."""
    x, y = _data()
    model = _randomise_q(_model(x, y))
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
    x, y = _data(n=10)
    wrapper = _Loss(_randomise_q(_model(x, y, M=3, M2=3, jitter=1e-6)))
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
    x, y = _data(n=10)
    wrapper = _Loss(_randomise_q(_model(x, y, M=3, M2=3, jitter=1e-6)))
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
    the ARD lengthscales and the outputscale (Matérn-½ falls back to GPyTorch)."""
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
    for fn in (kernel_matrix, kernel_matrix_fused):
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
    x, y = _data(n=300)
    results = []
    for dtype in (torch.float64, torch.float32):
        model = _randomise_q(build_solvegp(D, init=(x.to(dtype), y.to(dtype)), num_inducing=20,
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
    x, y = _data()
    yb = (y > 0).double()
    model = _randomise_q(build_solvegp(D, task="classification", init=(x, yb), num_inducing=6,
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
    x, y = _data()
    yc = torch.bucketize(y.contiguous(), torch.tensor([-0.5, 0.5]))
    model = _randomise_q(build_solvegp(D, task="classification", init=(x, yc), num_inducing=6,
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
    x, y = _data()
    yb = (y > 0).double()
    model = _randomise_q(build_solvegp(D, task="classification", init=(x, yb), num_inducing=6,
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
    x, y = _data()
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
    x, y = _data(n=200)
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
    x, y = _data(n=150)
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
    assert spec.fit_defaults == {"optimizer": "adam", "lr": 0.01, "epochs": 50,
                                 "batch_size": 1024, "dtype": "float32"}


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
    x, y = _data()
    task = "regression" if kind == "regression" else "classification"
    if kind == "binary":
        y = (y > 0).double()
    elif kind == "3class":
        y = torch.bucketize(y.contiguous(), torch.tensor([-0.5, 0.5]))
    model = _randomise_q(build("solvegp", D, task=task, init=(x, y), num_inducing=6,
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
    x, y = _data()
    with pytest.raises(ValueError, match=match):
        build_solvegp(D, init=(x, y), **{"num_inducing": 6, "num_orthogonal": 4, **options})


def test_bad_inputs_raise():
    x, y = _data()
    yb = (y > 0).double()
    with pytest.raises(ValueError, match="collapsed"):
        build_solvegp(D, task="classification", init=(x, yb), num_inducing=4, num_orthogonal=4,
                      objective="collapsed")
    with pytest.raises(ValueError, match="num_data"):
        build_solvegp(D, init=None, num_inducing=4, num_orthogonal=4)
    model = _model(x, y, objective="collapsed")
    with pytest.raises(ValueError, match="full-batch"):
        model.loss(model.condition(x[:10], y[:10]))
    with pytest.raises(ValueError, match="condition"):
        model.predict(None, x[:3])
    with pytest.raises(ValueError, match="features"):
        _model(x, y).predict(None, torch.zeros(3, D + 1))
    with pytest.raises(ValueError, match="NaN"):
        _model(x, y).condition(torch.full((4, D), float("nan")), torch.zeros(4))
