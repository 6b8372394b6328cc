"""The native block-sparse row kernels against dense float64 references and the tile path."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._profiles import DENSE, block_matrix

from gpscale.kernels import (
    _block_sparse_backend,
    kernel_block_sparse_matmul,
    kernel_block_sparse_rect_matmul,
    kernel_matrix,
    make_kernel,
)
from gpscale.linalg import native
from gpscale.linalg.operators.block_sparse import BlockLayout, BlockSparseActions

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler for the kernels")




def _reference(profile, z, s, layout):
    r = (z[:, None, :] - z[None, :, :]).square().sum(-1).clamp_min(1e-300).sqrt()
    return DENSE[profile](r) @ block_matrix(s, layout)


@pytest.fixture(params=["rows", "tiles"])
def schedule(request, monkeypatch):
    """'rows': every ordered pair by row ranges; 'tiles': the symmetric schedule (diagonal
    tiles, then mirrored off-diagonal tiles), forced at small n by shrinking the row ranges."""
    if request.param == "tiles":
        monkeypatch.setattr(native, "_ROWS_PER_TASK", 4)
    return request.param


# n = 1,300 spans three 512-column chunks whose edges fall inside blocks; d = 10 takes the
# generic (not unrolled) distance loop; d = 1, 3 and 9 (the last) the unrolled ones.
@pytest.mark.parametrize("profile", list(DENSE))
@pytest.mark.parametrize(("n", "d", "i"), [(1300, 3, 17), (600, 1, 600), (700, 10, 3),
                                           (520, 9, 5)])
def test_product_and_gradients_match_dense_float64(profile, n, d, i, generator, schedule):
    """Φ S and the gradients of ⟨W, Φ S⟩ in z and s equal the dense float64 reference."""
    if schedule == "tiles":
        assert len(native.symmetric_rounds(n, torch.get_num_threads())) > 1
    layout = BlockLayout(n, i)
    z = (0.6 * torch.randn(n, d, generator=generator)).requires_grad_()
    s = torch.randn(n, generator=generator, requires_grad=True)
    W = torch.randn(n, i, generator=generator)
    out = native.symmetric_block_sparse_product(profile, z, s, layout)
    expected = _reference(profile, z, s, layout)
    torch.testing.assert_close(out, expected, rtol=1e-11, atol=1e-11)
    grads = torch.autograd.grad((out * W).sum(), (z, s))
    expected_grads = torch.autograd.grad((expected * W).sum(), (z, s))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_symmetric_rounds_cover_every_pair_once_without_conflicts(threads, monkeypatch):
    """Each unordered pair of points lies in exactly one tile (a diagonal tile holds its
    ordered pairs); tiles of one round share no row or column span."""
    monkeypatch.setattr(native, "_ROWS_PER_TASK", 2)
    n = 203
    rounds = native.symmetric_rounds(n, threads)
    assert len(rounds) == 8 * threads  # the diagonal round and 8·threads − 1 pairings
    count = torch.zeros(n, n, dtype=torch.int64)
    for tasks in rounds:
        used = [(r0, r1) for r0, r1, *_ in tasks] + [(c0, c1) for _, _, c0, c1, m in tasks if m]
        assert len(used) == len(set(used))  # no span twice in a round
        for r0, r1, c0, c1, mirror in tasks:
            count[r0:r1, c0:c1] += 1
            if mirror:
                assert r1 <= c0  # disjoint, above the diagonal
                count[c0:c1, r0:r1] += 1
    assert torch.equal(count, torch.ones(n, n, dtype=torch.int64))
    assert all(r0 < r1 and c0 < c1 for tasks in rounds for r0, r1, c0, c1, _ in tasks)


def test_gradient_in_values_only(generator, schedule):
    """With z not requiring gradients the adjoint skips z̄ and still returns s̄."""
    layout = BlockLayout(300, 7)
    z, s = torch.randn(300, 2, generator=generator), torch.randn(300, generator=generator)
    s.requires_grad_()
    out = native.symmetric_block_sparse_product("rbf", z, s, layout)
    (grad,) = torch.autograd.grad(out.sum(), s)
    (want,) = torch.autograd.grad(_reference("rbf", z, s, layout).sum(), s)
    torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("profile", list(DENSE))
def test_float32_agrees_with_float64(profile, generator):
    """The float32 kernels (own exp, relative error < 2e-7) stay within float32 rounding."""
    layout = BlockLayout(900, 11)
    z, s = torch.randn(900, 4, generator=generator), torch.randn(900, generator=generator)
    out32 = native.symmetric_block_sparse_product(profile, z.float(), s.float(), layout)
    want = native.symmetric_block_sparse_product(profile, z, s, layout)
    assert out32.dtype == torch.float32
    assert (out32.double() - want).abs().max() <= 2e-5 * want.abs().max()


def test_rectangular_forward_matches_dense(generator):
    """Rows other than the columns (prediction): Φ(rows, z) S."""
    layout = BlockLayout(700, 9)
    z, s = torch.randn(700, 3, generator=generator), torch.randn(700, generator=generator)
    rows = torch.randn(50, 3, generator=generator)
    r = torch.cdist(rows, z)
    expected = DENSE["matern52"](r) @ block_matrix(s, layout)
    out = native.block_sparse_forward("matern52", rows, z, s, layout)
    torch.testing.assert_close(out, expected, rtol=1e-11, atol=1e-11)


def test_kernel_products_take_native_path_and_agree_with_tiles(generator):
    """kernel_block_sparse_matmul with 'auto' on the CPU runs 'native' and agrees with 'fused',
    values and hyperparameter gradients; so do the rectangular products without gradients."""
    x = torch.randn(400, 3, generator=generator)
    kernel = make_kernel("matern32", 3)
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3, 0.9]])
    S = BlockSparseActions(torch.randn(400, generator=generator),
                           torch.randperm(400, generator=generator), num_blocks=13)
    assert _block_sparse_backend(kernel, x, x, "auto") == "native"
    wide = torch.zeros(10, native.BLOCK_SPARSE_MAX_DIMS + 1)  # the tiles' GEMM distances win
    assert _block_sparse_backend(make_kernel("rbf", wide.shape[1]), wide, wide, "auto") == "fused"
    results = []
    for backend in ("auto", "fused"):
        kernel.zero_grad()
        out = kernel_block_sparse_matmul(kernel, x, S, backend=backend)
        out.square().sum().backward()
        results.append((out.detach(), kernel.base_kernel.raw_lengthscale.grad.clone()))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    dense = kernel_matrix(kernel, x, x).detach() @ S.to_dense()
    x_new = torch.randn(30, 3, generator=generator)
    with torch.no_grad():
        rows = torch.tensor([3, 77, 399])
        got_rows = kernel_block_sparse_rect_matmul(kernel, x, S, rows=rows)
        got_new = kernel_block_sparse_rect_matmul(kernel, x, S, x_rows=x_new)
    torch.testing.assert_close(got_rows, dense[rows], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(
        got_new, kernel_matrix(kernel, x_new, x).detach() @ S.to_dense(), rtol=1e-10,
        atol=1e-10)


def test_unavailable_compiler_warns_once_and_falls_back(monkeypatch, generator):
    """A compiler that fails: one RuntimeWarning naming the cause, 'auto' takes the tile path,
    and an explicit 'native' runs 'compiled'; the numbers are unchanged."""
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failure", None)
    monkeypatch.setenv("CC", "false")
    with pytest.warns(RuntimeWarning, match="native block-sparse kernels are unavailable"):
        assert not native.available()
    assert not native.available()  # no second warning (pytest.warns above would not see it)
    x = torch.randn(50, 2, generator=generator)
    kernel = make_kernel("rbf", 2)
    assert _block_sparse_backend(kernel, x, x, "auto") == "fused"
    assert _block_sparse_backend(kernel, x, x, "native") == "compiled"


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_failure", None)
    monkeypatch.setenv("GPSCALE_NATIVE", "0")
    assert not native.available()
    assert native._failure == "disabled by GPSCALE_NATIVE=0"


def test_other_dtypes_are_not_native():
    assert not native.available(torch.zeros(2, dtype=torch.int64))
    assert not native.available(torch.zeros(2, dtype=torch.float16))



def test_loading_leaves_subnormals_alone():
    """The library is built without -ffast-math, whose start-up code would set flush-to-zero
    for the whole process (hypothesis noticed, in another test, that subnormals vanished)."""
    assert native.available()
    tiny = torch.tensor([1e-308], dtype=torch.float64) / 1e10
    assert tiny.item() != 0.0
    assert (torch.tensor([1e-38], dtype=torch.float32) / 1e3).item() != 0.0


@pytest.mark.parametrize("profile", list(DENSE))
def test_far_pairs_flush_subnormals_within_a_call_only(profile, generator, monkeypatch):
    """Short lengthscales: most pairs' kernel values and derivatives lie near e^-87, where the
    adjoint's products are subnormal. A call flushes those to zero (x86 runs subnormal
    arithmetic on a slow path) and stays within float32 rounding of the float64 product and
    gradients; the calling thread's mode is back afterwards (one thread: the calls run in it)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    layout = BlockLayout(700, 35)
    z = 8.0 * torch.randn(700, 3, generator=generator, dtype=torch.float64)  # most pairs far
    s = torch.randn(700, generator=generator, dtype=torch.float64)
    W = torch.randn(700, 35, generator=generator, dtype=torch.float64)
    results = []
    for dtype in (torch.float32, torch.float64):
        z_, s_ = z.to(dtype).requires_grad_(), s.to(dtype).requires_grad_()
        out = native.symmetric_block_sparse_product(profile, z_, s_, layout)
        grads = torch.autograd.grad((out * W.to(dtype)).sum(), (z_, s_))
        results.append([out.double(), *(g.double() for g in grads)])
        assert (torch.tensor([1e-38], dtype=torch.float32) / 1e3).item() != 0.0
    for got, want in zip(*results, strict=True):
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
