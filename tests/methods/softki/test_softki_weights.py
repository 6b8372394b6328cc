"""SoftKI's softmax interpolation weights (gpscale.methods.softki.weights; notes/003 §6.1, §6.2):
softmax of Euclidean distances and its temperature limits, distances that follow the kernel's
lengthscales; the old expansion's numbers near the data, the exact limit far away, and the
hand-written backward (issue #46)."""

from __future__ import annotations

import math

import pytest
import torch

import gpscale.methods.softki  # noqa: F401  (registers the key "softki")
from gpscale.methods.softki import SoftKI, build_softki
from gpscale.methods.softki.weights import SoftmaxInterpolation, _ShiftedDistance
from gpscale.training import FitConfig, fit

from ._dense import TOL, D, M, N, small_model, toy_data


def _expansion(x, z, tau):
    """The weights as computed before: softmax(−√(‖x‖² − 2xᵀz + ‖z‖²)/τ) on centred inputs."""
    shift = z.mean(0, keepdim=True)
    xs, zs = x - shift, z - shift
    sq = xs.square().sum(-1, keepdim=True) - 2 * xs @ zs.mT + zs.square().sum(-1)[None, :]
    return torch.softmax(-sq.clamp_min(torch.finfo(sq.dtype).tiny).sqrt() / tau, -1)


def test_weights_near_the_data_are_the_expansions(generator):
    """Rows within the data (one of them on an inducing point) keep the old numbers."""
    z = torch.randn(12, 4, generator=generator, dtype=torch.float64) * 2
    x = torch.cat([torch.randn(30, 4, generator=generator, dtype=torch.float64) * 2, z[:3]])
    for tau in (1.0, 0.3):
        torch.testing.assert_close(SoftmaxInterpolation(tau)(x, z), _expansion(x, z, tau),
                                   rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_far_rows_reach_the_projection_limit(dtype, generator):
    """‖x‖ → ∞ along x̂: softmax_j(x̂ᵀz_j/τ), finite and the same at every magnitude (the
    expansion gave rounding noise at 10²⁰ and NaN at 10²⁰⁰); other rows are unaffected."""
    z = torch.randn(6, 2, generator=generator, dtype=dtype)
    direction = torch.tensor([0.6, -0.8], dtype=dtype)
    limit = torch.softmax((z - z.mean(0)) @ direction / 0.5, 0)
    magnitudes = (1e8, 1e20, 1e30, 3e38) if dtype == torch.float32 else (1e8, 1e20, 1e200, 1e300)
    near = torch.randn(3, 2, generator=generator, dtype=dtype)
    x = torch.cat([near, torch.stack([m * direction for m in magnitudes])])
    W = SoftmaxInterpolation(0.5)(x, z)
    assert torch.isfinite(W).all()
    torch.testing.assert_close(W[3:], limit.expand(len(magnitudes), 6), rtol=1e-5, atol=1e-6)
    eps = torch.finfo(dtype).eps  # the batch's vector width may round the last bit apart
    torch.testing.assert_close(W[:3], SoftmaxInterpolation(0.5)(near, z), rtol=8 * eps,
                               atol=eps)


def test_shifted_distance_gradcheck(generator):
    """The hand-written backward, near and far (a row at 10⁴) and on a coincident pair."""
    z = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    x = torch.cat([torch.randn(4, 3, generator=generator, dtype=torch.float64),
                   torch.tensor([[1e4, -2e4, 5e3]], dtype=torch.float64)])
    assert torch.autograd.gradcheck(_ShiftedDistance.apply,
                                    (x.requires_grad_(), z.requires_grad_()))
    value = _ShiftedDistance.apply(x.detach(), z.detach())
    expected = torch.cdist(x.detach(), z.detach()) - (x.detach().square().sum(-1, keepdim=True)
                                                      + 1).sqrt()
    torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_at_coincident_points_are_the_expansions(dtype, generator):
    """A row on an inducing point far from the origin (|x| > 1, so its row unit is > 1): the
    clamped distance has gradient 0 there, as the expansion's clamp gives. Found by the demo:
    a gradient of Ḡ / 1e-19 stopped SoftKI's fit at RMSE 0.35 instead of 0.27."""
    z = (torch.randn(6, 2, generator=generator, dtype=dtype) * 3 + 5).requires_grad_()
    x = torch.cat([torch.randn(5, 2, generator=generator, dtype=dtype) * 3 + 5,
                   z.detach()[:2]]).requires_grad_()
    G = torch.randn(7, 6, generator=generator, dtype=dtype)
    grads = []
    for weights in (SoftmaxInterpolation(0.7), lambda a, b: _expansion(a, b, 0.7)):
        (weights(x, z) * G).sum().backward()
        grads.append((x.grad.clone(), z.grad.clone()))
        x.grad = z.grad = None
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)
    for new, old in zip(*grads, strict=True):
        assert torch.isfinite(new).all()
        torch.testing.assert_close(new, old, **tol)


# --- softmax weights (§6.1, §6.2) --------------------------------------------------------------

def test_weights_are_softmax_of_euclidean_distances():
    """Def. 4.1: W_ij = exp(−‖x_i − z_j‖) / Σ_k exp(−‖x_i − z_k‖); rows sum to 1, in (0, 1)."""
    x, _ = toy_data()
    z = torch.randn(M, D, generator=torch.Generator().manual_seed(1))
    W = SoftmaxInterpolation()(x, z)
    dist = (x[:, None, :] - z[None, :, :]).square().sum(-1).sqrt()
    torch.testing.assert_close(W, torch.exp(-dist) / torch.exp(-dist).sum(1, keepdim=True),
                               **TOL)
    torch.testing.assert_close(W.sum(1), torch.ones(N), **TOL)
    assert bool((W > 0).all() and (W < 1).all())


def test_temperature_to_zero_gives_nearest_point_weights():
    """§6.2: τ → 0 gives one-hot weights on the nearest interpolation point."""
    x, _ = toy_data()
    z = torch.randn(M, D, generator=torch.Generator().manual_seed(1))
    W = SoftmaxInterpolation(1e-4)(x, z)
    nearest = torch.cdist(x, z).argmin(1)
    torch.testing.assert_close(W, torch.eye(M)[nearest], rtol=0, atol=1e-8)


def test_temperature_to_infinity_gives_uniform_weights():
    """§6.2: τ → ∞ gives uniform weights 1/m."""
    x, _ = toy_data()
    z = torch.randn(M, D, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(SoftmaxInterpolation(1e8)(x, z), torch.full((N, M), 1 / M),
                               rtol=0, atol=1e-7)


def test_weights_translation_invariant_and_finite_in_high_dimension():
    """§6.1: invariant to translating x and z together; finite at d = 1000 (log-sum-exp)."""
    x, _ = toy_data()
    z = torch.randn(M, D, generator=torch.Generator().manual_seed(1))
    weights = SoftmaxInterpolation()
    torch.testing.assert_close(weights(x + 5.0, z + 5.0), weights(x, z), rtol=1e-9, atol=1e-12)
    g = torch.Generator().manual_seed(2)
    W = weights(30 * torch.randn(20, 1000, generator=g), 30 * torch.randn(M, 1000, generator=g))
    assert bool(torch.isfinite(W).all())
    torch.testing.assert_close(W.sum(1), torch.ones(20), **TOL)


def _ard_model(distance: str, lengthscale) -> SoftKI:
    x, y = toy_data()
    model = small_model(x, y, ard=True, distance=distance)
    model.kernel.base_kernel.lengthscale = torch.tensor(lengthscale, dtype=x.dtype)
    return model


def test_relative_distance_with_equal_lengthscales_is_the_papers_weights():
    """distance='relative' (the default) rescales inputs by ℓ relative to rms(1/ℓ): with one
    shared lengthscale, whatever its value, the weights are Def. 4.1's exactly."""
    x, _ = toy_data()
    for ell in (0.05, 1.0, 30.0):
        model = _ard_model("relative", [ell] * D)
        z = model.inducing_points.detach()
        torch.testing.assert_close(model.weights(x, z), SoftmaxInterpolation()(x, z), **TOL)
    shared = small_model(*toy_data(), ard=False, lengthscale=0.3)  # one lengthscale, no ARD
    z = shared.inducing_points.detach()
    torch.testing.assert_close(shared.weights(x, z), SoftmaxInterpolation()(x, z), **TOL)


def test_relative_distance_drops_an_input_with_a_huge_lengthscale():
    """An input the kernel finds irrelevant (ℓ → ∞) drops out of the weights, as out of K_zz;
    the Euclidean weights keep it. Scaling every ℓ by a constant changes nothing."""
    x, _ = toy_data()
    model = _ard_model("relative", [0.7, 1.3, 1e9])
    z = model.inducing_points.detach()
    W = model.weights(x, z)
    moved = x.clone()
    moved[:, 2] = 50 * torch.randn(N, generator=torch.Generator().manual_seed(3), dtype=x.dtype)
    torch.testing.assert_close(model.weights(moved, z), W, rtol=1e-6, atol=1e-9)
    euclid = SoftmaxInterpolation()
    assert float((euclid(moved, z) - euclid(x, z)).abs().max()) > 0.1
    # dense reference: distances on the first two inputs rescaled to rms(1/ℓ) = 1
    inv = torch.tensor([1 / 0.7, 1 / 1.3, 0.0], dtype=x.dtype)
    w = inv / inv.square().mean().sqrt()
    dist = ((x[:, None, :] - z[None]) * w).square().sum(-1).sqrt()
    torch.testing.assert_close(W, torch.softmax(-dist, 1), rtol=1e-6, atol=1e-9)
    scaled = _ard_model("relative", [7.0, 13.0, 1e10])
    torch.testing.assert_close(scaled.weights(x, z), W, rtol=1e-6, atol=1e-9)


def test_lengthscale_distance_divides_by_the_lengthscales():
    """distance='lengthscale': Euclidean weights of x/ℓ on z/ℓ."""
    x, _ = toy_data()
    ell = torch.tensor([0.5, 2.0, 1.5], dtype=x.dtype)
    model = _ard_model("lengthscale", ell.tolist())
    z = model.inducing_points.detach()
    torch.testing.assert_close(model.weights(x, z), SoftmaxInterpolation()(x / ell, z / ell),
                               **TOL)
    assert _ard_model("euclidean", ell.tolist()).distance_scale() is None


def test_distance_scaled_weights_pass_gradients_to_the_lengthscales():
    """The weights are differentiable in ℓ (gradcheck, float64), so training moves them."""
    x, _ = toy_data(8)
    z = torch.randn(4, D, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    interp = SoftmaxInterpolation()

    def weights(log_ell):
        ell = log_ell.exp()
        return interp(x, z, ell / ell.reciprocal().square().mean().rsqrt())

    log_ell = torch.tensor([0.1, -0.4, 0.7], dtype=x.dtype, requires_grad=True)
    assert torch.autograd.gradcheck(weights, (log_ell,))


def test_learned_temperature_divides_the_distances_and_gets_a_gradient():
    """learn_temperature: W = softmax(−dist/τ) with τ = exp(log_temperature), trained by the
    objective; without it the model has no such parameter (older saved models load)."""
    x, y = toy_data()
    model = small_model(x, y, ard=False, learn_temperature=True)
    with torch.no_grad():
        model.log_temperature.fill_(math.log(0.4))
    z = model.inducing_points.detach()
    # the model's distances take another (GEMM) path: equal to its rounding, not to TOL
    torch.testing.assert_close(model.weights(x, z), SoftmaxInterpolation(0.4)(x, z),
                               rtol=1e-6, atol=1e-8)
    (grad,) = torch.autograd.grad(model.loss(model.condition(x, y)), model.log_temperature)
    assert math.isfinite(float(grad)) and float(grad) != 0.0
    assert "log_temperature" not in small_model(x, y).state_dict()


def test_default_distances_learn_which_inputs_matter():
    """10 inputs of which 2 carry the signal (a fast relevant32): the default relative distances
    learn it (test RMSE 0.08 of std(y) measured), the paper's Euclidean weights do not (0.78)."""
    g = torch.Generator().manual_seed(0)
    n, d = 800, 10
    x = torch.randn(n + 400, d, generator=g)
    y = torch.sin(2 * x[:, 0]) + torch.cos(2 * x[:, 1]) + 0.05 * torch.randn(n + 400, generator=g)
    (x, xt), (y, yt) = x.split([n, 400]), y.split([n, 400])
    rmse = {}
    for distance in ("relative", "euclidean"):
        torch.manual_seed(0)
        model = build_softki(d, init=(x, y), num_inducing=64, distance=distance)
        fit(model, None, (x, y), FitConfig(lr=0.05, epochs=60, batch_size=256, progress=False))
        model.finalize(x, y)
        with torch.no_grad():
            mean = model.predict(model.condition(x, y), xt).mean
        rmse[distance] = float((mean - yt).square().mean().sqrt() / yt.std())
    assert rmse["relative"] < 0.2 and rmse["euclidean"] > 0.5, rmse


def test_unknown_distance_is_an_error():
    x, y = toy_data()
    with pytest.raises(ValueError, match="unknown distance 'cosine'"):
        small_model(x, y, distance="cosine")
