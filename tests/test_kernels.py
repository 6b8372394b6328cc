"""kernel_matmul against dense float64 references: values, gradients, memory, backends."""

from __future__ import annotations

import importlib.util
import warnings

import gpytorch
import pytest
import torch

from gpscale.kernels import (
    AUTO_COMPILE_MIN_ENTRIES,
    inducing_factor,
    kernel_block_sparse_rect_matmul,
    kernel_hyperparameters,
    kernel_matmul,
    kernel_matrix,
    make_kernel,
    select_backend,
)
from gpscale.linalg import fused, native
from gpscale.linalg.operators.block_sparse import BlockSparseActions

STATIONARY = ["rbf", "matern12", "matern32", "matern52"]


def _kernel(name: str, d: int, ard: bool, generator, batch_shape=None):
    kernel = make_kernel(name, d, ard=ard, batch_shape=batch_shape or torch.Size())
    shape = kernel.base_kernel.lengthscale.shape
    kernel.base_kernel.lengthscale = 0.5 + torch.rand(shape, generator=generator)
    kernel.outputscale = 0.5 + torch.rand(kernel.outputscale.shape, generator=generator)
    return kernel


def _data(generator, n1=23, n2=17, d=3, k=4):
    x1 = torch.randn(n1, d, generator=generator)
    x2 = torch.randn(n2, d, generator=generator)
    rhs = torch.randn(n2, k, generator=generator)
    return x1, x2, rhs


@pytest.mark.parametrize("backend", ["eager", "fused"])
@pytest.mark.parametrize("ard", [True, False], ids=["ard", "iso"])
@pytest.mark.parametrize("name", STATIONARY)
def test_matmul_equals_dense(name, ard, backend, generator):
    """K(x1, x2) @ V with n1 ≠ n2 and a chunk size that does not divide n1."""
    kernel = _kernel(name, 3, ard, generator)
    x1, x2, rhs = _data(generator)
    expected = kernel_matrix(kernel, x1, x2) @ rhs
    actual = kernel_matmul(kernel, x1, x2, rhs, chunk_size=5, backend=backend)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", [
    gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel()),
    gpytorch.kernels.PolynomialKernel(power=2),
    gpytorch.kernels.RBFKernel() + gpytorch.kernels.LinearKernel(),
], ids=["periodic", "polynomial", "rbf+linear"])
def test_eager_matmul_any_kernel(kernel, generator):
    """The eager path runs any GPyTorch kernel (periodic, non-stationary, sums)."""
    kernel = kernel.double()
    x1, x2, rhs = _data(generator)
    assert select_backend(kernel, x1, x2) == "eager"
    expected = kernel_matrix(kernel, x1, x2) @ rhs
    torch.testing.assert_close(kernel_matmul(kernel, x1, x2, rhs, chunk_size=4), expected,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_vector_rhs_and_same_inputs(backend, generator):
    """A vector rhs gives a vector; K(x, x) v with x1 is x2."""
    kernel = _kernel("matern52", 2, True, generator)
    x = torch.randn(19, 2, generator=generator)
    v = torch.randn(19, generator=generator)
    actual = kernel_matmul(kernel, x, x, v, chunk_size=6, backend=backend)
    torch.testing.assert_close(actual, kernel_matrix(kernel, x, x) @ v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_batched_kernel(backend, generator):
    """batch_shape (b,), rhs (b, n2, k): values and gradients equal the batched dense product."""
    kernel = _kernel("matern32", 3, True, generator, batch_shape=torch.Size([2]))
    x1, x2, _ = _data(generator)
    rhs = torch.randn(2, 17, 3, generator=generator)
    expected = kernel_matrix(kernel, x1, x2) @ rhs  # (2, n1, 3)
    actual = kernel_matmul(kernel, x1, x2, rhs, chunk_size=7, backend=backend)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn(2, 23, 3, generator=generator)
    dense = _grads(lambda k, a, b, v: kernel_matrix(k, a, b) @ v, kernel, x1, x2, rhs, weights)
    chunked = _grads(lambda k, a, b, v: kernel_matmul(k, a, b, v, chunk_size=7, backend=backend),
                     kernel, x1, x2, rhs, weights)
    for a, e in zip(chunked, dense, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


def _grads(product, kernel, x1, x2, rhs, weights):
    inputs = [t.clone().requires_grad_() for t in (x1, x2, rhs)]
    params = [kernel.base_kernel.raw_lengthscale, kernel.raw_outputscale]
    loss = (product(kernel, *inputs) * weights).sum()
    return torch.autograd.grad(loss, [*inputs, *params])


@pytest.mark.parametrize("backend", ["eager", "fused"])
@pytest.mark.parametrize("name,ard", [("rbf", False), ("matern12", True), ("matern32", True),
                                      ("matern52", False)])
def test_gradients_equal_dense_autograd(name, ard, backend, generator):
    """Gradients w.r.t. rhs, x1, x2, lengthscale and outputscale equal dense autograd."""
    kernel = _kernel(name, 3, ard, generator)
    x1, x2, rhs = _data(generator)
    weights = torch.randn(23, 4, generator=generator)
    expected = _grads(lambda k, a, b, v: kernel_matrix(k, a, b) @ v, kernel, x1, x2, rhs, weights)
    actual = _grads(lambda k, a, b, v: kernel_matmul(k, a, b, v, chunk_size=6, backend=backend),
                    kernel, x1, x2, rhs, weights)
    for a, e, what in zip(actual, expected, ["rhs", "x1", "x2", "ls", "os"], strict=False):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=what)


@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_gradcheck_inputs(backend, generator):
    """torch.autograd.gradcheck on x1, x2 and rhs (float64, n ≤ 10)."""
    kernel = _kernel("matern52", 2, True, generator)
    x1, x2, rhs = _data(generator, n1=7, n2=6, d=2, k=2)
    inputs = tuple(t.requires_grad_() for t in (x1, x2, rhs))
    assert torch.autograd.gradcheck(
        lambda a, b, v: kernel_matmul(kernel, a, b, v, chunk_size=3, backend=backend), inputs)


@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_hyperparameter_gradient_by_finite_differences(backend, generator):
    """Central differences in each raw lengthscale match the analytic gradient."""
    kernel = _kernel("rbf", 2, True, generator)
    x1, x2, rhs = _data(generator, n1=7, n2=6, d=2, k=2)
    raw = kernel.base_kernel.raw_lengthscale

    def loss() -> torch.Tensor:
        return kernel_matmul(kernel, x1, x2, rhs, chunk_size=3, backend=backend).square().sum()

    (analytic,) = torch.autograd.grad(loss(), [raw])
    numeric = torch.zeros_like(raw)
    for j in range(raw.shape[-1]):
        with torch.no_grad():
            raw[..., j] += 1e-6
            up = loss()
            raw[..., j] -= 2e-6
            down = loss()
            raw[..., j] += 1e-6
        numeric[..., j] = (up - down) / 2e-6
    torch.testing.assert_close(analytic, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", ["eager", "fused"])
def test_no_block_larger_than_chunk(backend, generator, largest_tensor):
    """Forward and backward never materialise more than chunk_size × n2 kernel entries."""
    kernel = _kernel("matern32", 2, True, generator)
    n, chunk = 200, 16
    x1, x2, rhs = _data(generator, n1=n, n2=n, d=2, k=3)
    x1.requires_grad_()
    with largest_tensor() as forward:
        out = kernel_matmul(kernel, x1, x2, rhs, chunk_size=chunk, backend=backend)
    with largest_tensor() as backward:
        out.square().sum().backward()
    assert kernel.base_kernel.raw_lengthscale.grad is not None and x1.grad is not None
    # the blocks (16 × 200), and nothing of the n² = 40,000 entries, in either pass
    assert forward.largest == chunk * n and backward.largest == chunk * n


@pytest.mark.parametrize("ard", [True, False], ids=["ard", "iso"])
def test_compiled_values_and_gradients(ard, generator):
    """The torch.compile'd fused path equals dense float64 values and gradients.

    One profile only (compilation costs seconds); the others share the code path and their
    formulas are checked uncompiled above.
    """
    kernel = _kernel("matern32", 3, ard, generator)
    x1, x2, rhs = _data(generator, n1=31, n2=29)
    weights = torch.randn(31, 4, generator=generator)
    expected = _grads(lambda k, a, b, v: kernel_matrix(k, a, b) @ v, kernel, x1, x2, rhs, weights)
    actual = _grads(lambda k, a, b, v: kernel_matmul(k, a, b, v, chunk_size=8,
                                                     backend="compiled"),
                    kernel, x1, x2, rhs, weights)
    with torch.no_grad():
        values = kernel_matmul(kernel, x1, x2, rhs, chunk_size=9, backend="compiled")
    torch.testing.assert_close(values, kernel_matrix(kernel, x1, x2) @ rhs, rtol=1e-12,
                               atol=1e-12)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


def test_compile_failure_falls_back_with_one_warning():
    """A failing torch.compile warns once and then runs the uncompiled function."""
    def broken_compiler(fn, dynamic):
        def raises(*args):
            raise torch._dynamo.exc.TorchDynamoException("no C++ compiler")
        return raises

    wrapped = fused._CompiledFunction(fused._rbf_value, compiler=broken_compiler)
    first, second, sq = torch.zeros(2, 3, 3), torch.zeros(2, 3, 3), torch.ones(2, 3, 1)
    with pytest.warns(RuntimeWarning, match="torch.compile failed.*no C\\+\\+ compiler"):
        wrapped(first, sq, sq.mT)  # in place: P ← exp(−D²/2), D² = 1 + 1 − 2·0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped(second, sq, sq.mT)
    torch.testing.assert_close(first, torch.full((2, 3, 3), torch.e**-1.0))
    torch.testing.assert_close(second, first)


def test_keops_missing_raises_clear_import_error(generator):
    """backend='keops' without pykeops names the extra to install."""
    if importlib.util.find_spec("pykeops") is not None:
        pytest.skip("pykeops is installed; this test covers its absence")
    kernel = _kernel("rbf", 3, True, generator)
    x1, x2, rhs = _data(generator)
    with pytest.raises(ImportError, match=r"pip install gpscale\[keops\]"):
        kernel_matmul(kernel, x1, x2, rhs, backend="keops")


def test_auto_backend_rule(generator):
    """auto: unsupported kernel → eager; small CPU product → fused; large CPU → native (or
    compiled where the native kernels cannot be built)."""
    small = torch.zeros(10, 2)
    large = torch.zeros(AUTO_COMPILE_MIN_ENTRIES // 1000 + 1, 2)
    supported = make_kernel("matern32", 2)
    assert select_backend(gpytorch.kernels.PeriodicKernel(), large, large[:1000]) == "eager"
    assert select_backend(supported, small, small) == "fused"
    expected = "native" if native.available(large) else "compiled"
    assert select_backend(supported, large, large[:1000]) == expected
    assert select_backend(supported, small, small, "eager") == "eager"
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        select_backend(supported, small, small, "gpu")


def test_fused_backend_rejects_other_kernels(generator):
    """The fused path names the kernels it supports and the backend that runs the rest."""
    x1, x2, rhs = _data(generator)
    with pytest.raises(ValueError, match="backend='eager'"):
        kernel_matmul(gpytorch.kernels.PeriodicKernel(), x1, x2, rhs, backend="fused")


def test_shape_mismatch_raises(generator):
    """A rhs whose length differs from n2 is a ValueError naming the shapes."""
    x1, x2, _ = _data(generator)
    with pytest.raises(ValueError, match="rhs"):
        kernel_matmul(make_kernel("rbf", 3), x1, x2, torch.ones(5, 2))


def test_kernel_hyperparameters_reads_gpytorch_modules(generator):
    """Profile, lengthscale and outputscale of ScaleKernel(Matérn) and a bare RBF."""
    kernel = _kernel("matern52", 3, True, generator)
    hp = kernel_hyperparameters(kernel)
    assert hp.profile == "matern52"
    torch.testing.assert_close(hp.lengthscale, kernel.base_kernel.lengthscale)
    torch.testing.assert_close(hp.outputscale, kernel.outputscale)
    bare = kernel_hyperparameters(gpytorch.kernels.RBFKernel())
    assert bare.profile == "rbf" and float(bare.outputscale) == 1.0
    assert kernel_hyperparameters(gpytorch.kernels.RBFKernel(active_dims=[0])) is None


def test_make_kernel_unknown_name():
    """make_kernel lists the valid names (an unknown name is an expression that does not
    parse)."""
    with pytest.raises(ValueError, match="unknown kernel 'laplace'; valid: rbf, matern12"):
        make_kernel("laplace")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["eager", "fused", "compiled"])
def test_cuda_matmul_and_gradients_equal_cpu_dense(backend, generator):
    """On CUDA, values and gradients equal the dense CPU float64 reference."""
    kernel = _kernel("matern32", 3, True, generator)
    x1, x2, rhs = _data(generator, n1=300, n2=200)
    weights = torch.randn(300, 4, generator=generator)
    expected = _grads(lambda k, a, b, v: kernel_matrix(k, a, b) @ v, kernel, x1, x2, rhs, weights)
    kernel_cuda = kernel.cuda()
    actual = _grads(lambda k, a, b, v: kernel_matmul(k, a, b, v, chunk_size=64, backend=backend),
                    kernel_cuda, x1.cuda(), x2.cuda(), rhs.cuda(), weights.cuda())
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a.cpu(), e, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("batch", [None, torch.Size([2])], ids=["plain", "batched"])
@pytest.mark.parametrize("ard", [True, False], ids=["ard", "iso"])
@pytest.mark.parametrize("name", STATIONARY)
def test_kernel_matrix_equals_gpytorch(name, ard, batch, generator):
    """kernel_matrix (one fused autograd node) = GPyTorch's K(x1, x2): values and gradients in
    both inputs and the hyperparameters; K(x, x) holds the outputscale on its diagonal."""
    kernel = _kernel(name, 3, ard, generator, batch_shape=batch)
    x1, x2, _ = _data(generator)
    weights = torch.randn(*(batch or ()), 23, 17, generator=generator)
    results = []
    for fn in (kernel_matrix, lambda k, a, b: k(a, b).to_dense()):
        a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
        K = fn(kernel, a, b)
        leaves = [a, b, kernel.raw_outputscale, kernel.base_kernel.raw_lengthscale]
        results.append((K, torch.autograd.grad((K * weights).sum(), leaves)))
    (ours, ours_grads), (theirs, their_grads) = results
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    for a, e in zip(ours_grads, their_grads, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-11)
    with torch.no_grad():
        diagonal = kernel_matrix(kernel, x1, x1).diagonal(dim1=-2, dim2=-1)
    torch.testing.assert_close(diagonal, kernel.outputscale[..., None].expand_as(diagonal),
                               rtol=0, atol=0)


def _far(value: float) -> torch.Tensor:
    return torch.tensor([[value, -value, 0.5 * value]])


@pytest.mark.parametrize("backend", ["fused", "native", "kernel_matrix", "block_sparse_rect"])
@pytest.mark.parametrize("name", STATIONARY)
def test_far_points_give_zero_and_move_no_other_row(name, backend, generator):
    """Issue #46: a point at 10⁸, 10²⁰ or 10²⁰⁰ among the rows (x1) or the columns (x2) of
    K(x1, x2) V: its row is exactly 0, its column adds nothing, and every other row is as
    without it — GPyTorch's centring on a batch mean moved them, Matérn gave ∞ · 0 = NaN."""
    if backend in ("native", "block_sparse_rect") and not native.available(torch.zeros(1)):
        pytest.skip("no C compiler for the native kernels")
    kernel = _kernel(name, 3, True, generator)
    x1, x2, rhs = _data(generator)
    if backend == "block_sparse_rect":
        actions = BlockSparseActions(rhs[:, 0], torch.randperm(17, generator=generator),
                                     num_blocks=4)

        def product(a, b, v):  # far columns need actions of their own size: rows only
            return kernel_block_sparse_rect_matmul(kernel, x2, actions, x_rows=a)
    elif backend == "kernel_matrix":
        def product(a, b, v):
            return kernel_matrix(kernel, a, b) @ v
    else:
        def product(a, b, v):
            return kernel_matmul(kernel, a, b, v, backend=backend)
    alone = product(x1, x2, rhs)
    for value in (1e8, 1e20, 1e200):
        got = product(torch.cat([x1[:5], _far(value), x1[5:]]), x2, rhs)
        assert torch.equal(got[5], torch.zeros_like(got[5]))
        torch.testing.assert_close(torch.cat([got[:5], got[6:]]), alone, rtol=1e-12, atol=1e-14)
        if backend == "block_sparse_rect":
            continue
        extra = torch.randn(1, rhs.shape[1], generator=generator)
        got = product(x1, torch.cat([_far(value), x2]), torch.cat([extra, rhs]))
        torch.testing.assert_close(got, alone, rtol=1e-12, atol=1e-14)


def test_inducing_factor_equals_gpytorchs(generator):
    """K(x, z) K_zz^{-1/2} with GPyTorch's cached root = GPyTorch's own left factor on ordinary
    points (its SGPR prediction caches are in that basis)."""
    base = _kernel("matern32", 2, True, generator)
    z = torch.randn(6, 2, generator=generator)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    kernel = gpytorch.kernels.InducingPointKernel(base, inducing_points=z, likelihood=likelihood)
    kernel.eval()
    x = torch.randn(9, 2, generator=generator)
    theirs = base(x, z).to_dense() @ kernel._inducing_inv_root
    torch.testing.assert_close(inducing_factor(kernel, x), theirs, rtol=1e-12, atol=1e-12)
