"""The hand-written backward of :func:`gpscale.linalg.composed.composed_matmul`
(:func:`gpscale.linalg.composed_grad.composed_vjp`) against two dense references: the dense
twin :func:`gpscale.linalg.composed.dense_tile` under autograd (the gradients the product had
when its backward recomputed each chunk under autograd) and GPyTorch's own composition of
ScaleKernel / RBFKernel / MaternKernel on active_dims, evaluated densely."""

from __future__ import annotations

import pytest
import torch
from tests.linalg.test_native_composed import KERNELS, _gpytorch_kernel, _problem

from gpscale.kernels import composed_terms
from gpscale.linalg import fused, native
from gpscale.linalg.composed import ComposedLeaf, ComposedTerm, composed_matmul, dense_tile

# KERNELS (sums of wide groups, a product term, leaves sharing columns, a shared lengthscale
# on 8 columns) and: a product of two wide groups, one with a shared lengthscale, and a term
# of three leaves on narrow groups.
SPECS = {
    **KERNELS,
    "wide product + three leaves": [
        (0.8, (("rbf", [0, 1, 2, 3], [0.7, 1.2, 0.9, 1.1]), ("matern52", [4, 5, 6, 7], [1.3]))),
        (0.3, (("rbf", [0], [0.9]), ("matern32", [1, 2], [1.1, 0.7]), ("matern52", [3], [1.2]))),
    ],
}
NO_MATERN12 = [name for name, spec in SPECS.items()
               if all(profile != "matern12" for _, leaves in spec for profile, _, _ in leaves)]


@pytest.fixture(params=["native", "tiles"])
def path(request):
    """The forward in C ('native') or by the compiled tiles ('tiles'); the backward is the same
    hand-written product on either, with V̄ by the same forward transposed."""
    if request.param == "native" and not native.available():
        pytest.skip("no C compiler for the native kernels")
    return request.param == "native"


@pytest.fixture(params=["one chunk", "small chunks"])
def chunk(request, monkeypatch):
    """'small chunks': 7 rows per chunk, tiles of 50 entries (many ragged row and column
    blocks in the backward) and the native products' small tasks (as in
    ``test_native_composed``'s 'small tiles'); 'one chunk': the defaults."""
    if request.param == "one chunk":
        return None
    monkeypatch.setattr(fused, "TILE_ENTRIES", 50)
    monkeypatch.setattr(native, "_ROWS_PER_TASK", 2)
    monkeypatch.setattr(native, "_SPAN_BYTES", 40)
    return 7


def _inputs(generator, layout: str, dtype=torch.float64, n: int = 60, t: int = 23):
    """(x1, x2, V) requiring gradients; 'symmetric': x1 is x2."""
    x, x1, V = _problem(generator, n=n, t=t, k=3, dtype=dtype)
    x.requires_grad_()
    V.requires_grad_()
    if layout == "symmetric":
        return x, x, V
    return x1.requires_grad_(), x, V


def _grads(out, x1, x2, V, kernel, weights):
    """∂/∂(x1, x2, V, kernel parameters) of Σ weights ⊙ out (x1's and x2's added when one)."""
    inputs = [x1, V, *kernel.parameters()] if x1 is x2 else [x1, x2, V, *kernel.parameters()]
    return torch.autograd.grad((out * weights).sum(), inputs)


def _compare(kernel, x1, x2, V, reference, *, generator, rtol, atol, **options):
    out = composed_matmul(composed_terms(kernel), x1, x2, V, **options)
    expected = reference(x1, x2) @ V
    weights = torch.randn(out.shape, generator=generator, dtype=out.dtype)
    got = _grads(out, x1, x2, V, kernel, weights)
    want = _grads(expected, x1, x2, V, kernel, weights)
    names = ["x1", "V"] if x1 is x2 else ["x1", "x2", "V"]
    names += [name for name, _ in kernel.named_parameters()]
    for name, a, b in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("layout", ["symmetric", "rectangular"])
@pytest.mark.parametrize("name", list(SPECS))
def test_gradients_match_the_dense_twin(name, layout, path, chunk, generator):
    """The gradients of x1, x2, V and every lengthscale and output scale equal those of the
    dense twin under autograd (what the autograd recompute returned), on both forwards, one
    chunk or many small ones, symmetric (x1 is x2: both roles add) or rectangular."""
    kernel = _gpytorch_kernel(SPECS[name])
    x1, x2, V = _inputs(generator, layout)
    _compare(kernel, x1, x2, V, lambda a, b: dense_tile(composed_terms(kernel), a, b),
             generator=generator, rtol=1e-10, atol=1e-12, chunk=chunk, native_forward=path)


# GPyTorch's Matérn-1/2 keeps its distance expansion's rounding (about 1e-8 in r) on the
# diagonal of K(x, x) with gradients, where the profile has its kink: symmetric products are
# compared for the kernels without that profile (the dense twin covers the rest).
@pytest.mark.parametrize(("name", "layout"),
                         [(name, "rectangular") for name in SPECS]
                         + [(name, "symmetric") for name in NO_MATERN12])
def test_gradients_match_gpytorch(name, layout, path, generator):
    """The gradients equal those of GPyTorch's dense composition of the same kernel."""
    kernel = _gpytorch_kernel(SPECS[name])
    x1, x2, V = _inputs(generator, layout)
    _compare(kernel, x1, x2, V, lambda a, b: kernel(a, b).to_dense(), generator=generator,
             rtol=1e-10, atol=1e-12, native_forward=path)


def test_inducing_points_alone(path, chunk, generator):
    """x2 alone requires a gradient (inducing points: K(x, z) u), x1 does not; and with no
    hyperparameter gradients V̄ alone is the transposed forward."""
    kernel = _gpytorch_kernel(SPECS["rbf * matern52 + matern12"])
    z, x, u = _problem(generator, n=31, t=50, k=2)  # z (31, 8), x (50, 8), u (31, 2)
    z.requires_grad_()
    u.requires_grad_()
    out = composed_matmul(composed_terms(kernel), x, z, u, chunk=chunk, native_forward=path)
    expected = dense_tile(composed_terms(kernel), x, z) @ u
    weights = torch.randn(out.shape, generator=generator)
    got = torch.autograd.grad((out * weights).sum(), [z, u, *kernel.parameters()])
    want = torch.autograd.grad((expected * weights).sum(), [z, u, *kernel.parameters()])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    kernel.requires_grad_(False)
    out = composed_matmul(composed_terms(kernel), x, z, u, chunk=chunk, native_forward=path)
    (grad_u,) = torch.autograd.grad((out * weights).sum(), [u])
    torch.testing.assert_close(grad_u, dense_tile(composed_terms(kernel), z, x) @ weights,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", ["symmetric", "rectangular"])
@pytest.mark.parametrize("name", list(SPECS))
def test_float32_stays_close_to_float64(name, layout, path, generator):
    """In float32 every gradient stays within 1e-4 of the float64 dense twin's, relative to
    its largest entry: most agree to a few 1e-6, but an output scale whose gradient Σ M ⊙ P_t
    nearly cancels (terms of order 1 summing to 6e-3 for the wide product here) keeps the
    float32 sum's absolute error, about 6e-5 relative to itself, as the autograd recompute
    of the dense twin does in float32."""
    kernel = _gpytorch_kernel(SPECS[name])
    x1, x2, V = _inputs(generator, layout)
    weights = torch.randn(x1.shape[0], V.shape[1], generator=generator)
    want = _grads(dense_tile(composed_terms(kernel), x1, x2) @ V, x1, x2, V, kernel, weights)
    kernel.float()
    a = x1.detach().float().requires_grad_()
    b = a if x1 is x2 else x2.detach().float().requires_grad_()
    v = V.detach().float().requires_grad_()
    out = composed_matmul(composed_terms(kernel), a, b, v, native_forward=path)
    got = _grads(out, a, b, v, kernel, weights.float())
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        assert (g.double() - w).abs().max() <= 1e-4 * w.abs().max()


def test_float64_hyperparameters_with_float32_inputs(path, generator):
    """A model whose hyperparameters are float64 and whose data are float32 (the native path
    declines mixed dtypes, the tiles take them): the product comes back in the inputs' dtype,
    each gradient in its own tensor's, within float32's rounding of the float64 twin."""
    kernel = _gpytorch_kernel(SPECS["wide product + three leaves"])
    x1, x2, V = _inputs(generator, "rectangular")
    weights = torch.randn(x1.shape[0], V.shape[1], generator=generator)
    want = _grads(dense_tile(composed_terms(kernel), x1, x2) @ V, x1, x2, V, kernel, weights)
    a, b, v = (t.detach().float().requires_grad_() for t in (x1, x2, V))
    out = composed_matmul(composed_terms(kernel), a, b, v, native_forward=path)
    assert out.dtype == torch.float32
    got = _grads(out, a, b, v, kernel, weights.float())
    assert [g.dtype for g in got[:3]] == [torch.float32] * 3  # x1, x2, V
    assert all(g.dtype == torch.float64 for g in got[3:])  # the kernel's parameters
    for g, w in zip(got, want, strict=True):  # float32 sums over the tile, in any order
        assert (g.double() - w).abs().max() <= 3e-4 * w.abs().max()


@pytest.mark.parametrize("profile", ["matern12", "matern32", "matern52", "rbf"])
def test_coincident_points_match_the_dense_twin(profile, path, chunk, generator):
    """At coincident points (the diagonal and duplicated rows) D² = 0 exactly in groups of at
    most three columns; there φ' is taken as 0 for the Matérn profiles, as the dense twin's
    clamp of D² at 1e-30 makes autograd take it (Matérn-1/2's dφ/dD² is infinite there), so a
    coincident pair adds nothing to any gradient and the rest match to rounding."""
    spec = [(0.6, ((profile, [0, 1], [0.7, 1.2]),)),
            (0.3, ((profile, [2], [0.5]), ("matern32", [0, 2], [0.9, 1.1])))]
    kernel = _gpytorch_kernel(spec)
    x = 0.8 * torch.randn(40, 3, generator=generator)
    x = torch.cat([x, x[:10]]).requires_grad_()  # rows 40-49 repeat rows 0-9
    V = torch.randn(50, 2, generator=generator, requires_grad=True)
    _compare(kernel, x, x, V, lambda a, b: dense_tile(composed_terms(kernel), a, b),
             generator=generator, rtol=1e-10, atol=1e-12, chunk=chunk, native_forward=path)


def test_wide_matern12_at_coincident_points(path, generator):
    """Matérn-1/2 on a group of four columns, at coincident points: D² comes from the norm
    expansion there (in the backward as in the dense twin), so a coincident pair has a D² of
    rounding size ε‖z‖² instead of 0, and φ = e^{-r} is 1 − O(√ε) at it, differently in each
    (the native forward takes differences and has exactly 1). The gradients then agree with
    the dense twin's to about √ε ≈ 1.5e-8 relative, not to rounding; the other terms are
    unaffected."""
    spec = [(0.7, (("matern12", [0, 1, 2, 3], [0.8, 1.1, 0.6, 1.3]),)),
            (0.3, (("rbf", [1, 2], [0.9, 1.2]),))]
    kernel = _gpytorch_kernel(spec)
    x = 0.8 * torch.randn(60, 4, generator=generator)
    x = torch.cat([x, x[:10]]).requires_grad_()  # rows 60-69 repeat rows 0-9
    V = torch.randn(70, 2, generator=generator, requires_grad=True)
    # √ε-sized differences on gradients of order 1-10
    _compare(kernel, x, x, V, lambda a, b: dense_tile(composed_terms(kernel), a, b),
             generator=generator, rtol=1e-6, atol=1e-6, native_forward=path)


def test_gradcheck(generator, one_thread):
    """Finite differences (``torch.autograd.gradcheck``) of x1, x2, V, the output scales and
    the lengthscales of a sum with a product term and a shared lengthscale, n ≤ 10."""
    x1, x2 = torch.randn(6, 4, generator=generator), torch.randn(9, 4, generator=generator)
    V = torch.randn(9, 2, generator=generator)
    params = [torch.tensor(0.8), torch.tensor([[0.9, 1.3]]), torch.tensor([[1.1]]),
              torch.tensor(0.4), torch.tensor([[0.7, 1.2, 0.6]])]

    def product(x1, x2, V, s1, ell1, ell2, s2, ell3):
        terms = (ComposedTerm(s1, (ComposedLeaf("rbf", torch.tensor([0, 1]), ell1),
                                   ComposedLeaf("matern52", torch.tensor([2, 3]), ell2))),
                 ComposedTerm(s2, (ComposedLeaf("matern32", torch.tensor([0, 2, 3]), ell3),)))
        return composed_matmul(terms, x1, x2, V)

    inputs = [t.requires_grad_() for t in (x1, x2, V, *params)]
    assert torch.autograd.gradcheck(product, inputs)
