"""CaGP (notes/001 §10): limit, loss and information-theoretic identities against dense float64
linear algebra (torch.linalg)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpscale.linalg.operators.block_sparse import BlockSparseActions
from gpscale.linalg.policies.residual import ResidualPolicy
from gpscale.linalg.solvers.cg import ConjugateGradient
from gpscale.methods import cagp

from ._dense import (
    HYPER,
    TOL,
    D,
    Dense,
    N,
    fixed_actions,
    gaussian_kl,
    opt_model,
    predict_dense,
    toy_data,
)

# --- limit identities -------------------------------------------------------------------------

@pytest.mark.parametrize("actions", ["block_k1", "dense"])
def test_full_rank_recovers_exact_gp(actions):
    """notes §10.1: i = n invertible actions give the exact posterior and ELBO = NLL."""
    x, y = toy_data()
    x_test, _ = toy_data(7, seed=1)
    model = opt_model(x, y, N)
    if actions == "dense":
        model = fixed_actions(model, torch.randn(N, N, generator=torch.Generator().manual_seed(3)))
    ref = Dense(model, x, y, x_test)
    pred = predict_dense(model, x, y, x_test)
    mean, var = ref.exact()
    torch.testing.assert_close(pred.mean, mean, **TOL)
    torch.testing.assert_close(pred.variance, var, rtol=1e-7, atol=1e-9)
    with torch.no_grad():
        torch.testing.assert_close(model.loss(model.condition(x, y)), ref.nll(), **TOL)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_actions=st.integers(1, N))
def test_variance_never_below_exact(seed, num_actions):
    """Prop. S1 / notes §10.2: K_i(x, x) ≥ K⋆(x, x) for any full-rank S."""
    x, y = toy_data()
    x_test, _ = toy_data(9, seed=1)
    base = opt_model(x, y, num_actions, seed=seed)
    S = torch.randn(N, num_actions, generator=torch.Generator().manual_seed(seed))
    _, exact_var = Dense(base, x, y, x_test).exact()
    for model in (base, fixed_actions(base, S)):
        assert bool((predict_dense(model, x, y, x_test).variance >= exact_var - 1e-10).all())


def test_variance_monotone_for_nested_actions():
    """Prop. S1 / notes §10.3: K_i ≥ K_j ≥ K⋆ for S_i the first i columns of S_j."""
    x, y = toy_data()
    x_test, _ = toy_data(9, seed=1)
    base = opt_model(x, y, 4)
    S = torch.randn(N, 30, generator=torch.Generator().manual_seed(5))
    variances = [predict_dense(fixed_actions(base, S[:, :i]), x, y, x_test).variance
                 for i in (3, 10, 30)]
    variances.append(Dense(base, x, y, x_test).exact()[1])
    for wide, narrow in zip(variances[:-1], variances[1:], strict=True):
        assert bool((wide >= narrow - 1e-10).all())


# --- the loss: two routes, one number -----------------------------------------------------------

@pytest.mark.parametrize("num_actions", [5, 13])
def test_elbo_gap_is_kl_to_exact_posterior(num_actions):
    """Eq. (10) / notes §10.4: ℓ_ELBO − ℓ_NLL = KL(q_i ‖ p⋆) ≥ 0 (all per datum)."""
    x, y = toy_data()
    model = opt_model(x, y, num_actions)
    ref = Dense(model, x, y)
    with torch.no_grad():
        state = model.condition(x, y)
        elbo = model.negative_elbo(state)
    S = state.actions.to_dense()
    C_exact = torch.linalg.inv(ref.Kh)
    post = (ref.mu + ref.K @ C_exact @ ref.r, ref.K - ref.K @ C_exact @ ref.K)
    gap = gaussian_kl(*ref.q(S), *post) / N
    torch.testing.assert_close(elbo - ref.nll(), gap, rtol=1e-6, atol=1e-9)
    assert float(gap.detach()) > 0


def test_elbo_terms_match_dense_expectation_and_kl():
    """Lemma S3 / notes §10.5: expected_log_lik = E_q[log p(y|f)]/n, kl = KL(q ‖ prior)/n."""
    x, y = toy_data()
    model = opt_model(x, y, 6)
    ref = Dense(model, x, y)
    with torch.no_grad():
        state = model.condition(x, y)
        ell, kl = model.expected_log_lik(state), model.kl(state)
    m, V = ref.q(state.actions.to_dense())
    dense_ell = -0.5 * ((ref.y - m).square().sum() / ref.noise + V.trace() / ref.noise
                        + N * math.log(2 * math.pi * ref.noise)) / N
    torch.testing.assert_close(ell, dense_ell, **TOL)
    torch.testing.assert_close(kl, gaussian_kl(m, V, ref.mu, ref.K) / N, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(model.loss(state), kl - ell, **TOL)


def test_projected_nll_equals_orthonormalised_form():
    """Eq. (9), Lemma S2 / notes §10.6: raw-S form = −log N(S'ᵀy; S'ᵀμ, S'ᵀK̂S')/n."""
    x, y = toy_data()
    model = opt_model(x, y, 7, objective="projected_nll")
    ref = Dense(model, x, y)
    with torch.no_grad():
        state = model.condition(x, y)
    S = state.actions.to_dense()
    S_orth = S @ torch.linalg.inv(torch.linalg.cholesky(S.T @ S)).T  # S' = S chol(SᵀS)^{-T}
    dist = torch.distributions.MultivariateNormal(S_orth.T @ ref.mu, S_orth.T @ ref.Kh @ S_orth)
    expected = -dist.log_prob(S_orth.T @ y) / N
    torch.testing.assert_close(model.projected_nll(state), expected, **TOL)
    torch.testing.assert_close(model.loss(state), expected, **TOL)


def test_lemma_s1_conditioning_on_projected_data():
    """Lemma S1 / notes §10.7: CaGP = exact conditioning of f(x⋄) on ỹ = S'ᵀy, noise σ²I."""
    x, y = toy_data()
    x_test, _ = toy_data(6, seed=1)
    model = opt_model(x, y, 9)
    ref = Dense(model, x, y, x_test)
    with torch.no_grad():
        S = model.condition(x, y).actions.to_dense()
    Q = torch.linalg.qr(S).Q  # orthonormal, same column space
    cov_yy = Q.T @ ref.K @ Q + ref.noise * torch.eye(9)
    cov_fy = ref.K_tx @ Q
    mean = ref.mu_t + cov_fy @ torch.linalg.solve(cov_yy, Q.T @ (y - ref.mu))
    var = ref.k_tt - (cov_fy @ torch.linalg.inv(cov_yy) * cov_fy).sum(1)
    pred = predict_dense(model, x, y, x_test)
    torch.testing.assert_close(pred.mean, mean, **TOL)
    torch.testing.assert_close(pred.variance, var, **TOL)


def _block_rescaled(model, scale):
    """The model's block-sparse actions with block j multiplied by scale[j]."""
    S = model.policy()
    factor = torch.repeat_interleave(scale, torch.tensor(S.layout.sizes()))
    return BlockSparseActions(S.values.detach() * factor, S.index, num_blocks=S.shape[-1])


@pytest.mark.parametrize("transform", ["rescale_blocks", "permute", "general"])
def test_column_space_invariance(transform):
    """Lemma S4, Cor. S1 / notes §10.8: posterior, ELBO and Eq. (9) unchanged by S → SW."""
    x, y = toy_data(50)  # i ∤ n: blocks of 6 and 7 points
    x_test, _ = toy_data(6, seed=1)
    base = opt_model(x, y, 8)
    g = torch.Generator().manual_seed(4)
    if transform == "rescale_blocks":  # through the block-sparse path: Σ log ‖s'_j‖²
        scales = torch.tensor([1e-3, 2, 5, 0.5, 1, 30, 7, 1.])
        other = fixed_actions(base, _block_rescaled(base, scales))
    else:
        S = base.policy().to_dense().detach()
        W = torch.eye(8)[torch.randperm(8, generator=g)] if transform == "permute" \
            else torch.randn(8, 8, generator=g)
        other = fixed_actions(base, S @ W)
    with torch.no_grad():
        a, b = base.condition(x, y), other.condition(x, y)
        for term in ("negative_elbo", "projected_nll"):
            torch.testing.assert_close(getattr(other, term)(b), getattr(base, term)(a), **TOL)
    pa, pb = predict_dense(base, x, y, x_test), predict_dense(other, x, y, x_test)
    torch.testing.assert_close(pb.mean, pa.mean, **TOL)
    torch.testing.assert_close(pb.variance, pa.variance, **TOL)


def test_iterative_equals_batch():
    """Alg. S1 = Alg. S2 / notes §10.9: the same C_i and v_i for the same actions."""
    x, y = toy_data()
    model = opt_model(x, y, 8)
    ref = Dense(model, x, y)
    S = torch.randn(N, 8, generator=torch.Generator().manual_seed(2))
    it = cagp.iterative_posterior(ref.Kh.matmul, ref.r, lambda j, res: S[:, j], 8)
    C = it.directions @ it.directions.T
    torch.testing.assert_close(C, ref.C(S), **TOL)
    with torch.no_grad():
        state = fixed_actions(model, S).condition(x, y)
    torch.testing.assert_close(it.repr_weights, S @ state.repr_weights_proj, **TOL)


@pytest.mark.parametrize("num_actions", [1, 4, 9])
def test_cg_actions_give_cg_iterate(num_actions):
    """notes §10.10: with CG-residual actions v_i = C_i r is the i-th CG iterate (x_0 = 0)."""
    x, y = toy_data()
    model = cagp.build_cagp_cg(D, init=(x, y), num_actions=num_actions, rtol=0.0, **HYPER)
    ref = Dense(model, x, y)
    cg = ConjugateGradient(rtol=0.0, max_iters=num_actions)
    iterate = cg.run(cg.init(ref.Kh), ref.r).solution
    with torch.no_grad():
        state = model.condition(x, y)
    assert not state.actions.requires_grad  # CG actions carry no gradient
    torch.testing.assert_close(state.actions @ state.repr_weights_proj, iterate, **TOL)
    torch.testing.assert_close(state.actions.T @ state.actions, torch.eye(num_actions), **TOL)
    it = cagp.iterative_posterior(ref.Kh.matmul, ref.r, lambda j, res: res, num_actions)
    torch.testing.assert_close(it.repr_weights, iterate, **TOL)


def test_residual_policy_stops_at_tolerance():
    """CG stops once ‖r_j‖ ≤ rtol ‖r_0‖: fewer actions than asked, still the CG iterate."""
    A = torch.diag(torch.tensor([1.0, 1.0, 2.0, 2.0, 3.0]))
    S = ResidualPolicy(5, rtol=1e-8)(A.matmul, torch.ones(5))
    assert S.shape == (5, 3)  # three distinct eigenvalues: CG is exact after 3 steps


# --- information-theoretic and worst-case identities ---------------------------------------------

def _mutual_information(state):
    """MI(f(X); Sᵀy) = ½[log det G − log det SᵀS − i log σ²] (Lemma S5)."""
    logdet_G = 2 * state.cholesky.diagonal().log().sum()
    return 0.5 * (logdet_G - state.logdet_actions - state.num_actions * math.log(state.noise))


def test_eigenvector_actions_are_information_optimal():
    """Lemma S5 / notes §10.11: top-i eigenvectors of K̂ reach the largest MI."""
    x, y = toy_data()
    base = opt_model(x, y, 6)
    ref = Dense(base, x, y)
    evals, evecs = torch.linalg.eigh(ref.Kh)
    with torch.no_grad():
        eig = fixed_actions(base, evecs[:, -6:]).condition(x, y)
        block = base.condition(x, y)
        rand = fixed_actions(base, torch.randn(N, 6, generator=torch.Generator())).condition(x, y)
    mi = _mutual_information(eig)
    torch.testing.assert_close(mi, 0.5 * (evals[-6:].log().sum() - 6 * math.log(ref.noise)),
                               **TOL)
    _, V = ref.q(block.actions.to_dense())  # MI = ½[log det K − log det K_i(X, X)]
    dense_mi = 0.5 * (torch.linalg.slogdet(ref.K)[1] - torch.linalg.slogdet(V)[1])
    torch.testing.assert_close(_mutual_information(block), dense_mi, rtol=1e-6, atol=1e-8)
    assert float(mi) > float(_mutual_information(block))
    assert float(mi) > float(_mutual_information(rand))


def test_worst_case_error_identity():
    """Thm. S2 / notes §10.12: ‖e‖²_{H(K^σ)} = wᵀK^σ w = K_i(x, x) + σ² for x ∉ X."""
    x, y = toy_data()
    x_test, _ = toy_data(5, seed=7)
    model = opt_model(x, y, 7)
    ref = Dense(model, x, y, x_test)
    with torch.no_grad():
        C = ref.C(model.condition(x, y).actions.to_dense())
    pred = predict_dense(model, x, y, x_test)
    for j in range(5):
        w = torch.cat([torch.ones(1), -C @ ref.K_tx[j]])
        K_sigma = torch.cat([torch.cat([ref.k_tt[j:j + 1] + ref.noise, ref.K_tx[j]])[None],
                             torch.cat([ref.K_tx[j][:, None], ref.Kh], 1)])
        torch.testing.assert_close(w @ K_sigma @ w, pred.variance[j] + pred.noise, **TOL)
