"""The rectangular kernel × block-sparse product K(x_rows, x) S against dense references."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._profiles import DENSE, block_matrix

from gpscale.kernels import (
    kernel_block_sparse_matmul,
    kernel_block_sparse_rect_matmul,
    kernel_matrix,
    make_kernel,
)
from gpscale.linalg.fused import PROFILES
from gpscale.linalg.operators.block_sparse import (
    BlockLayout,
    BlockSparseActions,
)
from gpscale.linalg.operators.block_sparse_rect import rectangular_kernel_product


def _actions(generator, n=23, i=5):
    values = torch.randn(n, generator=generator).requires_grad_()
    return BlockSparseActions(values, torch.randperm(n, generator=generator), num_blocks=i)


def _kernel(name="matern32"):
    kernel = make_kernel(name, 2).double()
    kernel.initialize(**{"outputscale": 1.7, "base_kernel.lengthscale": torch.tensor([[0.7, 1.3]])})
    return kernel


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("chunk_size", [1, 4, 9, 100])
def test_rectangular_product_matches_dense(profile, chunk_size, generator):
    """Φ(z_rows, z) S tile by tile = φ(cdist(z_rows, z)) @ S (block order, any chunking)."""
    layout = BlockLayout(23, 5)
    z, s = torch.randn(23, 3, generator=generator), torch.randn(23, generator=generator)
    z_rows = torch.randn(7, 3, generator=generator)
    expected = DENSE[profile](torch.cdist(z_rows, z)) @ block_matrix(s, layout)
    out = rectangular_kernel_product(profile, z_rows, z, s, layout, chunk_size=chunk_size)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [2, 5, 100])
def test_rows_of_z_give_exact_zero_distance_on_their_own_column(chunk_size, generator):
    """With rows_in_z, Φ(z[pos], z) S = rows pos of φ(cdist(z, z)) S, D²_pp = 0 exactly."""
    layout = BlockLayout(17, 4)
    z, s = torch.randn(17, 8, generator=generator) * 1e3, torch.randn(17, generator=generator)
    pos = torch.tensor([16, 3, 4, 0, 9])
    out = rectangular_kernel_product("matern12", z[pos], z, s, layout, rows_in_z=pos,
                                     chunk_size=chunk_size)
    D = torch.cdist(z, z)
    D.diagonal().zero_()
    expected = (DENSE["matern12"](D) @ block_matrix(s, layout))[pos]
    # |z|² ~ 1e7: without the exact zero, φ(√(rounding)) is off by ~1e-5 on the diagonal here
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("profile", list(PROFILES))
def test_rectangular_product_gradcheck(profile, generator):
    """gradcheck of the recomputing backward in z_rows, z and s (n = 9, spans ≤ 2 columns)."""
    z = torch.randn(9, 2, generator=generator, requires_grad=True)
    z_rows = torch.randn(5, 2, generator=generator, requires_grad=True)
    s = torch.randn(9, generator=generator, requires_grad=True)
    layout = BlockLayout(9, 4)
    assert torch.autograd.gradcheck(
        lambda a, b, c: rectangular_kernel_product(profile, a, b, c, layout, chunk_size=2),
        (z_rows, z, s))


@pytest.mark.slow
def test_compiled_tiles_match_uncompiled(generator):
    """The torch.compile'd tile functions give the same product and gradients."""
    z = torch.randn(12, 2, generator=generator, requires_grad=True)
    z_rows = torch.randn(7, 2, generator=generator, requires_grad=True)
    s = torch.randn(12, generator=generator, requires_grad=True)
    layout = BlockLayout(12, 5)
    results = []
    for compiled in (False, True):
        out = rectangular_kernel_product("matern32", z_rows, z, s, layout, compiled=compiled,
                                         chunk_size=5)
        results.append((out, *torch.autograd.grad(out.sin().sum(), (z_rows, z, s))))
    for fast, plain in zip(*results, strict=True):
        torch.testing.assert_close(fast, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["fused", "eager"])
@pytest.mark.parametrize("which", ["rows", "x_rows"])
def test_kernel_rect_matmul_matches_dense_autograd(backend, which, generator):
    """K(x[rows], x) S and K(x_rows, x) S: values and gradients in x, x_rows, θ, s = dense."""
    kernel, S = _kernel(), _actions(generator)
    x = torch.randn(23, 2, generator=generator, requires_grad=True)
    rows = torch.tensor([3, 22, 0, 7, 8, 15])
    x_rows = torch.randn(6, 2, generator=generator, requires_grad=True)
    W = torch.randn(6, 5, generator=generator)
    params = [x, S.values, *kernel.parameters()] + ([x_rows] if which == "x_rows" else [])
    kwargs = {"rows": rows} if which == "rows" else {"x_rows": x_rows}
    out = kernel_block_sparse_rect_matmul(kernel, x, S, chunk_size=4, backend=backend, **kwargs)
    fast = torch.autograd.grad((out * W).sum(), params)
    dense = kernel_matrix(kernel, x[rows] if which == "rows" else x_rows, x) @ S.to_dense()
    torch.testing.assert_close(out, dense, rtol=1e-12, atol=1e-12)
    for a, b in zip(fast, torch.autograd.grad((dense * W).sum(), params), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_shards_of_rows_stack_to_the_symmetric_product(generator):
    """Two row shards of K(x, x) S (what two ranks compute) = the symmetric product, ∂ too."""
    kernel, S = _kernel("rbf"), _actions(generator)
    x = torch.randn(23, 2, generator=generator, requires_grad=True)
    W = torch.randn(23, 5, generator=generator)
    params = [x, S.values, *kernel.parameters()]
    full = kernel_block_sparse_matmul(kernel, x, S, chunk_size=4, backend="fused")
    parts = torch.cat([kernel_block_sparse_rect_matmul(kernel, x, S, rows=torch.arange(a, b),
                                                       chunk_size=4, backend="fused")
                       for a, b in ((0, 12), (12, 23))])
    torch.testing.assert_close(parts, full, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad((parts * W).sum(), params),
                    torch.autograd.grad((full * W).sum(), params), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_float32_close_to_float64(generator):
    """float32 inputs give float32 output within float32 rounding of the float64 product."""
    kernel, S = _kernel(), _actions(generator)
    x = torch.randn(23, 2, generator=generator)
    rows = torch.arange(5, 17)
    ref = kernel_block_sparse_rect_matmul(kernel, x, S, rows=rows, backend="fused")
    S32 = BlockSparseActions(S.values.detach().float(), S.index, num_blocks=5)
    out = kernel_block_sparse_rect_matmul(kernel.float(), x.float(), S32, rows=rows,
                                          backend="fused")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)


def test_kernel_rect_matmul_rejects_bad_input(generator):
    """Both or neither of rows/x_rows, wrong shapes, float rows, batched kernels: ValueError."""
    kernel, S = _kernel(), _actions(generator)
    x = torch.randn(23, 2, generator=generator)
    with pytest.raises(ValueError, match="exactly one"):
        kernel_block_sparse_rect_matmul(kernel, x, S)
    with pytest.raises(ValueError, match="exactly one"):
        kernel_block_sparse_rect_matmul(kernel, x, S, rows=torch.arange(3), x_rows=x[:3])
    with pytest.raises(ValueError, match="actions"):
        kernel_block_sparse_rect_matmul(kernel, x[:22], S, rows=torch.arange(3))
    with pytest.raises(ValueError, match="integer"):
        kernel_block_sparse_rect_matmul(kernel, x, S, rows=torch.ones(3))
    with pytest.raises(ValueError, match="x_rows"):
        kernel_block_sparse_rect_matmul(kernel, x, S, x_rows=torch.ones(3, 3))
    batched = make_kernel("rbf", 2, batch_shape=torch.Size([2])).double()
    with pytest.raises(ValueError, match="batch_shape"):
        kernel_block_sparse_rect_matmul(batched, x, S, rows=torch.arange(3))
    with pytest.raises(ValueError, match="chunk_size"):
        rectangular_kernel_product("rbf", x[:3], x, S.values, S.layout, chunk_size=0)
