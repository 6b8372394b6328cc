"""CaGP (notes/001 §10): block-sparse actions, memory, gradients against dense autograd,
training and the method contract."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gpscale.io import load, save
from gpscale.kernels import kernel_matrix
from gpscale.linalg.operators.block_sparse import BlockLayout
from gpscale.linalg.policies import block_sparse
from gpscale.linalg.policies.block_sparse import (
    LearnedBlockSparsePolicy,
    initial_values,
    local_assignment,
)
from gpscale.methods import _common, build, cagp
from gpscale.methods.cagp import model as cagp_model
from gpscale.training import FitConfig, default_fit_config, fit

from ._dense import (
    HYPER,
    TOL,
    D,
    opt_model,
    predict_dense,
    toy_data,
)

# --- block-sparse structure, initialisation, memory ---------------------------------------------

@pytest.mark.parametrize(("n", "i"), [(48, 8), (50, 8), (47, 46)])
def test_block_structure_covers_all_points(n, i):
    """Eq. (14) / notes §10.13: nnz(S) = n, blocks of k and k+1 cover all n, SᵀS diagonal."""
    x, y = toy_data(n)
    S = opt_model(x, y, i).policy().to_dense().detach()
    assert int((S != 0).sum()) == n
    assert bool(((S != 0).sum(1) == 1).all())  # every point in exactly one block
    assert set((S != 0).sum(0).tolist()) <= {n // i, n // i + 1}
    gram = S.T @ S
    torch.testing.assert_close(gram, torch.diag(gram.diagonal()), rtol=0, atol=0)


@pytest.mark.parametrize("how", ["random", "targets", "eigen"])
def test_action_initialisation(how):
    """'random' ~ N(0, 1/k); 'targets' = the block's y; 'eigen' = top eigenvector per block."""
    x, y = toy_data(50)
    model = opt_model(x, y, 8, action_init=how)
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


def test_auto_initialisation_is_eigen_for_a_known_kernel_and_random_otherwise():
    """``action_init='auto'`` (the default): the blocks' top eigenvectors where the lengthscale
    is given (or pre-fitted), the seeded random entries where it is a default."""
    x, y = toy_data(60)

    def entries(**kw):
        return cagp.build_cagp_opt(D, init=(x, y), num_actions=6, seed=4, **kw).policy.values

    known = {k: v for k, v in HYPER.items()}
    torch.testing.assert_close(entries(**known), entries(**known, action_init="eigen"),
                               rtol=0, atol=0)
    unknown = {k: v for k, v in HYPER.items() if k != "lengthscale"}
    torch.testing.assert_close(entries(**unknown), entries(**unknown, action_init="random"),
                               rtol=0, atol=0)
    assert not torch.equal(entries(**known), entries(**known, action_init="random"))
    with pytest.raises(ValueError, match="auto"):
        initial_values("auto", BlockLayout(60, 6), torch.arange(60))


def test_actions_train_at_a_share_of_the_rate_from_a_prefitted_start():
    """From a pre-fitted start (``max_start_lr`` set) Adam's first step moves every action entry
    by PREFIT_ACTION_LR_SCALE · lr and each hyperparameter by lr (up to Adam's ε); with no
    pre-fit, all by lr."""
    x, y = toy_data(60)
    for prefitted, share in ((True, cagp_model.PREFIT_ACTION_LR_SCALE), (False, 1.0)):
        model = opt_model(x, y, 6)
        model.max_start_lr = 0.05 if prefitted else None
        values = model.policy.values.detach().clone()
        raw = model.kernel.base_kernel.raw_lengthscale.detach().clone()
        fit(model, None, (x, y), FitConfig(lr=0.05, epochs=1, progress=False))
        step = (model.policy.values.detach() - values).abs()
        torch.testing.assert_close(step, torch.full_like(step, share * 0.05), rtol=1e-3, atol=0)
        moved = (model.kernel.base_kernel.raw_lengthscale.detach() - raw).abs()
        torch.testing.assert_close(moved, torch.full_like(moved, 0.05), rtol=1e-5, atol=0)


@pytest.mark.parametrize("factory", [cagp.build_cagp_opt, cagp.build_cagp_cg])
def test_no_n_by_n_tensor(factory, largest_tensor, monkeypatch):
    """notes §10.14: loss, backward and predict never hold more than max(n i, chunk n) entries
    — once n² entries exceed the cache limit of CaGP-CG's CG products (set to 0 here; below
    the limit that one n × n matrix is held on purpose: test_cagp_cg_cost)."""
    monkeypatch.setattr(_common, "DENSE_OPERATOR_BYTES", 0)
    n, i, chunk = 200, 10, 16
    x, y = toy_data(n)
    model = factory(D, init=(x, y), num_actions=i, chunk_size=chunk, backend="fused", **HYPER)
    with largest_tensor() as mode:
        model.loss(model.condition(x, y)).backward()
        predict_dense(model, x, y, x[:50])
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
    x, y = toy_data(50)
    model = opt_model(x, y, 8, backend=backend, chunk_size=7)
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
    x, y = toy_data(10)
    wrapper = _Loss(opt_model(x, y, 4, chunk_size=3, backend="fused"))
    names, params = zip(*[(k, p.detach().clone().requires_grad_())
                          for k, p in wrapper.named_parameters()], strict=True)

    def f(*values):
        return torch.func.functional_call(wrapper, dict(zip(names, values, strict=True)), (x, y))

    assert torch.autograd.gradcheck(f, params)


# --- training and plumbing -----------------------------------------------------------------------

def test_float32_adam_training_stays_finite():
    """float32 (Adam) losses are finite, decrease, and match the float64 loss to ~1e-4."""
    x, y = toy_data(200)
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


def test_cg_actions_survive_the_float64_fallback(monkeypatch):
    """CaGP-CG's dense float32 actions after the fallback (found by a Parkinsons run with
    defaults: Sᵀ r mixed a float64 S with a float32 r): the loss equals the float64 model's at
    the same actions, and gradients are finite."""
    x, y = toy_data(200)
    x32, y32 = x.float(), y.float()
    model = cagp.build_cagp_cg(D, init=(x32, y32), num_actions=20)
    real = cagp_model.kernel_times

    def lossy(S, kernel, xk, x_rows, chunk_size, backend):
        Z = real(S, kernel, xk, x_rows, chunk_size, backend)
        return Z - 10.0 * S if xk.dtype == torch.float32 and x_rows is None else Z

    monkeypatch.setattr(cagp_model, "kernel_times", lossy)
    S = model.actions_for(x32, y32)
    with pytest.warns(RuntimeWarning, match="recomputed in float64"):
        loss = model.loss(model.condition(x32, y32, actions=S))
    loss.backward()
    assert loss.dtype == torch.float32
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.requires_grad)
    reference = cagp.build_cagp_cg(D, init=(x, y), num_actions=20)
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        loss64 = reference.loss(reference.condition(x, y, actions=S.double()))
    torch.testing.assert_close(loss.detach().double(), loss64, rtol=1e-6, atol=1e-6)


def test_indefinite_float32_gram_falls_back_to_float64_products(monkeypatch):
    """When float32 K S makes SᵀK̂S indefinite (Parkinsons, Adam epoch 499: float32 distances
    off by 1e-3 at σ² = 1e-4), condition warns and uses float64 products, without changing the
    module: loss, gradients and predictions then match the float64 model, in the float32 dtype."""
    x, y = toy_data(200)
    x32, y32 = x.float(), y.float()
    model = cagp.build_cagp_opt(D, init=(x32, y32), num_actions=20)
    real = cagp_model.kernel_times

    def lossy(S, kernel, xk, x_rows, chunk_size, backend):  # float32 products made useless
        Z = real(S, kernel, xk, x_rows, chunk_size, backend)
        return Z - 10.0 * S.to_dense() if xk.dtype == torch.float32 and x_rows is None else Z

    monkeypatch.setattr(cagp_model, "kernel_times", lossy)
    attributes = dict(vars(model))
    with pytest.warns(RuntimeWarning, match="recomputed in float64"):
        state = model.condition(x32, y32)
    assert state.K_S.dtype == torch.float64 and vars(model) == attributes
    loss = model.loss(state)
    loss.backward()
    assert loss.dtype == torch.float32
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 and bool(torch.isfinite(g).all())
               for g in grads)
    reference = cagp.build_cagp_opt(D, init=(x, y), num_actions=20)
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        loss64 = reference.loss(reference.condition(x, y))
        torch.testing.assert_close(loss.detach().double(), loss64, rtol=1e-6, atol=1e-6)
        pred = model.predict(model.condition(x32, y32), x32[:7])
        pred64 = reference.predict(reference.condition(x, y), x[:7])
    assert pred.mean.dtype == torch.float32
    torch.testing.assert_close(pred.mean.double(), pred64.mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pred.variance.double(), pred64.variance, rtol=1e-4, atol=1e-6)


def test_float32_gram_needing_jitter_beyond_the_noise_falls_back_to_float64(monkeypatch):
    """KEGGu's pre-fitted start (outputscale 7,900, σ² = 0.0145): float32 SᵀKS erred by ±0.08
    and the Cholesky took jitter up to 1e2, silently wrong. Here a float32 error of −3e-2 SᵀS
    against σ² = 1e-4 (outputscale 1e4) would factorise with jitter ~3e-2 ≪ the old limit
    (1e-4 · mean diag); jitter above a tenth of σ² now counts as unresolved: ``resolves`` says
    so and ``condition`` uses float64 products, whose loss is the float64 model's. (The error
    is several times float32's own rounding of K S here, ~5e-3, so that the least eigenvalue
    is negative whatever the product's rounding.)"""
    x, y = toy_data(200)
    x32, y32 = x.float(), y.float()
    prior = {"lengthscale": 3.0, "outputscale": 1e4, "noise": 1e-4}
    model = cagp.build_cagp_opt(D, init=(x32, y32), num_actions=20, **prior)
    assert model.resolves(x32, y32)
    with torch.no_grad():
        state = model.condition(x32, y32)
        gram = state.gram_K + 1e-4 * state.gram_actions
        root = state.gram_actions.diagonal().rsqrt()  # SᵀS is diagonal: scale it out
        shift = float(torch.linalg.eigvalsh(root[:, None] * gram * root).min())
    assert float(gram.diagonal().mean()) * 1e-4 > 3e-2  # jitter safe_cholesky would try
    real = cagp_model.kernel_times

    def lossy(S, kernel, xk, x_rows, chunk_size, backend):  # SᵀK̂S's least eigenvalue ≈ −3e-2
        Z = real(S, kernel, xk, x_rows, chunk_size, backend)
        if xk.dtype == torch.float32 and x_rows is None:
            return Z - (shift + 3e-2) * S.to_dense()
        return Z

    monkeypatch.setattr(cagp_model, "kernel_times", lossy)
    assert not model.resolves(x32, y32)
    with pytest.warns(RuntimeWarning, match="within a tenth of the noise"):
        state = model.condition(x32, y32)
    assert state.K_S.dtype == torch.float64
    reference = cagp.build_cagp_opt(D, init=(x, y), num_actions=20, **prior)
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model.loss(state).double(),
                                   reference.loss(reference.condition(x, y)),
                                   rtol=1e-5, atol=1e-5)


def test_lbfgs_float64_training_decreases_loss():
    """L-BFGS in float64 through training.fit lowers the ELBO loss."""
    x, y = toy_data(60)
    model = cagp.build_cagp_opt(D, init=(x, y), num_actions=6)
    history = fit(model, None, (x, y), FitConfig(optimizer="lbfgs", lr=0.1, epochs=2,
                                                 lbfgs_max_iter=10, progress=False))
    assert history.rows[-1]["loss"] < history.rows[0]["loss"]


@pytest.mark.parametrize("key", ["cagp-opt", "cagp-cg"])
def test_registry_rebuild_round_trip(key):
    """build(key, init=None, **model.options) + load_state_dict reproduces predictions."""
    x, y = toy_data(60)
    model = build(key, D, init=(x, y), num_actions=6)
    fit(model, None, (x, y), FitConfig(lr=0.1, epochs=2, progress=False))
    rebuilt = build(key, D, init=None, **model.options).double()
    rebuilt.load_state_dict(model.state_dict())
    a, b = predict_dense(model, x, y, x[:9]), predict_dense(rebuilt, x, y, x[:9])
    torch.testing.assert_close(b.mean, a.mean, rtol=0, atol=0)
    torch.testing.assert_close(b.variance, a.variance, rtol=0, atol=0)


def test_save_load_round_trip(tmp_path):
    """gpscale.save / gpscale.load (registry rebuild with init=None) keep the predictions."""
    x, y = toy_data(40)
    model = build("cagp-opt", D, init=(x, y), num_actions=5, action_init="eigen")
    path = save(model, tmp_path / "cagp.pt", data=(x, y))
    loaded = load(path)
    a, b = predict_dense(model, x, y, x[:5]), predict_dense(loaded, x, y, x[:5])
    torch.testing.assert_close(b.mean, a.mean, rtol=0, atol=0)
    torch.testing.assert_close(b.variance, a.variance, rtol=0, atol=0)


def test_condition_and_loss_do_not_mutate_the_module():
    """STYLE §1.2: condition/loss/predict return state and never write to the module."""
    x, y = toy_data(40)
    model = opt_model(x, y, 5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = model.condition(x, y)
    model.loss(state).backward()
    model.predict(state, x[:3])
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_fit_defaults_follow_table_s1():
    """Adam, float32, LinearLR(end_factor=0.1), full batch."""
    for key in ("cagp-opt", "cagp-cg"):
        config = default_fit_config(key, "paper")
        assert config.optimizer == "adam" and config.dtype == "float32"
        assert config.scheduler == "linear" and config.lr_end_factor == 0.1
        assert config.batch_size is None
        default = default_fit_config(key)  # the best learning rate of Table 1 on most sets
        assert (default.lr, default.scheduler, default.dtype) == (1.0, "plateau", "float32")


@pytest.mark.parametrize("factory", [cagp.build_cagp_opt, cagp.build_cagp_cg])
def test_fewer_points_than_actions_is_a_value_error(factory):
    """validation.check_num_points: n < num_actions is a ValueError naming both."""
    x, y = toy_data(10)
    with pytest.raises(ValueError, match="fewer than the 11 actions"):
        factory(D, init=(x, y), num_actions=11)


def test_condition_rejects_other_data_sizes():
    """Learned actions belong to the n training points; CG actions need n ≥ i."""
    x, y = toy_data(30)
    with pytest.raises(ValueError, match="learned for 30"):
        opt_model(x, y, 5).condition(x[:20], y[:20])
    with pytest.raises(ValueError, match="fewer than the 25 actions"):
        cagp.build_cagp_cg(D, init=(x, y), num_actions=25).condition(x[:20], y[:20])


def test_invalid_options():
    """Unknown objective or action init, and a rebuild without num_train, are ValueErrors."""
    x, y = toy_data(30)
    with pytest.raises(ValueError, match="objective"):
        opt_model(x, y, 5, objective="mll")
    with pytest.raises(ValueError, match="action_init"):
        opt_model(x, y, 5, action_init="zeros")
    with pytest.raises(ValueError, match="num_train"):
        cagp.build_cagp_opt(D, init=None, num_actions=5)


def test_policy_state_dict_holds_actions_and_assignment():
    """The learned policy saves its entries, its block assignment (a permutation) and its held
    positions (none by default; a state saved before they existed loads with none)."""
    policy = LearnedBlockSparsePolicy(20, 6, seed=3)
    assert set(policy.state_dict()) == {"values", "index", "held"}
    assert not policy.held.any()
    policy.hold(torch.tensor([1, 5]))
    older = {k: v for k, v in policy.state_dict().items() if k != "held"}
    policy.load_state_dict(older)
    assert not policy.held.any()
    assert sorted(policy.index.tolist()) == list(range(20))


@pytest.mark.parametrize(("n", "i"), [(1000, 7), (1000, 64), (301, 300)])
def test_local_assignment_cuts_the_inputs_into_disjoint_cells(n, i):
    """Local blocks: a permutation; every block of the layout is an axis-aligned cell (k-d tree
    leaves), so the cells' bounding boxes overlap in volume nowhere; sizes follow the layout."""
    x = torch.rand(n, 2, generator=torch.Generator().manual_seed(n + i), dtype=torch.float64)
    layout = BlockLayout(n, i)
    index = local_assignment(x, layout)
    assert sorted(index.tolist()) == list(range(n))
    boxes, start = [], 0
    for size in layout.sizes():
        cell = x[index[start:start + size]]
        boxes.append((cell.min(0).values, cell.max(0).values))
        start += size
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            lo = torch.maximum(boxes[a][0], boxes[b][0])
            hi = torch.minimum(boxes[a][1], boxes[b][1])
            assert float((hi - lo).clamp_min(0).prod()) < 1e-12  # no shared area
    # a cell is much smaller than the domain: mean box area ≈ 1 / i for uniform points
    area = sum(float((hi - lo).prod()) for lo, hi in boxes) / len(boxes)
    assert area < 2.0 / i


def test_local_blocks_are_saved_and_reloaded(tmp_path):
    """blocks='local' stores its assignment in the state dict: a registry rebuild predicts the
    same; an unknown assignment is a ValueError naming the option."""
    x, y = toy_data(60)
    model = build("cagp-opt", D, init=(x, y), num_actions=6, blocks="local",
                  action_init="eigen")
    assert not torch.equal(model.policy.index, LearnedBlockSparsePolicy(60, 6).index)
    path = save(model, tmp_path / "local.pt", data=(x, y))
    loaded = load(path)
    torch.testing.assert_close(loaded.policy.index, model.policy.index, rtol=0, atol=0)
    a, b = predict_dense(model, x, y, x[:5]), predict_dense(loaded, x, y, x[:5])
    torch.testing.assert_close(b.mean, a.mean, rtol=0, atol=0)
    with pytest.raises(ValueError, match="blocks"):
        build("cagp-opt", D, init=(x, y), num_actions=6, blocks="kmeans")


def test_eigen_initialisation_in_chunks_matches_all_blocks_at_once(monkeypatch):
    """'eigen' computes the kernel blocks a few at a time (memory bounded by
    EIGEN_CHUNK_ENTRIES): one block per chunk gives the same entries as all at once."""
    x, y = toy_data(70)
    whole = opt_model(x, y, 7, action_init="eigen").policy.values.detach()
    monkeypatch.setattr(block_sparse, "EIGEN_CHUNK_ENTRIES", 1)
    chunked = opt_model(x, y, 7, action_init="eigen").policy.values.detach()
    torch.testing.assert_close(chunked.abs(), whole.abs(), rtol=0, atol=1e-12)
