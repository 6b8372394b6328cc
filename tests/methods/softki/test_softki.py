"""SoftKI (notes/003 §6): every identity against dense float64 linear algebra (torch.linalg)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import gpscale.methods.softki  # noqa: F401  (registers the key "softki")
from gpscale import GPRegressor
from gpscale.io import load, model_from_payload, model_payload, save
from gpscale.kernels import kernel_matrix
from gpscale.methods import build
from gpscale.training import FitConfig, fit

from ._dense import HYPER, TOL, D, Dense, M, N, parameter_grads, small_model, toy_data

# --- approximate kernel (§6.3) -----------------------------------------------------------------

def test_kernel_entries_bounded_by_Kzz_and_psd():
    """§2.3: Q̃ = W K_zz Wᵀ is PSD, its entries convex combinations of K_zz's (diag ≤ σ)."""
    x, y = toy_data()
    with torch.no_grad():
        ref = Dense(small_model(x, y), x, y)
    assert float(ref.Q.min()) >= float(ref.K.min()) - 1e-12
    assert float(ref.Q.max()) <= float(ref.K.max()) + 1e-12
    assert float(ref.Q.diagonal().max()) <= HYPER["outputscale"] + 1e-12
    eig = torch.linalg.eigvalsh(ref.Q)
    assert float(eig.min()) > -1e-10 * float(eig.max())


def test_float32_model_builds_K_zz_from_float64_points():
    """K_zz (and its Cholesky factor) come from float64 points even when the model is float32.

    In float32 the distance expansion loses ~ε‖z/ℓ‖² per entry; with learned points and a short
    lengthscale in 27 dimensions (KEGGu) that made K_zz indefinite beyond what jitter repairs.
    """
    x, y = toy_data(d=27)
    model = small_model(x, y, lengthscale=0.3, noise=1e-3).float()
    with torch.no_grad():
        state = model.condition(x.float(), y.float())
        z = model.inducing_points.double()
        K64 = kernel_matrix(model.kernel, z, z)
    assert state.K_zz.dtype == torch.float32
    torch.testing.assert_close(state.K_zz, K64.float(), rtol=0, atol=0)
    torch.testing.assert_close((state.chol_zz.mT @ state.chol_zz).double(), K64, rtol=0,
                               atol=1e-5)


# --- posterior: QR = Woodbury = dense (§6.4–6.6) ------------------------------------------------

def test_qr_factor_is_the_whitened_capacitance_cholesky():
    """§2.7 whitened: R of [W Uᵀ/β ; I] with UᵀU = K_zz, so (RU)ᵀ(RU) = Ĉ, R's eigenvalues ≥ 1."""
    x, y = toy_data()
    model = small_model(x, y)
    with torch.no_grad():
        state = model.condition(x, y)
        ref = Dense(model, x, y)
    torch.testing.assert_close(state.chol_zz.T @ state.chol_zz, ref.K, **TOL)
    RU = state.R @ state.chol_zz
    torch.testing.assert_close(RU.T @ RU, ref.capacitance(), rtol=1e-9, atol=1e-8)
    assert state.R.diagonal().abs().min() >= 1 - 1e-12  # RᵀR = I + GᵀG/β² ⪰ I


def test_float32_solves_stay_accurate_when_K_zz_is_ill_conditioned():
    """Clustered points (cond K_zz ≈ 10¹⁰), β² = 10⁻³, float32: Σ⁻¹[r, a] and the mean match
    float64 dense solves to 1e-4. The paper's stacking [K̂/β ; U] gave errors of 2e-2 here
    (8e-2 at cond 10¹³), which on Protein made the pseudoloss diverge after 12 epochs."""
    x, y = toy_data(n=1024)
    g = torch.Generator().manual_seed(3)
    base = torch.randn(32, D, generator=g, dtype=torch.float64)
    z = torch.cat([base, base + 1e-3 * torch.randn(32, D, generator=g, dtype=torch.float64)])
    model = small_model(x, y, num_inducing=64, noise=1e-3, lengthscale=1.0)
    probes = torch.randn(1024, 4, generator=g, dtype=torch.float64)
    with torch.no_grad():
        model.inducing_points.copy_(z)
        ref = Dense(model, x, y)
        assert torch.linalg.cond(ref.K) > 1e9
        exact = torch.linalg.solve(ref.S, torch.cat([ref.r[:, None], probes], 1))
        mean64, _ = ref.posterior(x[:50])
        model32 = model.float()
        state = model32.condition(x.float(), y.float(), probes.float())
        mean32 = model32.predict(state, x[:50].float()).mean
    error = (state.solves.double() - exact).norm(dim=0) / exact.norm(dim=0)
    assert error.max() < 1e-4
    torch.testing.assert_close(mean32.double(), mean64, rtol=0, atol=1e-3)


@pytest.mark.parametrize("kernel, ard", [("rbf", False), ("rbf", True), ("matern32", False)],
                         ids=["rbf", "rbf-ard", "matern32"])
def test_qr_woodbury_and_dense_posteriors_agree(kernel, ard):
    """§6.4, §6.6: the QR posterior equals the Woodbury and the dense posterior (Eq. 24/25)."""
    x, y = toy_data()
    x_test, _ = toy_data(9, seed=1)
    model = small_model(x, y, kernel=kernel, ard=ard)
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x_test)
        ref = Dense(model, x, y)
        mean_d, var_d = ref.posterior(x_test)
        mean_w, var_w = ref.woodbury(x_test)
    torch.testing.assert_close(mean_w, mean_d, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(var_w, var_d, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(pred.mean, mean_d, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(pred.variance, var_d, rtol=1e-7, atol=1e-9)
    assert float(pred.noise) == pytest.approx(HYPER["noise"])


def test_chunked_qr_equals_one_qr():
    """TSQR over row chunks of 7 gives the same posterior and log-likelihood as one QR."""
    x, y = toy_data()
    x_test, _ = toy_data(5, seed=1)
    a, b = small_model(x, y), small_model(x, y, chunk_size=7)
    with torch.no_grad():
        sa, sb = a.condition(x, y), b.condition(x, y)
        pa, pb = a.predict(sa, x_test), b.predict(sb, x_test)
        torch.testing.assert_close(pb.mean, pa.mean, **TOL)
        torch.testing.assert_close(pb.variance, pa.variance, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(b.negative_mll(sb), a.negative_mll(sa), **TOL)


def test_mean_within_range_of_point_values_and_variance_below_prior():
    """§6.7: μ(x*) = c + W_*z v lies in [c + min v, c + max v]; variance ≤ prior Q̃_**."""
    x, y = toy_data()
    x_test = 20 * torch.randn(50, D, generator=torch.Generator().manual_seed(3))
    model = small_model(x, y)
    with torch.no_grad():
        state = model.condition(x, y)
        pred = model.predict(state, x_test)
        Ws = model.weights(x_test, state.inducing_points)
        prior = (Ws @ state.K_zz @ Ws.T).diagonal()
    v, c = state.mean_weights, model.mean_constant
    assert bool((pred.mean >= c + v.min() - 1e-12).all() and (pred.mean <= c + v.max() + 1e-12)
                .all())
    assert bool((pred.variance <= prior + 1e-12).all() and (pred.variance >= 0).all())


def test_exact_gp_recovery_with_points_at_inputs_and_zero_temperature():
    """§6.9 (C8): z = x and τ → 0 give W = I, Q̃ = K_xx: the exact GP at the training inputs."""
    x, y = toy_data(30)
    model = small_model(x, y, num_inducing=30, temperature=1e-6, lengthscale=0.8)
    with torch.no_grad():
        model.inducing_points.copy_(x)
        pred = model.predict(model.condition(x, y), x)
        K = kernel_matrix(model.kernel, x, x)
        S = K + HYPER["noise"] * torch.eye(30)
        r = y - model.mean_constant
        mean = model.mean_constant + K @ torch.linalg.solve(S, r)
        var = (K - K @ torch.linalg.solve(S, K)).diagonal()
    torch.testing.assert_close(pred.mean, mean, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(pred.variance, var, rtol=1e-6, atol=1e-8)


# --- objectives (§6: pseudoloss gradient, exact MLL) -------------------------------------------

def test_mll_objective_value_and_gradient_match_dense():
    """Eq. 18 from the QR (§2.4): −log p(y)/n and its gradient equal the dense Cholesky's."""
    x, y = toy_data()
    model = small_model(x, y, objective="mll")
    value = model.loss(model.condition(x, y))
    dense = Dense(model, x, y).nll()
    torch.testing.assert_close(value, dense, **TOL)
    for g, g_ref in zip(parameter_grads(model, value), parameter_grads(model, dense), strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-9)


def test_pseudoloss_loss_value_is_the_negative_log_likelihood():
    """The default objective's value is −log p(y)/n (what a plateau test watches), while its
    gradient is the pseudoloss's: the surrogate's own value differs from it."""
    x, y = toy_data()
    model = small_model(x, y)
    state = model.condition(x, y, probes=math.sqrt(N) * torch.eye(N))
    value = model.loss(state)
    torch.testing.assert_close(value, Dense(model, x, y).nll(), **TOL)
    assert abs(float((model.pseudoloss(state) - value).detach())) > 1e-3
    probes = math.sqrt(N) * torch.eye(N)
    surrogate = model.pseudoloss(model.condition(x, y, probes=probes))
    for g, g_ref in zip(parameter_grads(model, model.loss(model.condition(x, y, probes=probes))),
                        parameter_grads(model, surrogate), strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=0)


def test_pseudoloss_gradient_is_exact_with_complete_probes():
    """Eq. 21–22 (§2.5): with probes √n·e_j (E[aaᵀ] = I exactly) the gradient is −∇log p / n."""
    x, y = toy_data()
    model = small_model(x, y)
    state = model.condition(x, y, probes=math.sqrt(N) * torch.eye(N))
    grads = parameter_grads(model, model.loss(state))
    for g, g_ref in zip(grads, parameter_grads(model, Dense(model, x, y).nll()), strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-9)


def test_pseudoloss_gradient_estimates_negative_log_likelihood_gradient():
    """§2.5 sign and scale: Gaussian probes, averaged over 4000, estimate −∇ log p(y) / n."""
    x, y = toy_data()
    model = small_model(x, y, num_probes=4000)
    torch.manual_seed(0)
    loss = model.loss(model.condition(x, y))
    est = torch.cat([g.flatten() for g in parameter_grads(model, loss)])
    ref = torch.cat([g.flatten() for g in parameter_grads(model, Dense(model, x, y).nll())])
    cosine = float(est @ ref / (est.norm() * ref.norm()))
    # Hutchinson noise with 4000 probes: a few per cent; a sign error would give cosine ≈ −1
    # and unit-norm probes (trace shrunk by 1/n) a norm ratio far from 1.
    assert cosine > 0.98
    assert float(est.norm() / ref.norm()) == pytest.approx(1.0, abs=0.1)


def test_pseudoloss_gradcheck_with_fixed_solves():
    """gradcheck (float64) of the pseudoloss in z with the solves b_j held fixed (Eq. 21)."""
    x, y = toy_data(10)
    model = small_model(x, y, num_inducing=4)
    probes = torch.randn(10, 3, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        state = model.condition(x, y, probes=probes)

    def loss(z):
        W, K = model.weights(x, z), kernel_matrix(model.kernel, z, z)
        return model.pseudoloss(replace(state, weights=W, K_zz=K))

    z0 = model.inducing_points.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(loss, (z0,), eps=1e-6, atol=1e-6)


# --- training, contract, plumbing --------------------------------------------------------------

@pytest.mark.parametrize("learn_noise", [False, True], ids=["fixed-noise", "learned-noise"])
def test_training_lowers_the_exact_nll_and_keeps_fixed_noise(learn_noise):
    """Minimising the pseudoloss (Adam, minibatches) lowers −log p(y); β² moves only if learned."""
    x, y = toy_data(200)
    model = small_model(x, y, learn_noise=learn_noise, noise=1e-2)
    with torch.no_grad():
        before = Dense(model, x, y).nll()
    torch.manual_seed(0)
    fit(model, None, (x, y), FitConfig(lr=0.05, epochs=8, batch_size=64, progress=False))
    with torch.no_grad():
        after = Dense(model, x, y).nll()
    assert float(after) < float(before)
    assert (float(model.noise.detach()) != pytest.approx(1e-2, rel=1e-6)) == learn_noise


def test_save_load_round_trip(tmp_path):
    """gpscale.save / gpscale.load (registry rebuild with init=None) keep the predictions."""
    x, y = toy_data()
    model = build("softki", D, init=(x, y), num_inducing=M, temperature=0.7, ard=True)
    fit(model, None, (x, y), FitConfig(lr=0.05, epochs=2, batch_size=32, progress=False))
    loaded = load(save(model, tmp_path / "softki.pt", data=(x, y)))
    with torch.no_grad():
        a = model.predict(model.condition(x, y), x[:5])
        b = loaded.predict(loaded.condition(x, y), x[:5])
    torch.testing.assert_close(b.mean, a.mean, **TOL)
    torch.testing.assert_close(b.variance, a.variance, **TOL)
    assert loaded.options == model.options


def test_file_saved_before_distances_followed_the_lengthscales_predicts_as_then():
    """A saved payload without the ``distance`` option (written before it existed, when the
    weights were Euclidean) reloads with Euclidean weights, not today's default."""
    x, y = toy_data()
    old = build("softki", D, init=(x, y), num_inducing=M, ard=True, distance="euclidean")
    old.kernel.base_kernel.lengthscale = torch.tensor([0.5, 2.0, 1.0], dtype=x.dtype)
    payload = model_payload(old, data=(x, y))
    del payload["options"]["distance"], payload["options"]["learn_temperature"]
    loaded = model_from_payload(payload)
    assert loaded.distance == "euclidean"
    with torch.no_grad():
        a = old.predict(old.condition(x, y), x[:5]).mean
        b = loaded.predict(loaded.condition(x, y), x[:5]).mean
    torch.testing.assert_close(b, a, **TOL)
    new = model_from_payload(model_payload(build("softki", D, init=(x, y), num_inducing=M),
                                           data=(x, y)))
    assert new.distance == "relative"


@pytest.mark.parametrize("options, match", [
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"objective": "elbo"}, "objective"),
    ({"num_probes": 0}, "num_probes"),
    ({"noise": -1.0}, "noise"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"kernel": "cosine"}, "kernel"),
    ({"num_inducing": 100}, "fewer than"),
], ids=["tau-zero", "tau-inf", "objective", "probes", "noise", "chunk", "kernel", "too-many"])
def test_bad_options_raise(options, match):
    x, y = toy_data()
    with pytest.raises(ValueError, match=match):
        build("softki", D, init=(x, y), **{"num_inducing": M, **options})


def test_bad_inputs_raise():
    x, y = toy_data()
    model = small_model(x, y)
    with pytest.raises(ValueError, match="regression"):
        build("softki", D, task="classification", init=(x, (y > 0).long()))
    with pytest.raises(ValueError, match="features|columns|num_dims|X"):
        model.condition(x[:, :2], y)
    with pytest.raises(ValueError, match="probes"):
        model.condition(x, y, probes=torch.randn(5, 2))


def test_float32_matches_float64():
    """The QR posterior in float32 (β² = 1e-3, the paper's setting) stays close to float64's."""
    x, y = toy_data(300, d=5)
    x_test, _ = toy_data(50, d=5, seed=1)
    model = small_model(x, y, num_inducing=32, noise=1e-3)
    with torch.no_grad():
        ref = model.predict(model.condition(x, y), x_test)
        model32 = model.to(torch.float32)
        x32, y32 = x.float(), y.float()
        pred = model32.predict(model32.condition(x32, y32), x_test.float())
        loss = model32.loss(model32.condition(x32, y32))
    assert pred.mean.dtype == torch.float32 and bool(torch.isfinite(loss))
    # float32 rounding amplified by 1/β² = 1e3 in Ĉ: agreement to ~1e-3 of the target scale.
    torch.testing.assert_close(pred.mean.double(), ref.mean, rtol=0, atol=5e-3)
    torch.testing.assert_close(pred.variance.double(), ref.variance, rtol=0, atol=5e-3)


def test_gp_regressor_end_to_end():
    """GPRegressor(method='softki') trains on a smooth function and predicts it."""
    x, y = toy_data(400, d=2)
    x_test, y_test = toy_data(100, d=2, seed=1)
    reg = GPRegressor(method="softki", epochs=20, lr=0.05, batch_size=128, num_inducing=32,
                      dtype="float64")
    reg.fit(x.numpy(), y.numpy())
    mean, std = reg.predict(x_test.numpy(), return_std=True)
    rmse = float(((torch.as_tensor(mean) - y_test) ** 2).mean().sqrt())
    assert rmse < 0.5 * float(y_test.std())
    assert bool((torch.as_tensor(std) > 0).all())
