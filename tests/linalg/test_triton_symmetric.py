"""The Triton kernels' symmetric backward (K(X, X) V, both roles of X in one pass), the
all-differences distances, the compensated sums and the launch overrides; compiled on a GPU
where torch sees one, else run by Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._profiles import DENSE

from gpscale.kernels import kernel_matmul, make_kernel
from gpscale.linalg import triton as triton_kernels

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_kernels.available(torch.zeros(1, device=DEVICE)):
    pytest.skip("the Triton interpreter is off", allow_module_level=True)

PROFILES = tuple(DENSE)


def _dense(profile, z1, z2, v):
    """Φ V from exact differences (cdist's norm expansion would blur D² near 0)."""
    return DENSE[profile](torch.cdist(z1, z2, compute_mode="donot_use_mm_for_euclid_dist")) @ v


def _draw(generator, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(DEVICE, dtype)


@pytest.mark.parametrize("need_v", [True, False], ids=["with-V", "z-only"])
@pytest.mark.parametrize(("n", "d", "k", "exact"), [(37, 3, 5, 0), (50, 4, 64, 2), (21, 2, 70, 1)],
                         ids=["ragged", "k64-exact", "k70-general-path"])
@pytest.mark.parametrize("profile", PROFILES)
def test_symmetric_backward_matches_dense_float64(profile, n, d, k, exact, need_v, generator):
    """Φ(z, z) V and the gradients of z (both roles) and V against autograd through the dense
    float64 product; k = 70 takes the general two-pass path."""
    z, v = _draw(generator, 2, n, d), _draw(generator, 2, n, k)
    z[..., d - exact:] += 50.0  # exact (difference) dimensions far from the origin
    grad = _draw(generator, 2, n, k)
    results = []
    for symmetric in (True, False):
        zl, vl = z.clone().requires_grad_(), v.clone().requires_grad_(need_v)
        if symmetric:
            out = triton_kernels.stationary_product(profile, zl, zl, vl, exact, symmetric=True)
        else:
            out = _dense(profile, zl, zl, vl)
        results.append([out, *torch.autograd.grad(out, [zl, vl] if need_v else [zl], grad)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9 * want.abs().max().item())


@pytest.mark.slow
def test_symmetric_gradcheck(generator):
    z, v = _draw(generator, 1, 11, 3).requires_grad_(), _draw(generator, 1, 11, 4).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, c: triton_kernels.stationary_product("matern52", a, a, c, symmetric=True),
        (z, v), eps=1e-6, atol=1e-6)


def test_kernel_matmul_of_x_with_itself_takes_the_symmetric_pass(generator, monkeypatch):
    """kernel_matmul(k, x, x, v) with the Triton backend: the symmetric backward runs, and the
    gradients of x, v, the lengthscales and the outputscale equal GPyTorch's."""
    calls = []
    real = triton_kernels._launch_backward_symmetric
    monkeypatch.setattr(triton_kernels, "_launch_backward_symmetric",
                        lambda *a: calls.append(1) or real(*a))
    kernel = make_kernel("matern32", 3).to(DEVICE, torch.float64)
    x, v = _draw(generator, 29, 3), _draw(generator, 29, 6)
    results = []
    for backend in ("triton", "eager"):
        xl, vl = x.clone().requires_grad_(), v.clone().requires_grad_()
        out = kernel_matmul(kernel, xl, xl, vl, backend=backend)
        results.append([out, *torch.autograd.grad(out.square().sum(),
                                                  [xl, vl, *kernel.parameters()])])
    assert calls == [1]
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "rectangular"])
def test_every_dimension_as_a_difference(symmetric, generator, monkeypatch):
    """GPSCALE_TRITON_DISTANCE=diff (no norm expansion): values and gradients unchanged."""
    z1, z2, v = _draw(generator, 1, 26, 5), _draw(generator, 1, 19, 5), _draw(generator, 1, 19, 3)
    if symmetric:
        z2, v = z1, _draw(generator, 1, 26, 3)
    grad = _draw(generator, 1, 26, 3)
    results = []
    for mode in ("diff", "expand"):
        monkeypatch.setenv("GPSCALE_TRITON_DISTANCE", mode)
        leaves = [t.clone().requires_grad_() for t in ((z1, v) if symmetric else (z1, z2, v))]
        args = (leaves[0], leaves[0], leaves[1]) if symmetric else leaves
        out = triton_kernels.stationary_product("rbf", *args, symmetric=symmetric)
        results.append([out, *torch.autograd.grad(out, leaves, grad)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    monkeypatch.setenv("GPSCALE_TRITON_DISTANCE", "cdist")
    with pytest.raises(ValueError, match="GPSCALE_TRITON_DISTANCE"):
        triton_kernels.stationary_product("rbf", z1, z2, v)


def test_float32_sums_over_many_columns_keep_float32_accuracy(generator):
    """n2 = 6,000 columns in float32 (188 chunks here): the compensated chunk sums keep the
    error near one ulp (4·10⁻⁸ measured; a plain running sum of the chunks gave 5.5·10⁻⁷), the
    float64 product the reference."""
    z1, z2 = 0.3 * _draw(generator, 1, 16, 2), 0.3 * _draw(generator, 1, 6_000, 2)
    v = 1.0 + 0.1 * _draw(generator, 1, 6_000, 2)  # same-signed: the sums grow to ~10³
    out = triton_kernels.stationary_product("rbf", z1.float(), z2.float(), v.float())
    ref = _dense("rbf", z1, z2, v)
    error = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    assert error <= 1.5e-7, error


def test_launch_overrides_for_a_tuning_sweep(monkeypatch, generator):
    """GPSCALE_TRITON_TILES takes warps, stages and the chunk; CHUNK is kept a multiple of the
    tiles; GPSCALE_TRITON_PRECISION sets distances and products apart."""
    like = torch.zeros(1, dtype=torch.float32)
    monkeypatch.setenv("GPSCALE_TRITON_TILES", "BM=64,BN=32,W=8,S=2,CHUNK=16")
    t = triton_kernels.tiles(like, 5, 3)
    assert (t["BM"], t["BN"], t["W"], t["S"], t["CHUNK"]) == (64, 32, 8, 2, 64)
    for bad in ("W=3", "S=0", "S=7", "CHUNK=48", "W=x"):
        monkeypatch.setenv("GPSCALE_TRITON_TILES", bad)
        with pytest.raises(ValueError, match="GPSCALE_TRITON_TILES"):
            triton_kernels.tiles(like, 5, 3)
    monkeypatch.delenv("GPSCALE_TRITON_TILES")
    monkeypatch.setenv("GPSCALE_TRITON_PRECISION", "ieee,tf32x3")
    assert triton_kernels._precisions(like) == ("ieee", "tf32x3")
    assert triton_kernels._precisions(like.double()) == ("ieee", "ieee")
    z1, z2, v = _draw(generator, 1, 20, 3), _draw(generator, 1, 33, 3), _draw(generator, 1, 33, 2)
    out = triton_kernels.stationary_product("matern12", z1.float(), z2.float(), v.float())
    ref = _dense("matern12", z1, z2, v)
    assert ((out.double() - ref).abs().max() / ref.abs().max()).item() <= 1e-5
    for bad in ("ieee,tf32", "ieee,ieee,ieee", "tf32"):
        monkeypatch.setenv("GPSCALE_TRITON_PRECISION", bad)
        with pytest.raises(ValueError, match="too coarse"):
            triton_kernels._precisions(like)


def test_symmetric_v_gradient_alone_and_a_wrong_z2(generator):
    """With z fixed, V's gradient of Φ(z, z) V is Φ Ȳ (the dense float64 one); symmetric=True
    with a z2 other than z1 is refused rather than silently ignoring z2."""
    z, v, grad = _draw(generator, 1, 23, 3), _draw(generator, 1, 23, 4), _draw(generator, 1, 23, 4)
    vl = v.clone().requires_grad_()
    out = triton_kernels.stationary_product("matern32", z, z, vl, symmetric=True)
    (got,) = torch.autograd.grad(out, [vl], grad)
    vd = v.clone().requires_grad_()
    (want,) = torch.autograd.grad(_dense("matern32", z, z, vd), [vd], grad)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="symmetric=True"):
        triton_kernels.stationary_product("matern32", z, z.clone(), v, symmetric=True)
