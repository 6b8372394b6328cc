"""Kernel expressions: the grammar (every error one line naming the position), the GPyTorch
composition it builds (values and gradients against GPyTorch's own operators in float64), the
conversion of start values to standardised units, and scikit-learn's log marginal likelihood
of the Mauna Loa kernel."""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import torch

from gpscale.kernels import kernel_matrix, make_kernel
from gpscale.kernels.algebra import KernelSyntaxError, Leaf, parse_kernel
from gpscale.kernels.compose import build_kernel, standardised


@pytest.mark.parametrize("text, canonical", [
    ("rbf", "rbf"),
    ("RBF(0,1)*periodic(2)+matern32(3:)", "rbf(0, 1) * periodic(2) + matern32(3:)"),
    ("rq(:2, alpha=0.5) + linear", "rq(:2, alpha=0.5) + linear"),
    ("rbf(0) * (periodic(1) + constant)", "rbf(0) * periodic(1) + rbf(0) * constant"),
    ("rbf('my col', temp)", "rbf('my col', temp)"),
    ("poly(0, degree=3, offset=0)", "poly(0, degree=3, offset=0)"),
])
def test_canonical_text_round_trips(text, canonical):
    spec = parse_kernel(text)
    assert spec.text == canonical
    assert parse_kernel(spec.text) == spec


@pytest.mark.parametrize("text, position, what", [
    ("rbf(0) * periodc(2)", 10, "unknown kernel 'periodc'"),
    ("rbf(0", 6, "expected ')'"),
    ("rbf(0) +", 9, "expected a kernel"),
    ("rbf(0) rbf(1)", 8, "expected '+', '*' or the end"),
    ("rbf(lengthscale=-1)", 17, "must be a positive number"),
    ("linear(0, period=2)", 11, "linear takes no 'period'"),
    ("rbf(0.5)", 5, "a column index is a whole number"),
    ("rbf(0) ^ 2", 8, "unexpected character '^'"),
])
def test_errors_name_the_position(text, position, what):
    with pytest.raises(KernelSyntaxError) as err:
        parse_kernel(text)
    message = str(err.value)
    assert "\n" not in message
    assert f"position {position}:" in message and what in message


def test_columns_resolve_by_index_name_and_slice():
    spec = parse_kernel("rbf(0, temp) * matern52(2:) + rq(:2) + rbf(-1)")
    names = ["time", "temp", "a", "b"]
    assert spec.resolve(4, names) == [[[0, 1], [2, 3]], [[0, 1]], [[3]]]
    with pytest.raises(ValueError, match="no input named 'pressure'"):
        parse_kernel("rbf(pressure)").resolve(4, names)
    with pytest.raises(ValueError, match="outside 0..3"):
        parse_kernel("rbf(4)").resolve(4, names)
    with pytest.raises(ValueError, match="named twice"):
        parse_kernel("rbf(0, time)").resolve(4, names)


def _reference(x: torch.Tensor) -> gpytorch.kernels.Kernel:
    """The same kernel as "rbf(0,1) * periodic(2) + matern32(2:) + linear(3)", written with
    GPyTorch's operators directly."""
    k = gpytorch.kernels
    rbf = k.RBFKernel(ard_num_dims=2, active_dims=torch.tensor([0, 1]))
    per = k.PeriodicKernel(ard_num_dims=1, active_dims=torch.tensor([2]))
    mat = k.MaternKernel(nu=1.5, ard_num_dims=2, active_dims=torch.tensor([2, 3]))
    lin = k.LinearKernel(active_dims=torch.tensor([3]))
    return (k.ScaleKernel(rbf * per) + k.ScaleKernel(mat) + k.ScaleKernel(lin)).double()


def test_values_and_gradients_match_gpytorch_composition():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 4, generator=g, dtype=torch.float64)
    ours = build_kernel("rbf(0,1) * periodic(2) + matern32(2:) + linear(3)", 4).double()
    ref = _reference(x)
    with torch.no_grad():  # the same hyperparameters, drawn at random
        for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
            a.copy_(torch.randn(a.shape, generator=g, dtype=a.dtype))
            b.copy_(a)
    K, R = kernel_matrix(ours, x, x), ref(x, x).to_dense()
    torch.testing.assert_close(K, R, rtol=1e-10, atol=1e-10)
    w = torch.randn(30, 30, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((K * w).sum(), list(ours.parameters()))
    refs = torch.autograd.grad((R * w).sum(), list(ref.parameters()))
    for a, b in zip(grads, refs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_make_kernel_takes_an_expression():
    kernel = make_kernel("rbf(0) + matern12(1)", 2)
    assert isinstance(kernel, gpytorch.kernels.AdditiveKernel)
    with pytest.raises(ValueError, match="unknown kernel 'foo'"):
        make_kernel("foo", 2)


def test_start_values_convert_to_standardised_units():
    spec = standardised("rbf(t, lengthscale=10, outputscale=4) * periodic(t, period=2, "
                        "lengthscale=1.3) + rq(1, alpha=0.7)", names=["t", "u"], num_dims=2,
                        x_scale=[5.0, 2.0], y_var=4.0)
    (rbf, per), (rq,) = spec.terms
    assert rbf == Leaf("rbf", (0,), {"lengthscale": 2.0, "outputscale": 1.0})
    assert per == Leaf("periodic", (0,), {"period": 0.4, "lengthscale": 1.3})  # ℓ unitless
    assert rq == Leaf("rq", (1,), {"alpha": 0.7})
    with pytest.raises(ValueError, match="different scales"):
        standardised("rbf(lengthscale=1)", names=None, num_dims=2, x_scale=[1.0, 2.0])


def test_mauna_loa_kernel_matches_scikit_learn():
    sklearn_gp = pytest.importorskip("sklearn.gaussian_process")
    kernels = pytest.importorskip("sklearn.gaussian_process.kernels")
    g = np.random.default_rng(0)
    t = np.sort(g.uniform(0, 20, 60))[:, None]
    y = 0.3 * t[:, 0] + np.sin(2 * np.pi * t[:, 0]) + 0.1 * g.standard_normal(60)
    sk = (50.0 ** 2 * kernels.RBF(50.0) + 2.0 ** 2 * kernels.RBF(100.0)
          * kernels.ExpSineSquared(1.0, 1.0, periodicity_bounds="fixed")
          + 0.5 ** 2 * kernels.RationalQuadratic(1.0, 1.0) + 0.1 ** 2 * kernels.RBF(0.1)
          + kernels.WhiteKernel(0.04))
    reference = sklearn_gp.GaussianProcessRegressor(sk, optimizer=None).fit(t, y)
    lml = reference.log_marginal_likelihood_value_
    ours = build_kernel("rbf(lengthscale=50, outputscale=2500) + rbf(lengthscale=100, "
                        "outputscale=4) * periodic(lengthscale=1, period=1) + "
                        "rq(lengthscale=1, alpha=1, outputscale=0.25) + "
                        "rbf(lengthscale=0.1, outputscale=0.01)", 1).double()
    x = torch.as_tensor(t)
    K = kernel_matrix(ours, x, x) + 0.04 * torch.eye(60, dtype=torch.float64)
    mvn = torch.distributions.MultivariateNormal(torch.zeros(60, dtype=torch.float64), K)
    value = float(mvn.log_prob(torch.as_tensor(y)).detach())
    assert value == pytest.approx(lml, rel=1e-8)
    assert math.isfinite(value)
