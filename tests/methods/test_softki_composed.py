"""SoftKI with a kernel expression: K_zz is the composed kernel, and the softmax distances take
each input's lengthscale from the leaves on it (1/ℓ² summed), the median for an input only a
leaf without lengthscale reads, ∞ for one no leaf reads."""

from __future__ import annotations

import math

import pytest
import torch

from gpscale.io import load, save
from gpscale.kernels import build_kernel, kernel_matrix
from gpscale.methods import build
from gpscale.methods.softki.weights import composed_lengthscale, distance_scale


def test_each_input_gets_the_lengthscale_of_its_leaves():
    kernel = build_kernel("rbf(0, lengthscale=2) * matern32(0, 1, lengthscale=0.5) "
                          "+ linear(2)", 4).double()
    ell = composed_lengthscale(kernel, 4)
    first = (1 / 2**2 + 1 / 0.5**2) ** -0.5  # input 0: both leaves' curvatures add
    assert float(ell[0]) == pytest.approx(first)
    assert float(ell[1]) == pytest.approx(0.5)
    assert float(ell[2]) == pytest.approx(float(torch.tensor([first, 0.5]).median()))
    assert math.isinf(float(ell[3]))  # no leaf reads input 3: out of the distances
    relative = distance_scale(kernel, "relative", num_dims=4)
    # relative: ℓ · rms(1/ℓ), the infinite one contributing 0 to the mean
    rms = float((ell.reciprocal().square().mean()).sqrt())
    torch.testing.assert_close(relative, ell * rms)
    with pytest.raises(ValueError, match="no leaf of this kernel has one"):
        composed_lengthscale(build_kernel("linear(0) + constant", 2), 2)


def test_softki_trains_predicts_and_round_trips_with_an_expression(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(400, 3, generator=g, dtype=torch.float64) * 4
    y = (torch.sin(2 * math.pi * x[:, 0]) + 0.3 * x[:, 1] + torch.cos(x[:, 2])
         + 0.05 * torch.randn(400, generator=g, dtype=torch.float64))
    text = "periodic(0, period=1) + linear(1) + rbf(2)"
    model = build("softki", 3, init=(x, y), kernel=text, num_inducing=48).double()
    state = model.condition(x, y)
    loss = model.loss(state)
    loss.backward()
    periodic = model.kernel.kernels[0].base_kernel
    assert periodic.raw_period_length.grad is not None
    with torch.no_grad():  # K_zz is the composed kernel
        z = model.inducing_points
        torch.testing.assert_close(model.kernel(z, z).to_dense(), kernel_matrix(
            model.kernel, z, z))
        pred = model.predict(model.condition(x, y), x[:20])
    assert torch.isfinite(pred.mean).all() and (pred.variance >= 0).all()
    save(model, tmp_path / "m.pt", data=(x, y))
    loaded = load(tmp_path / "m.pt")
    assert loaded.options["kernel"] == model.options["kernel"]
    with torch.no_grad():
        again = loaded.predict(loaded.condition(x, y), x[:20])
    torch.testing.assert_close(again.mean, pred.mean, rtol=0, atol=0)
