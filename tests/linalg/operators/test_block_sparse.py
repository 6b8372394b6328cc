"""Block-sparse actions and the kernel × block-sparse products against dense references."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._profiles import DENSE

from gpscale.kernels import kernel_block_sparse_matmul, kernel_matrix, make_kernel
from gpscale.linalg.fused import PROFILES
from gpscale.linalg.operators.block_sparse import (
    BlockLayout,
    BlockSparseActions,
    symmetric_kernel_product,
)


def _actions(generator, n=23, i=5):
    values = torch.randn(n, generator=generator)
    return BlockSparseActions(values, torch.randperm(n, generator=generator), num_blocks=i)


def _dense(S: BlockSparseActions) -> torch.Tensor:
    """S built entry by entry from its definition S[index[p], block(p)] = values[p]."""
    out = torch.zeros(S.layout.num_points, S.layout.num_blocks)
    p = 0
    for j, size in enumerate(S.layout.sizes()):
        for _ in range(size):
            out[S.index[p], j] = S.values[p]
            p += 1
    return out


@pytest.mark.parametrize(("n", "i"), [(23, 5), (20, 5), (7, 7), (9, 1)])
def test_layout_blocks_of_k_and_k_plus_one_cover_all_points(n, i):
    """ρ = n mod i blocks of k+1 first, then k; spans tile 0…n in whole blocks."""
    layout = BlockLayout(n, i)
    sizes = layout.sizes()
    assert sum(sizes) == n and len(sizes) == i and set(sizes) <= {n // i, n // i + 1}
    assert sizes == sorted(sizes, reverse=True)
    for rows in (1, 3, 100):
        spans = layout.spans(rows)
        assert [s.start for s in spans[1:]] == [s.stop for s in spans[:-1]]
        assert spans[0].start == 0 and spans[-1].stop == n
        assert sum(s.count for s in spans) == i
    t = torch.arange(n, dtype=torch.float64)
    expected = torch.stack([b.sum() for b in t.split(sizes)])
    torch.testing.assert_close(layout.segment_sum(t), expected, rtol=0, atol=0)


def test_layout_rejects_more_blocks_than_points():
    """i > n is a ValueError."""
    with pytest.raises(ValueError, match="num_blocks"):
        BlockLayout(3, 4)


def test_operator_matches_dense(generator):
    """S V, Sᵀ M, transpose, to_dense and SᵀS against the entry-wise definition."""
    S = _actions(generator)
    dense = _dense(S)
    V, M = torch.randn(5, 3, generator=generator), torch.randn(23, 2, generator=generator)
    torch.testing.assert_close(S.to_dense(), dense, rtol=0, atol=0)
    torch.testing.assert_close(S @ V, dense @ V, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(S.mT @ M, dense.T @ M, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(S.mT @ M[:, 0], dense.T @ M[:, 0], rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(S.mT.to_dense(), dense.T, rtol=0, atol=0)
    assert S.shape == (23, 5) and S.mT.shape == (5, 23)
    assert int((dense != 0).sum()) == 23
    torch.testing.assert_close(torch.diag(S.squared_norms()), dense.T @ dense, rtol=1e-14,
                               atol=1e-14)
    torch.testing.assert_close(S.index[S.inverse_index()], torch.arange(23), rtol=0, atol=0)


def test_operator_gradients_match_dense(generator):
    """d(uᵀ S V)/d values and d(Sᵀ M)/d values through linear_operator's matmul."""
    S = _actions(generator)
    values = S.values.clone().requires_grad_()
    S = BlockSparseActions(values, S.index, num_blocks=5)
    V, M = torch.randn(5, 3, generator=generator), torch.randn(23, 3, generator=generator)
    ((S @ V).sin().sum() + (S.mT @ M).cos().sum()).backward()
    fast = values.grad.clone()
    values.grad = None
    dense = _dense(BlockSparseActions(values, S.index, num_blocks=5))
    ((dense @ V).sin().sum() + (dense.T @ M).cos().sum()).backward()
    torch.testing.assert_close(fast, values.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("n", "i"), [(23, 5), (20, 5), (7, 7), (9, 1)])
def test_transposed_product_gradients_in_values_and_rows(n, i, generator):
    """Sᵀ M's own backward: values and M gradients equal the dense product's, with blocks of
    k + 1 only, k only and both; gradcheck in float64; a float32 M with float64 values."""
    S = _actions(generator, n, i)
    values = S.values.clone().requires_grad_()
    M = torch.randn(n, 3, generator=generator, requires_grad=True)
    W = torch.randn(i, 3, generator=generator)
    (BlockSparseActions(values, S.index, num_blocks=i).mT @ M * W).sum().backward()
    fast = values.grad.clone(), M.grad.clone()
    values.grad, M.grad = None, None
    (_dense(BlockSparseActions(values, S.index, num_blocks=i)).T @ M * W).sum().backward()
    torch.testing.assert_close(fast[0], values.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast[1], M.grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda v, m: BlockSparseActions(v, S.index, num_blocks=i).mT @ m, (values, M))
    mixed = BlockSparseActions(values, S.index, num_blocks=i).mT @ M.detach().float()
    assert mixed.dtype == torch.float64
    torch.testing.assert_close(mixed, _dense(S).T @ M.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("chunk_size", [1, 4, 9, 100])
def test_symmetric_product_matches_dense(profile, chunk_size, generator):
    """Φ S with each off-diagonal tile used twice = φ(cdist) @ S (block order)."""
    layout = BlockLayout(23, 5)
    z, s = torch.randn(23, 3, generator=generator), torch.randn(23, generator=generator)
    S = _dense(BlockSparseActions(s, torch.arange(23), num_blocks=5))
    expected = DENSE[profile](torch.cdist(z, z)) @ S
    out = symmetric_kernel_product(profile, z, s, layout, chunk_size=chunk_size)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("profile", list(PROFILES))
def test_symmetric_product_gradcheck(profile, generator):
    """gradcheck of the recomputing backward in z and s (n = 9, blocks 3, 2, 2, 2, spans ≤ 2)."""
    z = torch.randn(9, 2, generator=generator, requires_grad=True)
    s = torch.randn(9, generator=generator, requires_grad=True)
    layout = BlockLayout(9, 4)
    assert torch.autograd.gradcheck(
        lambda a, b: symmetric_kernel_product(profile, a, b, layout, chunk_size=2), (z, s))


@pytest.mark.slow
def test_compiled_tiles_match_uncompiled(generator):
    """The torch.compile'd profile functions give the same product and gradients."""
    z = torch.randn(12, 2, generator=generator, requires_grad=True)
    s = torch.randn(12, generator=generator, requires_grad=True)
    layout = BlockLayout(12, 5)
    results = []
    for compiled in (False, True):
        out = symmetric_kernel_product("matern32", z, s, layout, compiled=compiled, chunk_size=5)
        results.append((out, *torch.autograd.grad(out.sin().sum(), (z, s))))
    for fast, plain in zip(*results, strict=True):
        torch.testing.assert_close(fast, plain, rtol=1e-12, atol=1e-12)


def _kernel(d=2):
    kernel = make_kernel("matern32", d).double()
    kernel.initialize(**{"outputscale": 1.7, "base_kernel.lengthscale": torch.tensor([[0.7, 1.3]])})
    return kernel


@pytest.mark.parametrize("backend", ["fused", "eager"])
@pytest.mark.parametrize("rows", ["training", "test"])
def test_kernel_block_sparse_matmul_matches_dense(backend, rows, generator):
    """K(x_rows, x) S and its gradients in x, hyperparameters and values = dense autograd."""
    kernel, S = _kernel(), _actions(generator)
    values = S.values.clone().requires_grad_()
    S = BlockSparseActions(values, S.index, num_blocks=5)
    x = torch.randn(23, 2, generator=generator, requires_grad=True)
    x_rows = None if rows == "training" else torch.randn(6, 2, generator=generator)
    W = torch.randn(23 if x_rows is None else 6, 5, generator=generator)
    params = [x, values, *kernel.parameters()]
    out = kernel_block_sparse_matmul(kernel, x, S, x_rows=x_rows, chunk_size=4, backend=backend)
    fast = torch.autograd.grad((out * W).sum(), params)
    dense = kernel_matrix(kernel, x if x_rows is None else x_rows, x) @ S.to_dense()
    torch.testing.assert_close(out, dense, rtol=1e-12, atol=1e-12)
    for a, b in zip(fast, torch.autograd.grad((dense * W).sum(), params), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_kernel_block_sparse_matmul_rejects_bad_shapes(generator):
    """Mismatched n, transposed actions and batched kernels are ValueErrors."""
    kernel, S = _kernel(), _actions(generator)
    with pytest.raises(ValueError, match="actions"):
        kernel_block_sparse_matmul(kernel, torch.randn(22, 2), S)
    with pytest.raises(ValueError, match="actions"):
        kernel_block_sparse_matmul(kernel, torch.randn(5, 2), S.mT)
    batched = make_kernel("rbf", 2, batch_shape=torch.Size([2])).double()
    with pytest.raises(ValueError, match="batch_shape"):
        kernel_block_sparse_matmul(batched, torch.randn(23, 2), S)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", ["training", "test"])
def test_cuda_default_spans_match_cpu_tiles(rows, generator):
    """On a GPU the default spans are far larger than the CPU's 1024 rows (one tile here, where
    the CPU takes three spans); values and gradients still equal the CPU's fused tiles."""
    from gpscale.linalg import fused

    n, i = 2500, 50
    x = torch.randn(n, 2, generator=generator)
    S = _actions(generator, n=n, i=i)
    x_rows = None if rows == "training" else torch.randn(700, 2, generator=generator)
    W = torch.randn(n if x_rows is None else 700, i, generator=generator)
    assert fused.span_rows(x.cuda()) > max(n, fused.span_rows(x))
    results = []
    for device in ("cpu", "cuda"):
        k = _kernel().to(device)
        xd = x.to(device).requires_grad_()
        values = S.values.to(device).requires_grad_()
        Sd = BlockSparseActions(values, S.index.to(device), num_blocks=i)
        out = kernel_block_sparse_matmul(k, xd, Sd, backend="fused",
                                         x_rows=None if x_rows is None else x_rows.to(device))
        grads = torch.autograd.grad((out * W.to(device)).sum(), [xd, values, *k.parameters()])
        results.append([t.cpu() for t in (out, *grads)])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9)
