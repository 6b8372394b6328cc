"""The native composed product (:func:`gpscale.linalg.native.composed_product`, the forward of
:func:`gpscale.linalg.composed.composed_matmul` on the CPU) against GPyTorch's own composition of
ScaleKernel / RBFKernel / MaternKernel on active_dims, evaluated densely."""

from __future__ import annotations

import pytest
import torch
from gpytorch.kernels import AdditiveKernel, MaternKernel, ProductKernel, RBFKernel, ScaleKernel

from gpscale.kernels import composed_terms
from gpscale.linalg import native
from gpscale.linalg.composed import composed_matmul, native_applies

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler for the kernels")

_LEAVES = {"rbf": RBFKernel, "matern12": lambda **kw: MaternKernel(nu=0.5, **kw),
           "matern32": lambda **kw: MaternKernel(nu=1.5, **kw),
           "matern52": lambda **kw: MaternKernel(nu=2.5, **kw)}

# (outputscale, ((profile, active_dims, lengthscales), ...)) per term, on d = 8 columns.
KERNELS = {
    "matern32 + rbf": [(1.3, (("matern32", [0, 1, 2, 3], [0.6, 1.1, 0.8, 1.4]),)),
                       (0.7, (("rbf", [4, 5, 6, 7], [0.9, 0.5, 1.2, 0.7]),))],
    "rbf * matern52 + matern12": [(0.9, (("rbf", [0, 1], [0.7, 1.3]),
                                         ("matern52", [2, 5, 6], [0.8, 0.6, 1.1]))),
                                  (0.4, (("matern12", [3, 4, 7], [1.5]),))],
    "shared columns": [(1.1, (("matern32", [0, 1, 2, 3, 4, 5, 6, 7], [0.9]),)),
                       (0.2, (("matern12", [1, 2], [0.4, 0.7]), ("rbf", [2, 3], [0.6, 0.9])))],
}


def _gpytorch_kernel(spec) -> AdditiveKernel:
    """The composed kernel ``spec`` built from GPyTorch's kernels (the dense reference)."""
    terms = []
    for outputscale, leaves in spec:
        parts = []
        for profile, dims, lengthscale in leaves:
            leaf = _LEAVES[profile](active_dims=torch.tensor(dims),
                                    ard_num_dims=len(lengthscale) if len(lengthscale) > 1 else None)
            leaf.lengthscale = torch.tensor([lengthscale])
            parts.append(leaf)
        term = ScaleKernel(parts[0] if len(parts) == 1 else ProductKernel(*parts))
        term.outputscale = outputscale
        terms.append(term)
    return AdditiveKernel(*terms).double()


@pytest.fixture(params=["one tile", "small tiles"])
def tiles(request, monkeypatch):
    """'small tiles' shrinks the tasks and the column spans so that a small problem has many
    rounds, diagonal tiles, mirrored tiles, ragged edges and more tasks than threads, and its
    rectangular products split rows rather than columns ('one tile': few rows, columns split)."""
    if request.param == "small tiles":
        monkeypatch.setattr(native, "_ROWS_PER_TASK", 2)
        monkeypatch.setattr(native, "_SPAN_BYTES", 40)
    return request.param


@pytest.fixture
def calls(monkeypatch):
    """Records whether each native composed product was symmetric (z2 None)."""
    seen: list[bool] = []
    product = native.composed_product

    def spy(terms, z1, z2, rhs):
        seen.append(z2 is None)
        return product(terms, z1, z2, rhs)

    monkeypatch.setattr(native, "composed_product", spy)
    return seen


def _problem(generator, n=300, t=37, k=3, dtype=torch.float64):
    x = 0.8 * torch.randn(n, 8, generator=generator, dtype=torch.float64)
    x1 = 0.8 * torch.randn(t, 8, generator=generator, dtype=torch.float64)
    V = torch.randn(n, k, generator=generator, dtype=torch.float64)
    return x.to(dtype), x1.to(dtype), V.to(dtype)


# n = 300 has more than one 256-column chunk; t = 37 is a ragged number of 6-row panels. k = 1
# takes the scalar-column loops, 3 and 37 are padded to the vector width (37 has a full pass of
# vectors and a shorter one on every CPU), 8 is a multiple of it in both dtypes.
@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("k", [1, 3, 8, 37])
def test_matches_gpytorch_float64(name, k, generator, tiles, calls):
    """K(x1, x) V and K(x, x) V by the native forward equal GPyTorch's dense composition to
    rounding (the rectangular product by few rows or by row tasks, the symmetric one by
    mirrored tiles)."""
    kernel = _gpytorch_kernel(KERNELS[name])
    terms = composed_terms(kernel)
    x, x1, V = _problem(generator, k=k)
    with torch.no_grad():
        rect, sym = composed_matmul(terms, x1, x, V), composed_matmul(terms, x, x, V)
        expected_rect = kernel(x1, x).to_dense() @ V
        expected_sym = kernel(x, x).to_dense() @ V
    assert calls == [False, True]
    torch.testing.assert_close(rect, expected_rect, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(sym, expected_sym, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(KERNELS))
def test_float32_stays_close_to_float64(name, generator, tiles, calls):
    """In float32 (the polynomial exponential, float32 sums over n = 300 columns) the product
    stays within 1e-5 of the float64 reference, relative to its largest entry."""
    kernel = _gpytorch_kernel(KERNELS[name])
    x, x1, V = _problem(generator, k=5)
    terms32, x32, V32 = composed_terms(kernel.float()), x.float(), V.float()
    with torch.no_grad():
        sym = composed_matmul(terms32, x32, x32, V32)
        rect = composed_matmul(terms32, x1.float(), x32, V32)
        kernel.double()
        expected_sym, expected_rect = (kernel(a, x).to_dense() @ V for a in (x, x1))
    assert calls == [True, False]
    for got, expected in ((sym, expected_sym), (rect, expected_rect)):
        assert got.dtype == torch.float32
        assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_few_rows_split_the_columns(generator, monkeypatch):
    """Fewer rows than one task per thread: each thread takes a range of columns into an output
    of its own, and their sum is the product."""
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        kernel = _gpytorch_kernel(KERNELS["rbf * matern52 + matern12"])
        x, x1, V = _problem(generator, n=301, t=4, k=2)
        with torch.no_grad():
            out = composed_matmul(composed_terms(kernel), x1, x, V)
            expected = kernel(x1, x).to_dense() @ V
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_coincident_points_give_phi_of_zero(dtype, generator, tiles):
    """Distances come from differences: at coincident points (the diagonal and duplicated rows)
    every leaf is exactly φ(0) = 1, so K(x, x) I holds the sum of the output scales there, and
    the Matérn-1/2 kink at 0 costs no accuracy elsewhere (reference from exact differences:
    GPyTorch's distance expansion leaves about 1e-8 in r at 0)."""
    spec = [(0.6, (("matern12", [0, 1], [0.7, 1.2]),)),
            (0.3, (("matern12", [2], [0.5]), ("matern32", [0, 2], [0.9, 1.1])))]
    terms = composed_terms(_gpytorch_kernel(spec).to(dtype))
    x = 0.8 * torch.randn(40, 3, generator=generator, dtype=torch.float64)
    x = torch.cat([x, x[:10]])  # rows 40-49 repeat rows 0-9
    with torch.no_grad():
        K = composed_matmul(terms, x.to(dtype), x.to(dtype), torch.eye(50, dtype=dtype))
    r1 = torch.cdist(x[:, :2] / torch.tensor([0.7, 1.2]), x[:, :2] / torch.tensor([0.7, 1.2]),
                     compute_mode="donot_use_mm_for_euclid_dist")
    r2 = torch.cdist(x[:, 2:] / 0.5, x[:, 2:] / 0.5, compute_mode="donot_use_mm_for_euclid_dist")
    z3 = x[:, [0, 2]] / torch.tensor([0.9, 1.1])
    r3 = 3**0.5 * torch.cdist(z3, z3, compute_mode="donot_use_mm_for_euclid_dist")
    s1, s2 = (float(term.outputscale.detach()) for term in terms)
    expected = s1 * torch.exp(-r1) + s2 * torch.exp(-r2) * (1 + r3) * torch.exp(-r3)
    scales = torch.tensor(s1, dtype=dtype) + torch.tensor(s2, dtype=dtype)
    assert (K.diagonal() == scales).all()
    assert (K.diagonal(40) == scales).all() and (K.diagonal(-40) == scales).all()
    # float32: the polynomial exponential and float32 products, about 1e-7 relative
    tol = 1e-13 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(K.double(), expected, rtol=tol, atol=tol)


def test_unavailable_native_falls_back_to_the_tiles(generator, monkeypatch, calls):
    """Without the C kernels (``native.available`` False) or with ``native_forward=False`` the
    compiled tiles compute the same product, and the C product is not called."""
    terms = composed_terms(_gpytorch_kernel(KERNELS["rbf * matern52 + matern12"]))
    x, x1, V = _problem(generator, n=90, t=20, k=3)
    with torch.no_grad():
        expected = composed_matmul(terms, x, x, V)
        tiles = composed_matmul(terms, x, x, V, native_forward=False)
        monkeypatch.setattr(native, "available", lambda t=None: False)
        assert not native_applies(terms, x, x, V)
        fallback = composed_matmul(terms, x, x, V)
    assert calls == [True]
    torch.testing.assert_close(fallback, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tiles, expected, rtol=1e-12, atol=1e-12)


def test_gradients_of_the_symmetric_product_match_gpytorch(generator, calls):
    """With gradients the forward stays native (all rows, symmetric) and the backward
    recomputes under autograd: the gradients of x, V and every hyperparameter equal GPyTorch's
    dense ones. (No Matérn-1/2 here: with gradients GPyTorch keeps its distance expansion's
    error of about 1e-8 in r on the diagonal, where that profile has its kink.)"""
    kernel = _gpytorch_kernel([(0.9, (("rbf", [0, 1], [0.7, 1.3]),
                                      ("matern52", [2, 5, 6], [0.8, 0.6, 1.1]))),
                               (0.4, (("matern32", [3, 4, 7], [1.5]),))])
    x, _, V = _problem(generator, n=60, k=2)
    x.requires_grad_()
    V.requires_grad_()
    out = composed_matmul(composed_terms(kernel), x, x, V)
    ref = kernel(x, x).to_dense() @ V
    assert calls == [True]
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    weights = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    params = [x, V, *kernel.parameters()]
    got = torch.autograd.grad((out * weights).sum(), params)
    want = torch.autograd.grad((ref * weights).sum(), params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_composed_product_checks_its_arguments(generator):
    """Widths that do not cover the inputs, a term without leaves, an unknown profile and mixed
    dtypes are errors naming them (the C kernel would read out of bounds); empty products give
    zeros of the right shape."""
    z, V = torch.randn(9, 4, generator=generator), torch.randn(9, 3, generator=generator)
    terms = [(1.0, [("rbf", 2), ("matern32", 2)])]
    assert native.composed_product(terms, z[:0], z, V).shape == (0, 3)
    assert native.composed_product(terms, z, None, V[:, :0]).shape == (9, 0)
    with pytest.raises(ValueError, match=r"sum to the inputs' 4 columns; got \[\[2, 1\]\]"):
        native.composed_product([(1.0, [("rbf", 2), ("matern32", 1)])], z, None, V)
    with pytest.raises(ValueError, match="one or more leaves"):
        native.composed_product([*terms, (1.0, [])], z, None, V)
    with pytest.raises(ValueError, match="unknown profile 'cosine'"):
        native.composed_product([(1.0, [("cosine", 4)])], z, None, V)
    with pytest.raises(ValueError, match=r"rhs \(8, 3\)"):
        native.composed_product(terms, z, None, V[:8])
    with pytest.raises(ValueError, match="inputs of one dtype"):
        native.composed_product(terms, z, None, V.float())
