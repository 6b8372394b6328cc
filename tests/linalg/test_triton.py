"""The Triton kernel product (gpscale.linalg.triton), run by Triton's interpreter on the CPU
(tests/conftest.py sets TRITON_INTERPRET=1 where no GPU is present): every profile against
dense float64, ragged shapes, k = 1 to more than one program's columns, d from 1 to 128, exact
dimensions, gradcheck, the kernel_matmul backend with hyperparameter gradients, and the
fallback to the PyTorch tiles when a launch fails."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._profiles import DENSE

from gpscale.kernels import kernel_matmul, make_kernel
from gpscale.linalg import triton as triton_kernels

pytest.importorskip("triton")
if not triton_kernels.available(torch.zeros(1)):
    pytest.skip("the Triton interpreter is off (TRITON_INTERPRET=1 is set by conftest only "
                "where torch sees no GPU)", allow_module_level=True)

PROFILES = tuple(DENSE)


def _dense(profile: str, z1, z2, v):
    """Φ V in float64 from cdist: the reference."""
    r = torch.cdist(z1.double(), z2.double())
    return DENSE[profile](r) @ v.double()


def _inputs(generator, B, n1, n2, d, k, dtype=torch.float64):
    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)
    return draw(B, n1, d), draw(B, n2, d), draw(B, n2, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_matches_dense_float64(profile, dtype, generator):
    z1, z2, v = _inputs(generator, 2, 37, 29, 3, 5, dtype)  # ragged against 16-wide tiles
    out = triton_kernels.stationary_product(profile, z1, z2, v)
    ref = _dense(profile, z1, z2, v)
    assert out.dtype == dtype and out.shape == (2, 37, 5)
    error = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    assert error <= (1e-5 if dtype == torch.float32 else 1e-12), error


@pytest.mark.parametrize(("n1", "n2", "d", "k"), [
    (1, 1, 1, 1), (20, 17, 1, 1), (33, 40, 5, 130), (18, 21, 128, 3), (16, 32, 16, 64)],
    ids=["single", "d1-k1", "k130", "d128", "exact-tiles"])
def test_shapes_against_dense(n1, n2, d, k, generator):
    z1, z2, v = _inputs(generator, 1, n1, n2, d, k)
    torch.testing.assert_close(triton_kernels.stationary_product("matern52", z1, z2, v),
                               _dense("matern52", z1, z2, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("profile", PROFILES)
def test_gradcheck(profile, generator):
    z1, z2, v = (t.requires_grad_() for t in _inputs(generator, 2, 9, 7, 3, 4))
    assert torch.autograd.gradcheck(
        lambda a, b, c: triton_kernels.stationary_product(profile, a, b, c), (z1, z2, v),
        eps=1e-6, atol=1e-6)


@pytest.mark.parametrize(("d", "k", "exact"), [(4, 7, 2), (3, 70, 3), (2, 1, 1)])
def test_exact_dimensions_and_many_columns_against_the_fused_rule(d, k, exact, generator):
    """The last ``exact`` dimensions (offset by 10³) as differences, k beyond one program's
    64 columns: values and all three gradients as the fused PyTorch rule gives them."""
    from gpscale.linalg import fused
    from gpscale.linalg.chunked import chunked_product

    z1, z2, v = _inputs(generator, 1, 25, 19, d, k)
    z1[..., -exact:] += 1e3
    z2[..., -exact:] += 1e3
    grad = torch.randn(1, 25, k, generator=generator, dtype=torch.float64)
    results = []
    for product in (lambda a, b, c: triton_kernels.stationary_product("matern32", a, b, c,
                                                                       exact),
                    lambda a, b, c: chunked_product(fused.stationary_rule(
                        "matern32", compiled=False, exact=exact), a, b, c, chunk_size=8)):
        leaves = [t.clone().requires_grad_() for t in (z1, z2, v)]
        out = product(*leaves)
        results.append([out, *torch.autograd.grad(out, leaves, grad)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9 * want.abs().max().item())


@pytest.mark.parametrize("ard", [True, False])
def test_kernel_matmul_backend_with_hyperparameter_gradients(ard, generator):
    """backend='triton' against 'eager' (GPyTorch): values and the gradients of the inputs,
    right-hand sides, lengthscales and outputscale."""
    kernel = make_kernel("matern32", 3, ard=ard).double()
    x1, x2, v = (t[0] for t in _inputs(generator, 1, 23, 31, 3, 6))
    results = []
    for backend in ("triton", "eager"):
        leaves = [t.clone().requires_grad_() for t in (x1, x2, v)]
        params = list(kernel.parameters())
        out = kernel_matmul(kernel, *leaves, backend=backend)
        results.append([out, *torch.autograd.grad(out.square().sum(), [*leaves, *params])])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_a_failed_launch_warns_once_and_the_tiles_take_over(generator, monkeypatch):
    z1, z2, v = (t.requires_grad_() for t in _inputs(generator, 1, 12, 10, 2, 3))

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler for this device")

    monkeypatch.setattr(triton_kernels, "_FAILED", [])
    monkeypatch.setattr(triton_kernels, "_launch_forward", broken)
    with pytest.warns(RuntimeWarning, match="no compiler for this device.*compiled PyTorch"):
        out = triton_kernels.stationary_product("rbf", z1, z2, v)
    torch.testing.assert_close(out, _dense("rbf", z1, z2, v).detach(), rtol=1e-12, atol=1e-12)
    out.sum().backward()  # later launches (the backward) go to the tiles without a warning
    assert z1.grad is not None and triton_kernels._FAILED


def test_not_available_without_a_gpu_or_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not triton_kernels.available(torch.zeros(1))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_kernels.available(torch.zeros(1))
    assert not triton_kernels.available(torch.zeros(1, dtype=torch.float16))
