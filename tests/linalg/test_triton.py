"""The Triton kernel product (gpscale.linalg.triton), compiled on a GPU where torch sees one,
else run by Triton's interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET=1 where no
GPU is present): every profile against
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
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, else interpreted
if not triton_kernels.available(torch.zeros(1, device=DEVICE)):
    pytest.skip("the Triton interpreter is off (TRITON_INTERPRET=1 is set by conftest only "
                "where torch sees no GPU)", allow_module_level=True)

PROFILES = tuple(DENSE)


def _dense(profile: str, z1, z2, v):
    """Φ V in float64 from cdist: the reference."""
    r = torch.cdist(z1.double(), z2.double())
    return DENSE[profile](r) @ v.double()


def _inputs(generator, B, n1, n2, d, k, dtype=torch.float64):
    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(DEVICE, dtype)
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


@pytest.mark.parametrize("profile", [PROFILES[0], *(pytest.param(p, marks=pytest.mark.long)
                                                      for p in PROFILES[1:])])
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
    grad = torch.randn(1, 25, k, generator=generator, dtype=torch.float64).to(DEVICE)
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
    kernel = make_kernel("matern32", 3, ard=ard).to(DEVICE, torch.float64)
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


# -- the block-sparse product of CaGP-Opt ------------------------------------------------------


def _tiles_reference(profile, z_rows, z, s, layout, symmetric, exact=0):
    from gpscale.linalg.operators.block_sparse import symmetric_kernel_product
    from gpscale.linalg.operators.block_sparse_rect import rectangular_kernel_product

    if symmetric:
        return symmetric_kernel_product(profile, z, s, layout, exact=exact)
    return rectangular_kernel_product(profile, z_rows, z, s, layout, exact=exact)


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "rectangular"])
@pytest.mark.parametrize(("n", "i"), [(53, 7), (40, 1), (17, 17), (70, 40)],
                         ids=["uneven", "one-block", "blocks-of-1", "more-blocks-than-BJ"])
@pytest.mark.parametrize("profile", PROFILES)
def test_block_sparse_matches_the_tiles_with_gradients(profile, n, i, symmetric, generator):
    """Values and the gradients of rows, columns and action values against the PyTorch tiles
    (float64), for uneven blocks, one block, blocks of one point and more blocks than a
    program reduces."""
    from gpscale.linalg.operators.block_sparse import BlockLayout

    layout = BlockLayout(n, i)
    z = torch.randn(n, 3, generator=generator, dtype=torch.float64).to(DEVICE)
    s = torch.randn(n, generator=generator, dtype=torch.float64).to(DEVICE)
    rows = torch.randn(11, 3, generator=generator, dtype=torch.float64).to(DEVICE)
    results = []
    for product in (triton_kernels.block_sparse_product, None):
        zl, sl, rl = (t.clone().requires_grad_() for t in (z, s, rows))
        first = zl if symmetric else rl
        out = (product(profile, first, zl, sl, layout) if product is not None
               else _tiles_reference(profile, rl, zl, sl, layout, symmetric))
        grad = torch.ones_like(out) + torch.arange(out.numel(), dtype=out.dtype,
                                                   device=out.device).reshape(out.shape) / 50
        leaves = [zl, sl] if symmetric else [zl, sl, rl]
        results.append([out, *torch.autograd.grad(out, leaves, grad)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)


def test_block_sparse_float32_and_the_exact_diagonal(generator):
    """Float32 against float64 within 1e-5; far-out coordinates (×30) with an exact dimension:
    a point's own entry is φ(0) = 1 exactly in the symmetric product, as in the tiles."""
    from gpscale.linalg.operators.block_sparse import BlockLayout

    layout = BlockLayout(45, 6)
    z = torch.randn(45, 4, generator=generator, dtype=torch.float64).to(DEVICE)
    s = torch.ones(45, dtype=torch.float64, device=DEVICE)
    ref = _tiles_reference("matern12", z, z, s, layout, True)
    z32 = z.float()
    got = triton_kernels.block_sparse_product("matern12", z32, z32, s.float(), layout)
    assert ((got.double() - ref).abs().max() / ref.abs().max()).item() <= 1e-5
    far = z * 30
    far[:, -1] += 1e4  # a large-coordinate dimension, entered as differences
    ref = _tiles_reference("matern12", far, far, s, layout, True, exact=1)
    torch.testing.assert_close(triton_kernels.block_sparse_product("matern12", far, far, s,
                                                                   layout, exact=1),
                               ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows", [False, True], ids=["training", "prediction"])
def test_kernel_block_sparse_matmul_backend(rows, generator):
    """kernel_block_sparse_matmul with backend='triton' against 'fused', hyperparameter
    gradients included, for the training product and the prediction product K(x*, X) S."""
    from gpscale.kernels import kernel_block_sparse_matmul
    from gpscale.linalg.operators.block_sparse import BlockSparseActions

    x = torch.randn(37, 2, generator=generator, dtype=torch.float64).to(DEVICE)
    x_new = torch.randn(9, 2, generator=generator, dtype=torch.float64).to(DEVICE)
    index = torch.randperm(37, generator=generator).to(DEVICE)
    values = torch.randn(37, generator=generator, dtype=torch.float64).to(DEVICE)
    kernel = make_kernel("matern52", 2).to(DEVICE, torch.float64)
    results = []
    for backend in ("triton", "fused"):
        xl, vl = x.clone().requires_grad_(), values.clone().requires_grad_()
        actions = BlockSparseActions(vl, index, num_blocks=5)
        out = kernel_block_sparse_matmul(kernel, xl, actions, backend=backend,
                                         x_rows=x_new if rows else None)
        results.append([out, *torch.autograd.grad(out.square().sum(),
                                                  [xl, vl, *kernel.parameters()])])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_tile_and_precision_overrides_for_a_tuning_sweep(monkeypatch, generator):
    """GPSCALE_TRITON_TILES sets the tile shape (powers of two ≥ 16) and
    GPSCALE_TRITON_PRECISION the float32 products (ieee or tf32x3; never plain tf32); the
    product is the same with other tiles."""
    like = torch.zeros(1, dtype=torch.float32)
    monkeypatch.setenv("GPSCALE_TRITON_TILES", "BM=32,BN=64")
    assert triton_kernels.tiles(like, 5, 3)["BM"] == 32 and triton_kernels.tiles(like, 5, 3)[
        "BN"] == 64
    z1, z2, v = _inputs(generator, 1, 40, 70, 3, 2)
    torch.testing.assert_close(triton_kernels.stationary_product("rbf", z1, z2, v),
                               _dense("rbf", z1, z2, v), rtol=1e-12, atol=1e-12)
    for bad in ("BM=24", "BK=32", "BM=8"):
        monkeypatch.setenv("GPSCALE_TRITON_TILES", bad)
        with pytest.raises(ValueError, match="GPSCALE_TRITON_TILES"):
            triton_kernels.tiles(like, 5, 3)
    monkeypatch.delenv("GPSCALE_TRITON_TILES")
    monkeypatch.setenv("GPSCALE_TRITON_PRECISION", "tf32x3")
    assert triton_kernels._precision(like) == "tf32x3"
    assert triton_kernels._precision(like.double()) == "ieee"
    monkeypatch.setenv("GPSCALE_TRITON_PRECISION", "tf32")
    with pytest.raises(ValueError, match="too coarse"):
        triton_kernels._precision(like)
