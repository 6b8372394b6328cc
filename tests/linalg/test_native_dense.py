"""The native dense product Φ(z1, z2) V (C panels and vector micro-kernels) against dense
references."""

from __future__ import annotations

import pytest
import torch
from tests.linalg._profiles import DENSE

from gpscale.kernels import kernel_matmul, kernel_matrix, make_kernel, select_backend
from gpscale.linalg import native

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler for the kernels")


def _dense(profile, z1, z2):
    r = (z1[:, None, :] - z2[None, :, :]).square().sum(-1).clamp_min(1e-300).sqrt()
    return DENSE[profile](r)


@pytest.fixture(params=["one tile", "small tiles"])
def tiles(request, monkeypatch):
    """'small tiles' shrinks the tasks and the column spans so that a small problem has many
    rounds, diagonal tiles, mirrored tiles, ragged edges and more tasks than threads, and its
    rectangular products split rows rather than columns."""
    if request.param == "small tiles":
        monkeypatch.setattr(native, "_ROWS_PER_TASK", 2)
        monkeypatch.setattr(native, "_SPAN_BYTES", 40)
    return request.param


# d = 10 takes the generic distance loop, d = 1 and 3 the unrolled ones; n = 300 has more than
# one 256-column chunk. k = 1 takes the scalar-column loops; 3 and 37 are padded to the vector
# width, and 37 has a full pass of vectors and a shorter one on every CPU.
@pytest.mark.parametrize("profile", list(DENSE))
@pytest.mark.parametrize(("t", "n", "d", "k"), [(37, 61, 3, 4), (61, 61, 1, 1), (23, 40, 10, 37),
                                                (13, 300, 2, 3)])
def test_rectangular_and_symmetric_products_match_dense_float64(profile, t, n, d, k, generator,
                                                                  tiles):
    """Φ(z1, z2) V and Φ(z, z) V equal the dense float64 products to rounding."""
    z = 0.7 * torch.randn(n, d, generator=generator, dtype=torch.float64)
    z1 = 0.7 * torch.randn(t, d, generator=generator, dtype=torch.float64)
    V = torch.randn(n, k, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(native.dense_product(profile, z1, z, V), _dense(profile, z1, z) @ V,
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(native.dense_product(profile, z, None, V), _dense(profile, z, z) @ V,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("profile", list(DENSE))
def test_float32_tiles_are_the_kernel_matrix(profile, generator, tiles):
    """Φ(z, z) I in float32 (the polynomial exponential) is the kernel matrix: symmetric to
    rounding, exactly 1 on the diagonal, within 1e-6 of float64 everywhere."""
    n = 53
    z = 0.8 * torch.randn(n, 5, generator=generator, dtype=torch.float64)
    K = native.dense_product(profile, z.float(), None, torch.eye(n, dtype=torch.float32))
    expected = _dense(profile, z, z)
    assert K.dtype == torch.float32
    assert (K.diagonal() == 1).all()
    assert (K.double() - expected).abs().max() < 1e-6
    assert (K - K.mT).abs().max() < 1e-6
    rect = native.dense_product(profile, z[:29].float(), z.float(),
                                torch.eye(n, dtype=torch.float32))
    assert (rect.double() - expected[:29]).abs().max() < 1e-6


@pytest.mark.parametrize("profile", list(DENSE))
def test_kernel_matrix_matches_dense(profile, generator, monkeypatch):
    """native.kernel_matrix: Φ(z1, z2) and Φ(z, z) equal the dense float64 matrices to rounding
    over several row tasks; in float32 within 1e-6 with a diagonal of exactly 1; bad inputs are
    errors naming them."""
    monkeypatch.setattr(native, "_ROWS_PER_TASK", 7)
    z = 0.7 * torch.randn(600, 3, generator=generator, dtype=torch.float64)  # > one C chunk
    expected = _dense(profile, z, z)
    torch.testing.assert_close(native.kernel_matrix(profile, z), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(native.kernel_matrix(profile, z[:40], z), expected[:40],
                               rtol=1e-12, atol=1e-12)
    K = native.kernel_matrix(profile, z.float())
    assert K.dtype == torch.float32 and (K.diagonal() == 1).all()
    assert (K.double() - expected).abs().max() < 1e-6
    assert native.kernel_matrix(profile, z[:0], z).shape == (0, 600)
    with pytest.raises(ValueError, match=r"z1 \(t, d\), z2 \(n, d\) of one dtype"):
        native.kernel_matrix(profile, z, z[:, :2])
    with pytest.raises(ValueError, match="unknown profile"):
        native.kernel_matrix("cosine", z)


def test_empty_inputs_and_thread_count(generator):
    """No rows, columns or right-hand sides give zeros of the right shape; the call leaves
    torch's thread count as it found it; mismatched shapes or dtypes are errors naming them
    (the C kernel would read out of bounds)."""
    threads = torch.get_num_threads()
    z, V = torch.randn(9, 2, generator=generator), torch.randn(9, 3, generator=generator)
    assert native.dense_product("rbf", z[:0], z, V).shape == (0, 3)
    assert native.dense_product("rbf", z, z[:0], V[:0]).abs().sum() == 0
    assert native.dense_product("rbf", z, None, V[:, :0]).shape == (9, 0)
    native.dense_product("rbf", z, None, V)
    assert torch.get_num_threads() == threads
    with pytest.raises(ValueError, match="unknown profile 'cosine'"):
        native.dense_product("cosine", z, None, V)
    with pytest.raises(ValueError, match=r"z2 \(n, d\).*got z1 \(9, 2\), z2 \(9, 3\)"):
        native.dense_product("rbf", z, torch.randn(9, 3, generator=generator), V)
    with pytest.raises(ValueError, match=r"rhs \(8, 3\)"):
        native.dense_product("rbf", z, None, V[:8])
    with pytest.raises(ValueError, match="inputs of one dtype"):
        other = torch.float32 if z.dtype == torch.float64 else torch.float64
        native.dense_product("rbf", z, None, V.to(other))


@pytest.mark.parametrize("same", [True, False], ids=["x1 is x2", "x1 != x2"])
def test_kernel_matmul_native_backend(same, generator):
    """backend='native': without gradients the C tiles (symmetric where x1 is x2), batched
    kernels per member; with gradients the compiled path, whose gradients equal dense
    autograd. 'auto' takes it for large CPU products."""
    kernel = make_kernel("matern32", 3, batch_shape=torch.Size([2])).double()
    kernel.base_kernel.lengthscale = torch.tensor([[[0.6, 1.1, 0.8]], [[1.3, 0.5, 0.9]]])
    kernel.outputscale = torch.tensor([1.7, 0.4])
    x2 = torch.randn(45, 3, generator=generator, dtype=torch.float64)
    x1 = x2 if same else torch.randn(30, 3, generator=generator, dtype=torch.float64)
    V = torch.randn(2, 45, 4, generator=generator, dtype=torch.float64)
    expected = kernel_matrix(kernel, x1, x2) @ V
    with torch.no_grad():
        torch.testing.assert_close(kernel_matmul(kernel, x1, x2, V, backend="native"), expected,
                                   rtol=1e-12, atol=1e-12)
    V.requires_grad_()
    weights = torch.randn_like(expected)
    grad = torch.autograd.grad((kernel_matmul(kernel, x1, x2, V, backend="native") * weights)
                               .sum(), V)[0]
    torch.testing.assert_close(grad, kernel_matrix(kernel, x1, x2).mT @ weights.detach(),
                               rtol=1e-10, atol=1e-10)
    big = torch.zeros(3000, 3)
    assert select_backend(make_kernel("rbf", 3), big, big) == "native"
    wide = torch.zeros(3000, native.DENSE_MAX_DIMS + 1)  # distances by GEMM win there
    assert select_backend(make_kernel("rbf", wide.shape[1]), wide, wide) == "compiled"


def test_overlapping_calls_restore_the_thread_count(generator):
    """Products running at once in several Python threads give the single-threaded answer and
    leave the calling thread's torch thread count as it was."""
    from concurrent.futures import ThreadPoolExecutor

    threads = torch.get_num_threads()
    z = torch.randn(300, 3, generator=generator, dtype=torch.float64)
    V = torch.randn(300, 2, generator=generator, dtype=torch.float64)
    expected = native.dense_product("matern52", z, None, V)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: native.dense_product("matern52", z, None, V), range(8)))
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=1e-13, atol=1e-13)
    assert torch.get_num_threads() == threads
