"""The exact GP's hand-written Cholesky loss against dense float64 and GPyTorch's own."""

from __future__ import annotations

import pytest
import torch

from gpscale.errors import NumericalError
from gpscale.methods import build
from gpscale.methods.baselines._cholesky_nll import cholesky_nll
from gpscale.methods.baselines._exactgp import negative_mll

from ._dense import gaussian_logpdf


def _spd(n: int, generator: torch.Generator) -> torch.Tensor:
    a = torch.randn(n, n, generator=generator, dtype=torch.float64)
    return a @ a.T / n + 0.1 * torch.eye(n, dtype=torch.float64)


def test_value_is_the_dense_gaussian_log_density(generator):
    """−log N(r; 0, K + σ²I)/n."""
    K, r = _spd(12, generator), torch.randn(12, generator=generator, dtype=torch.float64)
    noise = torch.tensor(0.3, dtype=torch.float64)
    expected = -gaussian_logpdf(r, torch.zeros_like(r), K + noise * torch.eye(12)) / 12
    got = cholesky_nll(K, noise, r, jitter=1e-8, max_tries=3)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


def test_gradients_pass_gradcheck(generator):
    """½(K̂⁻¹ − ααᵀ)/n, tr of it for σ², α/n for r — by finite differences (symmetric K)."""
    K0, r = _spd(6, generator), torch.randn(6, generator=generator, dtype=torch.float64)
    noise = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    a = torch.randn(6, 6, generator=generator, dtype=torch.float64, requires_grad=True)
    r.requires_grad_(True)

    def f(a, noise, r):  # K symmetric by construction, as every kernel matrix is
        return cholesky_nll(K0 + (a + a.T) / 20, noise, r, jitter=1e-8, max_tries=3)

    assert torch.autograd.gradcheck(f, (a, noise, r))


@pytest.mark.parametrize("kernel", ["matern32", "rbf"])
def test_exact_loss_equals_gpytorch_mll_value_and_gradients(toy_regression, kernel):
    """The exact key's loss and its gradients equal GPyTorch's ExactMarginalLogLikelihood's."""
    x, y = toy_regression
    model = build("exact", 2, init=(x, y), kernel=kernel, noise=0.03)
    model.kernel.base_kernel.lengthscale = torch.tensor([0.7, 1.9])
    state = model.condition(x, y)
    params = [p for _, p in model.named_parameters()]
    ours = model.loss(state)
    with model.settings.context():
        theirs = negative_mll(state)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    for g, e in zip(torch.autograd.grad(ours, params), torch.autograd.grad(theirs, params),
                    strict=True):
        torch.testing.assert_close(g, e, rtol=1e-7, atol=1e-10)


def test_singular_matrix_is_factorised_with_jitter_and_a_warning():
    """K = vvᵀ (rank one) with σ² = 0 fails the plain Cholesky; the first retry's jitter 1e-6
    works and is named: the loss is that of K + 1e-6 I."""
    v = torch.arange(1.0, 5.0, dtype=torch.float64)
    r = torch.tensor([0.3, -0.1, 0.2, 0.5], dtype=torch.float64)
    zero = torch.tensor(0.0, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="jitter of order 1e-06"):
        got = cholesky_nll(torch.outer(v, v), zero, r, jitter=1e-6, max_tries=3)
    shifted = torch.outer(v, v) + 1e-6 * torch.eye(4, dtype=torch.float64)
    expected = -gaussian_logpdf(r, torch.zeros_like(r), shifted) / 4
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)


def test_indefinite_matrix_raises_naming_size_and_jitter():
    """An eigenvalue −1 survives jitter up to 1e-6: a NumericalError with shape and jitter;
    the input is untouched."""
    K = torch.diag(torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64))
    r, zero = torch.ones(3, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    with pytest.raises(NumericalError, match=r"\(3, 3\) \(torch.float64\).*1e-06"):
        cholesky_nll(K, zero, r, jitter=1e-8, max_tries=3)
    assert K[1, 1] == -1.0
