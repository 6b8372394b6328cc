"""The fused product of a composed stationary kernel (:mod:`gpscale.linalg.composed`) against
GPyTorch's own composition of the same expression: values and gradients in float64, the
backend ``auto`` picks for it, and what it does not take."""

from __future__ import annotations

import pytest
import torch

from gpscale.kernels import build_kernel, composed_terms, kernel_matmul, select_backend

EXPRESSIONS = [
    "rbf(0, 1) + matern32(2, 3)",
    "matern52(0) * rbf(1, 2, lengthscale=0.7) + matern12(3, outputscale=0.3)",
    "rbf(0:2) * matern32(2:) ",
]


def _data(n1=70, n2=90, d=4, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n1, d, dtype=torch.float64, generator=g),
            torch.randn(n2, d, dtype=torch.float64, generator=g),
            torch.randn(n2, k, dtype=torch.float64, generator=g))


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_values_and_gradients_match_gpytorch(text):
    kernel = build_kernel(text, 4).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # random hyperparameters away from the start values
        for p in kernel.parameters():
            p.add_(0.3 * torch.randn(p.shape, dtype=p.dtype, generator=g))
    x1, x2, v = _data()
    assert select_backend(kernel, x1, x2) == "composed"
    x1.requires_grad_(True)
    v.requires_grad_(True)
    out = kernel_matmul(kernel, x1, x2, v, chunk_size=16)
    ref = kernel(x1, x2).to_dense() @ v
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(out.shape, dtype=torch.float64, generator=g)
    params = [x1, v, *kernel.parameters()]
    got = torch.autograd.grad((out * w).sum(), params)
    want = torch.autograd.grad((ref * w).sum(), params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_the_symmetric_product_at_coincident_points_has_finite_gradients():
    kernel = build_kernel("matern12(0, 1) + matern32(2, 3)", 4).double()
    x, _, v = _data(n1=40, n2=40)
    out = kernel_matmul(kernel, x, x, v[:40])
    # the reference from exact differences (GPyTorch's distance expansion leaves ~1e-8 at 0)
    (a, b) = (kernel.kernels[0], kernel.kernels[1])
    r1 = torch.cdist(x[:, :2] / a.base_kernel.lengthscale, x[:, :2] / a.base_kernel.lengthscale,
                     compute_mode="donot_use_mm_for_euclid_dist")
    r2 = 3**0.5 * torch.cdist(x[:, 2:] / b.base_kernel.lengthscale,
                              x[:, 2:] / b.base_kernel.lengthscale,
                              compute_mode="donot_use_mm_for_euclid_dist")
    K = a.outputscale * torch.exp(-r1) + b.outputscale * (1 + r2) * torch.exp(-r2)
    torch.testing.assert_close(out, K.detach() @ v[:40], rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in kernel.parameters())


def test_other_kernels_are_not_taken():
    assert composed_terms(build_kernel("rbf(0) + periodic(1)", 2)) is None
    assert composed_terms(build_kernel("rbf(0) * linear(1)", 2)) is None
    batched = build_kernel("rbf(0) + rbf(1)", 2, batch_shape=torch.Size([3]))
    assert composed_terms(batched) is None
    x1, x2, v = _data(d=2)
    assert select_backend(build_kernel("rbf(0) + periodic(1)", 2), x1, x2) == "eager"
    with pytest.raises(ValueError, match="backend 'composed' takes a sum"):
        kernel_matmul(build_kernel("rbf(0) + periodic(1)", 2), x1, x2, v, backend="composed")
