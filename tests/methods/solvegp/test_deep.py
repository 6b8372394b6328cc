"""Deep GPs of SOLVE-GP layers: the doubly stochastic bound against quadrature over the hidden
layer, the hidden layer's layout against a convolution, the prediction's mixture against the
output layer alone, gradients, and the deep convolutional model through the user's paths."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpscale.distributions import Predictive
from gpscale.methods.solvegp import build_solvegp
from gpscale.methods.solvegp.conv import build_conv_solvegp, build_conv_svgp
from gpscale.methods.solvegp.deep import DeepSolveGP, build_hidden_layer, mixture
from gpscale.methods.solvegp.images import ImageShape, PatchGeometry


def _vector_dgp(seed: int = 0) -> tuple[DeepSolveGP, torch.Tensor, torch.Tensor]:
    """A two-layer regression deep GP on 1-D inputs: one hidden channel, then SOLVE-GP, with a
    random q in both layers so that every term of the bound is exercised."""
    g = torch.Generator().manual_seed(seed)
    x = torch.linspace(-2, 2, 40, dtype=torch.float64)[:, None]
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(40, generator=g, dtype=torch.float64)
    hidden, h = build_hidden_layer(x, in_dims=1, geometry=None, channels=1, num_inducing=4,
                                   num_orthogonal=3, num_data=40, kernel="rbf", whiten=True,
                                   jitter=1e-6, seed=seed, kmeans_max_points=1000)
    output = build_solvegp(1, init=(h, y), num_inducing=4, num_orthogonal=3, kernel="rbf")
    model = DeepSolveGP([hidden], output, num_dims=1, num_predict_samples=7, seed=seed)
    with torch.no_grad():
        for gp in model.layers:
            for p in (gp.q_mean_u, gp.q_mean_v):
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            for p in (gp.q_chol_u, gp.q_chol_v):
                p.copy_(torch.tril(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
                        + 0.6 * torch.eye(p.shape[-1], dtype=p.dtype))
    return model, x, y


def _gauss_hermite_ell(model: DeepSolveGP, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """E over the hidden layer's marginal at each x_n (100-node Gauss–Hermite) of the output
    layer's closed-form expected log-likelihood: the quantity the sampler estimates."""
    state = model.condition(x, y)
    hidden, out = model.hidden[0], model.output
    mean, var = hidden.gp.marginals(state.q[0], hidden.gp.projections(state.factors[0], x))
    mean = mean[0] + (x @ hidden.projection)[:, 0]
    nodes, weights = (torch.as_tensor(a, dtype=torch.float64)
                      for a in __import__("numpy").polynomial.hermite.hermgauss(100))
    h = mean[:, None] + math.sqrt(2) * var[0].sqrt()[:, None] * nodes  # (n, K)
    m, v = out.marginals(state.q[1], out.projections(state.factors[1], h.reshape(-1, 1)))
    ell = -0.5 * torch.log(2 * math.pi * out.noise) \
        - 0.5 * ((y.repeat_interleave(100) - m[0]).square() + v[0]) / out.noise
    return (ell.reshape(-1, 100) @ weights / math.sqrt(math.pi)).mean()


def test_doubly_stochastic_bound_matches_quadrature_over_the_hidden_layer():
    model, x, y = _vector_dgp()
    with torch.no_grad():
        reference = _gauss_hermite_ell(model, x, y)
    with torch.no_grad():
        state = model.condition(x, y)
        g = torch.Generator().manual_seed(1)
        draws = torch.stack([model.expected_log_lik(state, g) for _ in range(4000)]).detach()
    error = draws.std() / math.sqrt(len(draws))
    assert abs(float(draws.mean() - reference)) < 4 * float(error)
    assert float(draws.std()) > 1e-3  # the hidden layer's draws are random: the check can fail


def test_bound_is_kl_minus_expected_log_lik_summed_over_layers():
    model, x, y = _vector_dgp()
    with torch.no_grad():
        state = model.condition(x, y)
        kl = sum(gp.kl(type("S", (), {"q": q})) for gp, q in zip(model.layers, state.q,
                                                                  strict=True))
        g1, g2 = (torch.Generator().manual_seed(5) for _ in range(2))
        loss = model.loss(state, g1)
        ell = model.expected_log_lik(state, g2)
    torch.testing.assert_close(loss, kl - ell, rtol=1e-12, atol=1e-12)


def test_a_deterministic_hidden_layer_predicts_as_the_output_layer_on_its_mean():
    model, x, y = _vector_dgp()
    with torch.no_grad():
        model.hidden[0].gp.kernel.outputscale = 1e-24  # the hidden GP vanishes: h = x P + c
        model.hidden[0].gp.mean.constant.fill_(0.3)
        pred = model.predict(None, x)
        h = x @ model.hidden[0].projection + 0.3
        alone = model.output.predict(None, h)
    # the draws keep a standard deviation of at least 1e-5 (the variance floor)
    torch.testing.assert_close(pred.mean, alone.mean, rtol=0, atol=1e-4)
    torch.testing.assert_close(pred.variance, alone.variance, rtol=0, atol=1e-4)


def test_prediction_is_the_mixture_of_the_samples():
    model, x, y = _vector_dgp()
    with torch.no_grad():
        pred = model.predict(None, x[:5])
        again = model.predict(None, x[:5])
    torch.testing.assert_close(pred.mean, again.mean, rtol=0, atol=0)  # seeded samples
    # the mixture's moments: law of total variance, probabilities averaged
    stacked = Predictive(mean=torch.tensor([1.0, 2.0, 3.0, 3.0, 2.0, 1.0]),
                         variance=torch.tensor([1.0, 1.0, 1.0, 2.0, 2.0, 2.0]),
                         probs=torch.tensor([[0.2, 0.8]] * 3 + [[0.6, 0.4]] * 3))
    mixed = mixture(stacked, 2, 3)
    torch.testing.assert_close(mixed.mean, torch.tensor([2.0, 2.0, 2.0]))
    torch.testing.assert_close(mixed.variance, torch.tensor([2.5, 1.5, 2.5]))
    torch.testing.assert_close(mixed.probs, torch.tensor([[0.4, 0.6]] * 3))


def test_hidden_layer_layout_is_a_convolution():
    g = torch.Generator().manual_seed(0)
    image = ImageShape(7, 6, 2)
    geometry = PatchGeometry(image, 3, 2, 1)
    x = torch.rand(30, image.size, generator=g, dtype=torch.float64)
    layer, mean_out = build_hidden_layer(x, in_dims=image.size, geometry=geometry, channels=4,
                                         num_inducing=5, num_orthogonal=5, num_data=30,
                                         kernel="rbf", whiten=True, jitter=None, seed=0,
                                         kmeans_max_points=1000)
    filters = layer.projection.mT.reshape(4, 2, 3, 3)  # (C_out, C_in, k, k): unfold's order
    images = x.reshape(30, 7, 6, 2).permute(0, 3, 1, 2)
    conv = F.conv2d(images, filters, stride=2, padding=1)  # (b, C_out, rows, cols)
    assert layer.out_shape() == ImageShape(*conv.shape[2:], 4)
    torch.testing.assert_close(mean_out, conv.permute(0, 2, 3, 1).reshape(30, -1))


def _images(n: int = 80, side: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three classes of grey images: a bright row, a bright column, or a bright diagonal."""
    g = torch.Generator().manual_seed(seed)
    x = 0.2 * torch.rand(n, side, side, generator=g, dtype=torch.float64)
    y = torch.arange(n) % 3
    where = torch.randint(1, side - 1, (n,), generator=g)
    for i in range(n):
        if y[i] == 0:
            x[i, where[i], :] += 0.8
        elif y[i] == 1:
            x[i, :, where[i]] += 0.8
        else:
            x[i] += 0.8 * torch.eye(side, dtype=torch.float64)
    return x.reshape(n, -1), y


@pytest.mark.parametrize("layers", [2, 3])
def test_deep_conv_architectures(layers):
    x, y = _images()
    model = build_conv_solvegp(64, init=(x, y), layers=layers, patch_size=3, stride=1,
                               num_inducing=6, hidden_inducing=5, hidden_channels=3)
    assert isinstance(model, DeepSolveGP) and len(model.hidden) == layers - 1
    assert model.hidden[0].out_shape() == ImageShape(6, 6, 3)
    if layers == 3:
        assert model.hidden[1].out_shape() == ImageShape(2, 2, 3)  # 4 × 4 at stride 2 on 6 × 6
    assert [gp.orthogonal_points.shape[1] for gp in model.layers] == [5] * (layers - 1) + [6]
    svgp = build_conv_svgp(64, init=(x, y), layers=layers, patch_size=3, stride=1,
                           num_inducing=6, hidden_inducing=5)
    assert all(gp.orthogonal_points.shape[1] == 0 for gp in svgp.layers)
    with torch.no_grad():
        pred = model.predict(None, x[:9])
    torch.testing.assert_close(pred.probs.sum(1), torch.ones(9, dtype=torch.float64))


def test_gradients_of_the_deep_conv_bound_match_central_differences():
    x, y = _images(n=12, side=5)
    model = build_conv_solvegp(25, init=(x, y), layers=2, patch_size=2, stride=1,
                               num_inducing=3, num_orthogonal=2, hidden_inducing=3,
                               hidden_orthogonal=2, hidden_channels=2, kmeans_max_points=500)
    with torch.no_grad():
        model.hidden[0].gp.q_mean_u.normal_(0, 0.3)
    hidden = model.hidden[0].gp
    params = [hidden.q_mean_u, hidden.kernel.base_kernel.raw_lengthscale,
              model.output.kernel.weights, model.output.q_chol_v]

    def bound():  # the same draws every time
        return model.loss(model.condition(x, y), torch.Generator().manual_seed(3))

    grads = torch.autograd.grad(bound(), params)
    g = torch.Generator().manual_seed(7)
    step = 1e-6
    for param, grad in zip(params, grads, strict=True):
        direction = torch.randn(param.shape, generator=g, dtype=torch.float64)
        with torch.no_grad():
            param.add_(step * direction)
            plus = bound()
            param.sub_(2 * step * direction)
            minus = bound()
            param.add_(step * direction)
        numeric = float(plus - minus) / (2 * step)
        assert numeric == pytest.approx(float((grad * direction).sum()), rel=1e-5, abs=1e-8)


def test_layers_outside_the_architectures_are_refused():
    x, y = _images(n=30)
    with pytest.raises(ValueError, match="layers must be 1, 2 or 3"):
        build_conv_solvegp(64, init=(x, y), layers=4, patch_size=3, num_inducing=4)


def test_fit_save_load_predict_of_a_deep_model(tmp_path, data_root, monkeypatch):
    import json

    from gpscale.cli.__main__ import main
    from gpscale.data.datasets import load_dataset
    from gpscale.io import load

    monkeypatch.setenv("GPSCALE_DATA", str(data_root))
    out = tmp_path / "run"
    assert main(["fit", "--dataset", "mnist", "--method", "conv-solvegp", "-o", "layers=2",
                 "-o", "num_inducing=8", "-o", "hidden_inducing=6", "-o", "hidden_channels=3",
                 "--data-option", "num_train=128", "--data-option", "num_test=32",
                 "--epochs", "2", "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    model = load(out / "model.pt")
    assert model.options["layers"] == 2 and isinstance(model, DeepSolveGP)
    data = load_dataset("mnist", num_train=128, num_test=32)
    with torch.no_grad():
        probs = model.predict(None, data.x_test.to(torch.float32)).probs
    accuracy = float((probs.argmax(1) == data.y_test).double().mean())
    assert accuracy == pytest.approx(metrics["test_accuracy"], abs=1e-9)  # the same samples
