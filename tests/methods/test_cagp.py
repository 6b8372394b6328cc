"""CaGP (notes/001 §10): every identity against dense float64 linear algebra (torch.linalg)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gpscale.io import load, save
from gpscale.kernels import kernel_matrix
from gpscale.linalg.operators.block_sparse import BlockSparseActions
from gpscale.linalg.policies.block_sparse import LearnedBlockSparsePolicy
from gpscale.linalg.policies.residual import ResidualPolicy
from gpscale.linalg.solvers.cg import ConjugateGradient
from gpscale.methods import build, cagp, get_spec
from gpscale.training import FitConfig, fit

N, D = 48, 2
HYPER = {"lengthscale": 0.5, "outputscale": 1.3, "noise": 0.05, "mean_constant": 0.2}
TOL = {"rtol": 1e-8, "atol": 1e-10}


def _data(n: int = N, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, D, generator=g, dtype=dtype) * 2
    y = torch.sin(3 * x[:, 0]) + torch.cos(2 * x[:, 1]) + 0.1 * torch.randn(n, generator=g,
                                                                            dtype=dtype)
    return x, y


def _opt(x, y, num_actions, **kw):
    return cagp.build_cagp_opt(x.shape[1], init=(x, y), num_actions=num_actions,
                               **{**HYPER, **kw})


def _fixed(model, S):
    """The same prior and noise, with the fixed actions S (n, i)."""
    return cagp.CaGP(model.mean, model.kernel, model.likelihood, lambda matmul, r: S,
                     num_dims=D)


class Dense:
    """Dense float64 references for one model's prior (K, K̂, μ, σ²) on (x, y)."""

    def __init__(self, model, x, y, x_test=None):
        with torch.no_grad():
            self.K = kernel_matrix(model.kernel, x, x)
            self.mu = model.mean(x)
            self.noise = float(model.noise)
            if x_test is not None:
                self.K_tx = kernel_matrix(model.kernel, x_test, x)
                self.k_tt = kernel_matrix(model.kernel, x_test, x_test).diagonal()
                self.mu_t = model.mean(x_test)
        self.n = x.shape[0]
        self.Kh = self.K + self.noise * torch.eye(self.n)
        self.r = y - self.mu
        self.y = y

    def C(self, S):
        """S (SᵀK̂S)⁻¹ Sᵀ, Eq. (5)."""
        return S @ torch.linalg.solve(S.T @ self.Kh @ S, S.T)

    def posterior(self, C):
        """Mean and variance at the test points for C ≈ K̂⁻¹ (C = K̂⁻¹: the exact GP)."""
        return self.mu_t + self.K_tx @ C @ self.r, self.k_tt - (self.K_tx @ C * self.K_tx).sum(1)

    def exact(self):
        return self.posterior(torch.linalg.inv(self.Kh))

    def q(self, S):
        """q_i(f(X)) = N(μ_i(X), K_i(X, X))."""
        C = self.C(S)
        return self.mu + self.K @ C @ self.r, self.K - self.K @ C @ self.K

    def nll(self):
        """−log p(y) / n."""
        L = torch.linalg.cholesky(self.Kh)
        quad = self.r @ torch.cholesky_solve(self.r[:, None], L)[:, 0]
        return 0.5 * (quad + 2 * L.diagonal().log().sum() + self.n * math.log(2 * math.pi)) / self.n


def _kl(m0, S0, m1, S1):
    """KL(N(m0, S0) ‖ N(m1, S1))."""
    diff = m1 - m0
    return 0.5 * (torch.trace(torch.linalg.solve(S1, S0)) + diff @ torch.linalg.solve(S1, diff)
                  - S0.shape[0] + torch.linalg.slogdet(S1)[1] - torch.linalg.slogdet(S0)[1])


def _predict(model, x, y, x_test):
    with torch.no_grad():
        return model.predict(model.condition(x, y), x_test)


# --- limit identities -------------------------------------------------------------------------

@pytest.mark.parametrize("actions", ["block_k1", "dense"])
def test_full_rank_recovers_exact_gp(actions):
    """notes §10.1: i = n invertible actions give the exact posterior and ELBO = NLL."""
    x, y = _data()
    x_test, _ = _data(7, seed=1)
    model = _opt(x, y, N)
    if actions == "dense":
        model = _fixed(model, torch.randn(N, N, generator=torch.Generator().manual_seed(3)))
    ref = Dense(model, x, y, x_test)
    pred = _predict(model, x, y, x_test)
    mean, var = ref.exact()
    torch.testing.assert_close(pred.mean, mean, **TOL)
    torch.testing.assert_close(pred.variance, var, rtol=1e-7, atol=1e-9)
    with torch.no_grad():
        torch.testing.assert_close(model.loss(model.condition(x, y)), ref.nll(), **TOL)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_actions=st.integers(1, N))
def test_variance_never_below_exact(seed, num_actions):
    """Prop. S1 / notes §10.2: K_i(x, x) ≥ K⋆(x, x) for any full-rank S."""
    x, y = _data()
    x_test, _ = _data(9, seed=1)
    base = _opt(x, y, num_actions, seed=seed)
    S = torch.randn(N, num_actions, generator=torch.Generator().manual_seed(seed))
    _, exact_var = Dense(base, x, y, x_test).exact()
    for model in (base, _fixed(base, S)):
        assert bool((_predict(model, x, y, x_test).variance >= exact_var - 1e-10).all())


def test_variance_monotone_for_nested_actions():
    """Prop. S1 / notes §10.3: K_i ≥ K_j ≥ K⋆ for S_i the first i columns of S_j."""
    x, y = _data()
    x_test, _ = _data(9, seed=1)
    base = _opt(x, y, 4)
    S = torch.randn(N, 30, generator=torch.Generator().manual_seed(5))
    variances = [_predict(_fixed(base, S[:, :i]), x, y, x_test).variance for i in (3, 10, 30)]
    variances.append(Dense(base, x, y, x_test).exact()[1])
    for wide, narrow in zip(variances[:-1], variances[1:], strict=True):
        assert bool((wide >= narrow - 1e-10).all())


# --- the loss: two routes, one number -----------------------------------------------------------

@pytest.mark.parametrize("num_actions", [5, 13])
def test_elbo_gap_is_kl_to_exact_posterior(num_actions):
    """Eq. (10) / notes §10.4: ℓ_ELBO − ℓ_NLL = KL(q_i ‖ p⋆) ≥ 0 (all per datum)."""
    x, y = _data()
    model = _opt(x, y, num_actions)
    ref = Dense(model, x, y)
    with torch.no_grad():
        state = model.condition(x, y)
        elbo = model.negative_elbo(state)
    S = state.actions.to_dense()
    C_exact = torch.linalg.inv(ref.Kh)
    post = (ref.mu + ref.K @ C_exact @ ref.r, ref.K - ref.K @ C_exact @ ref.K)
    gap = _kl(*ref.q(S), *post) / N
    torch.testing.assert_close(elbo - ref.nll(), gap, rtol=1e-6, atol=1e-9)
    assert float(gap.detach()) > 0


def test_elbo_terms_match_dense_expectation_and_kl():
    """Lemma S3 / notes §10.5: expected_log_lik = E_q[log p(y|f)]/n, kl = KL(q ‖ prior)/n."""
    x, y = _data()
    model = _opt(x, y, 6)
    ref = Dense(model, x, y)
    with torch.no_grad():
        state = model.condition(x, y)
        ell, kl = model.expected_log_lik(state), model.kl(state)
    m, V = ref.q(state.actions.to_dense())
    dense_ell = -0.5 * ((ref.y - m).square().sum() / ref.noise + V.trace() / ref.noise
                        + N * math.log(2 * math.pi * ref.noise)) / N
    torch.testing.assert_close(ell, dense_ell, **TOL)
    torch.testing.assert_close(kl, _kl(m, V, ref.mu, ref.K) / N, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(model.loss(state), kl - ell, **TOL)


def test_projected_nll_equals_orthonormalised_form():
    """Eq. (9), Lemma S2 / notes §10.6: raw-S form = −log N(S'ᵀy; S'ᵀμ, S'ᵀK̂S')/n."""
    x, y = _data()
    model = _opt(x, y, 7, objective="projected_nll")
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
    x, y = _data()
    x_test, _ = _data(6, seed=1)
    model = _opt(x, y, 9)
    ref = Dense(model, x, y, x_test)
    with torch.no_grad():
        S = model.condition(x, y).actions.to_dense()
    Q = torch.linalg.qr(S).Q  # orthonormal, same column space
    cov_yy = Q.T @ ref.K @ Q + ref.noise * torch.eye(9)
    cov_fy = ref.K_tx @ Q
    mean = ref.mu_t + cov_fy @ torch.linalg.solve(cov_yy, Q.T @ (y - ref.mu))
    var = ref.k_tt - (cov_fy @ torch.linalg.inv(cov_yy) * cov_fy).sum(1)
    pred = _predict(model, x, y, x_test)
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
    x, y = _data(50)  # i ∤ n: blocks of 6 and 7 points
    x_test, _ = _data(6, seed=1)
    base = _opt(x, y, 8)
    g = torch.Generator().manual_seed(4)
    if transform == "rescale_blocks":  # through the block-sparse path: Σ log ‖s'_j‖²
        other = _fixed(base, _block_rescaled(base, torch.tensor([1e-3, 2, 5, 0.5, 1, 30, 7, 1.])))
    else:
        S = base.policy().to_dense().detach()
        W = torch.eye(8)[torch.randperm(8, generator=g)] if transform == "permute" \
            else torch.randn(8, 8, generator=g)
        other = _fixed(base, S @ W)
    with torch.no_grad():
        a, b = base.condition(x, y), other.condition(x, y)
        for term in ("negative_elbo", "projected_nll"):
            torch.testing.assert_close(getattr(other, term)(b), getattr(base, term)(a), **TOL)
    pa, pb = _predict(base, x, y, x_test), _predict(other, x, y, x_test)
    torch.testing.assert_close(pb.mean, pa.mean, **TOL)
    torch.testing.assert_close(pb.variance, pa.variance, **TOL)


def test_iterative_equals_batch():
    """Alg. S1 = Alg. S2 / notes §10.9: the same C_i and v_i for the same actions."""
    x, y = _data()
    model = _opt(x, y, 8)
    ref = Dense(model, x, y)
    S = torch.randn(N, 8, generator=torch.Generator().manual_seed(2))
    it = cagp.iterative_posterior(ref.Kh.matmul, ref.r, lambda j, res: S[:, j], 8)
    C = it.directions @ it.directions.T
    torch.testing.assert_close(C, ref.C(S), **TOL)
    with torch.no_grad():
        state = _fixed(model, S).condition(x, y)
    torch.testing.assert_close(it.repr_weights, S @ state.repr_weights_proj, **TOL)


@pytest.mark.parametrize("num_actions", [1, 4, 9])
def test_cg_actions_give_cg_iterate(num_actions):
    """notes §10.10: with CG-residual actions v_i = C_i r is the i-th CG iterate (x_0 = 0)."""
    x, y = _data()
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
    x, y = _data()
    base = _opt(x, y, 6)
    ref = Dense(base, x, y)
    evals, evecs = torch.linalg.eigh(ref.Kh)
    with torch.no_grad():
        eig = _fixed(base, evecs[:, -6:]).condition(x, y)
        block = base.condition(x, y)
        rand = _fixed(base, torch.randn(N, 6, generator=torch.Generator())).condition(x, y)
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
    x, y = _data()
    x_test, _ = _data(5, seed=7)
    model = _opt(x, y, 7)
    ref = Dense(model, x, y, x_test)
    with torch.no_grad():
        C = ref.C(model.condition(x, y).actions.to_dense())
    pred = _predict(model, x, y, x_test)
    for j in range(5):
        w = torch.cat([torch.ones(1), -C @ ref.K_tx[j]])
        K_sigma = torch.cat([torch.cat([ref.k_tt[j:j + 1] + ref.noise, ref.K_tx[j]])[None],
                             torch.cat([ref.K_tx[j][:, None], ref.Kh], 1)])
        torch.testing.assert_close(w @ K_sigma @ w, pred.variance[j] + pred.noise, **TOL)


# --- block-sparse structure, initialisation, memory ---------------------------------------------

@pytest.mark.parametrize(("n", "i"), [(48, 8), (50, 8), (47, 46)])
def test_block_structure_covers_all_points(n, i):
    """Eq. (14) / notes §10.13: nnz(S) = n, blocks of k and k+1 cover all n, SᵀS diagonal."""
    x, y = _data(n)
    S = _opt(x, y, i).policy().to_dense().detach()
    assert int((S != 0).sum()) == n
    assert bool(((S != 0).sum(1) == 1).all())  # every point in exactly one block
    assert set((S != 0).sum(0).tolist()) <= {n // i, n // i + 1}
    gram = S.T @ S
    torch.testing.assert_close(gram, torch.diag(gram.diagonal()), rtol=0, atol=0)


@pytest.mark.parametrize("how", ["random", "targets", "eigen"])
def test_action_initialisation(how):
    """'random' ~ N(0, 1/k); 'targets' = the block's y; 'eigen' = top eigenvector per block."""
    x, y = _data(50)
    model = _opt(x, y, 8, action_init=how)
    S = model.policy().to_dense().detach()
    if how == "targets":
        torch.testing.assert_close(S.sum(1), y, rtol=0, atol=0)
    for j in range(8):
        rows = torch.nonzero(S[:, j]).flatten()
        if how == "eigen":
            K = kernel_matrix(model.kernel, x[rows], x[rows]).detach()
            top = torch.linalg.eigh(K).eigenvectors[:, -1]
            torch.testing.assert_close(S[rows, j].abs(), top.abs(), **TOL)
    if how == "random":
        assert 0.5 < float(S.square().sum(0).mean()) < 2  # ‖s'_j‖² ≈ 1


class _MaxTensor(TorchDispatchMode):
    """Records the largest tensor any ATen op returns (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("factory", [cagp.build_cagp_opt, cagp.build_cagp_cg])
def test_no_n_by_n_tensor(factory):
    """notes §10.14: loss, backward and predict never hold more than max(n i, chunk n) entries."""
    n, i, chunk = 200, 10, 16
    x, y = _data(n)
    model = factory(D, init=(x, y), num_actions=i, chunk_size=chunk, backend="fused", **HYPER)
    with _MaxTensor() as mode:
        model.loss(model.condition(x, y)).backward()
        _predict(model, x, y, x[:50])
    assert mode.largest <= max(n * i, chunk * n) < n * n


# --- gradients ---------------------------------------------------------------------------------

def _dense_negative_elbo(K, S, mu, y, noise):
    """Eq. (11) / n densely (the notes' Appendix A formula) in torch."""
    n, i = S.shape
    Kh = K + noise * torch.eye(n)
    G, G_K = S.T @ Kh @ S, S.T @ K @ S
    v = torch.linalg.solve(G, S.T @ (y - mu))
    W = torch.linalg.solve_triangular(torch.linalg.cholesky(G), S.T @ K, upper=False)
    var = K.diagonal() - W.square().sum(0)
    return 0.5 * (((y - mu - K @ S @ v).square().sum() + var.sum()) / noise
                  + (n - i) * torch.log(noise) + n * math.log(2 * math.pi) + v @ G_K @ v
                  - torch.trace(torch.linalg.solve(G, G_K)) + torch.linalg.slogdet(G)[1]
                  - torch.linalg.slogdet(S.T @ S)[1]) / n


@pytest.mark.parametrize("backend", ["fused", "eager"])
def test_loss_gradient_matches_dense_autograd(backend):
    """d loss / d(θ, S) through the matrix-free products = autograd through dense formulas."""
    x, y = _data(50)
    model = _opt(x, y, 8, backend=backend, chunk_size=7)
    model.loss(model.condition(x, y)).backward()
    fast = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    dense = _dense_negative_elbo(kernel_matrix(model.kernel, x, x), model.policy().to_dense(),
                                 model.mean(x), y, model.noise)
    dense.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(fast[name], p.grad, rtol=1e-7, atol=1e-10, msg=name)


class _Loss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return self.model.loss(self.model.condition(x, y))


def test_loss_gradcheck_small():
    """gradcheck of the whole loss in every parameter at n = 10 (symmetric tiles, i ∤ n)."""
    x, y = _data(10)
    wrapper = _Loss(_opt(x, y, 4, chunk_size=3, backend="fused"))
    names, params = zip(*[(k, p.detach().clone().requires_grad_())
                          for k, p in wrapper.named_parameters()], strict=True)

    def f(*values):
        return torch.func.functional_call(wrapper, dict(zip(names, values, strict=True)), (x, y))

    assert torch.autograd.gradcheck(f, params)


# --- training and plumbing -----------------------------------------------------------------------

def test_float32_adam_training_stays_finite():
    """float32 (Adam) losses are finite, decrease, and match the float64 loss to ~1e-4."""
    x, y = _data(200)
    x32, y32 = x.float(), y.float()
    model = cagp.build_cagp_opt(D, init=(x32, y32), num_actions=20)
    history = fit(model, None, (x32, y32), FitConfig(lr=0.1, epochs=15, progress=False))
    losses = [row["loss"] for row in history.rows]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    with torch.no_grad():
        loss32 = model.loss(model.condition(x32, y32))
        loss64 = model.double().loss(model.condition(x, y))
    assert loss32.dtype == torch.float32
    torch.testing.assert_close(loss32.double(), loss64, rtol=1e-4, atol=1e-5)


def test_lbfgs_float64_training_decreases_loss():
    """L-BFGS in float64 through training.fit lowers the ELBO loss."""
    x, y = _data(60)
    model = cagp.build_cagp_opt(D, init=(x, y), num_actions=6)
    history = fit(model, None, (x, y), FitConfig(optimizer="lbfgs", lr=0.1, epochs=2,
                                                 lbfgs_max_iter=10, progress=False))
    assert history.rows[-1]["loss"] < history.rows[0]["loss"]


@pytest.mark.parametrize("key", ["cagp-opt", "cagp-cg"])
def test_registry_rebuild_round_trip(key):
    """build(key, init=None, **model.options) + load_state_dict reproduces predictions."""
    x, y = _data(60)
    model = build(key, D, init=(x, y), num_actions=6)
    fit(model, None, (x, y), FitConfig(lr=0.1, epochs=2, progress=False))
    rebuilt = build(key, D, init=None, **model.options).double()
    rebuilt.load_state_dict(model.state_dict())
    a, b = _predict(model, x, y, x[:9]), _predict(rebuilt, x, y, x[:9])
    torch.testing.assert_close(b.mean, a.mean, rtol=0, atol=0)
    torch.testing.assert_close(b.variance, a.variance, rtol=0, atol=0)


def test_save_load_round_trip(tmp_path):
    """gpscale.save / gpscale.load (registry rebuild with init=None) keep the predictions."""
    x, y = _data(40)
    model = build("cagp-opt", D, init=(x, y), num_actions=5, action_init="eigen")
    path = save(model, tmp_path / "cagp.pt", data=(x, y))
    loaded = load(path)
    a, b = _predict(model, x, y, x[:5]), _predict(loaded, x, y, x[:5])
    torch.testing.assert_close(b.mean, a.mean, rtol=0, atol=0)
    torch.testing.assert_close(b.variance, a.variance, rtol=0, atol=0)


def test_condition_and_loss_do_not_mutate_the_module():
    """STYLE §1.2: condition/loss/predict return state and never write to the module."""
    x, y = _data(40)
    model = _opt(x, y, 5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = model.condition(x, y)
    model.loss(state).backward()
    model.predict(state, x[:3])
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_fit_defaults_follow_table_s1():
    """Adam, float32, LinearLR(end_factor=0.1), full batch."""
    for key in ("cagp-opt", "cagp-cg"):
        defaults = get_spec(key).fit_defaults
        assert defaults["optimizer"] == "adam" and defaults["dtype"] == "float32"
        assert defaults["scheduler"] == "linear" and defaults["lr_end_factor"] == 0.1
        FitConfig(**{k: v for k, v in defaults.items() if k != "dtype"})


@pytest.mark.parametrize("factory", [cagp.build_cagp_opt, cagp.build_cagp_cg])
def test_fewer_points_than_actions_is_a_value_error(factory):
    """validation.check_num_points: n < num_actions is a ValueError naming both."""
    x, y = _data(10)
    with pytest.raises(ValueError, match="fewer than the 11 actions"):
        factory(D, init=(x, y), num_actions=11)


def test_condition_rejects_other_data_sizes():
    """Learned actions belong to the n training points; CG actions need n ≥ i."""
    x, y = _data(30)
    with pytest.raises(ValueError, match="learned for 30"):
        _opt(x, y, 5).condition(x[:20], y[:20])
    with pytest.raises(ValueError, match="fewer than the 25 actions"):
        cagp.build_cagp_cg(D, init=(x, y), num_actions=25).condition(x[:20], y[:20])


def test_invalid_options():
    """Unknown objective or action init, and a rebuild without num_train, are ValueErrors."""
    x, y = _data(30)
    with pytest.raises(ValueError, match="objective"):
        _opt(x, y, 5, objective="mll")
    with pytest.raises(ValueError, match="action_init"):
        _opt(x, y, 5, action_init="zeros")
    with pytest.raises(ValueError, match="num_train"):
        cagp.build_cagp_opt(D, init=None, num_actions=5)


def test_policy_state_dict_holds_actions_and_assignment():
    """The learned policy saves its entries and its block assignment (a permutation)."""
    policy = LearnedBlockSparsePolicy(20, 6, seed=3)
    assert set(policy.state_dict()) == {"values", "index"}
    assert sorted(policy.index.tolist()) == list(range(20))
