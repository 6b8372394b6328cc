"""The convolutional kernel and the convolutional SOLVE-GP / SVGP (notes/004 §2.12): patches,
K_uf, diag K_ff and K_ff against explicit loops over patches in float64; a whole-image patch
reduces the model to plain SOLVE-GP; gradients by gradcheck; the blocks change nothing."""

from __future__ import annotations

import pytest
import torch

import gpscale.methods.solvegp.conv_kernel as conv_kernel
from gpscale.kernels import make_kernel
from gpscale.methods import build
from gpscale.methods.solvegp import ConvKernel, ImageShape, PatchGeometry, infer_image_shape

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems


def _images(n, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, shape.size, generator=g, dtype=torch.float64)


def _loop_patches(x, geometry):
    """Patches by explicit loops: (b, P, C·k²), channel-first inside a patch."""
    s, k, pad = geometry.image, geometry.patch, geometry.padding
    images = x.reshape(-1, s.height, s.width, s.channels)
    padded = torch.zeros(x.shape[0], s.height + 2 * pad, s.width + 2 * pad, s.channels,
                         dtype=x.dtype)
    padded[:, pad:pad + s.height, pad:pad + s.width] = images
    rows, cols = geometry.grid
    out = []
    for r in range(rows):
        for c in range(cols):
            window = padded[:, r * geometry.stride:r * geometry.stride + k,
                            c * geometry.stride:c * geometry.stride + k]  # (b, k, k, C)
            out.append(window.permute(0, 3, 1, 2).reshape(x.shape[0], -1))
    return torch.stack(out, 1)


GEOMETRIES = [
    PatchGeometry(ImageShape(6, 5, 1), patch=3, stride=1, padding=0),
    PatchGeometry(ImageShape(6, 6, 3), patch=2, stride=2, padding=1),
    PatchGeometry(ImageShape(5, 7, 2), patch=3, stride=2, padding=0),
]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["grey", "colour-padded", "strided"])
def test_patches_match_explicit_loops(geometry):
    x = _images(3, geometry.image)
    got = geometry.patches(x)
    assert got.shape == (3, geometry.num_patches, geometry.patch_dims)
    torch.testing.assert_close(got, _loop_patches(x, geometry), rtol=0, atol=0)


def _kernel(geometry, tick, seed=1):
    k = ConvKernel(make_kernel("rbf", geometry.patch_dims, ard=False), geometry,
                   location_kernel=tick, location_lengthscale=1.7).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        k.weights.copy_(torch.rand(geometry.num_patches, generator=g, dtype=torch.float64))
    k.patch_kernel.initialize(outputscale=1.3, **{"base_kernel.lengthscale": 0.9})
    return k


def _k(kernel, a, b):
    return kernel(a[None], b[None]).to_dense()[0, 0]


def _loop_cross_and_diag(k, w, x):
    """K_uf[i, j] = Σ_p w_p k_g(z_i, x_j^p) k_ℓ(l_i, l_p) and diag K_ff, by loops."""
    g = k.geometry
    patches, locs = _loop_patches(x, g), g.locations(x)
    z = w[:, :g.patch_dims]
    cross = torch.zeros(w.shape[0], x.shape[0], dtype=torch.float64)
    diag = torch.zeros(x.shape[0], dtype=torch.float64)
    for j in range(x.shape[0]):
        for p in range(g.num_patches):
            for i in range(w.shape[0]):
                factor = _k(k.location_kernel, w[i, -2:], locs[p]) if k.location_kernel else 1
                cross[i, j] += k.weights[p] * _k(k.patch_kernel, z[i], patches[j, p]) * factor
            for q in range(g.num_patches):
                factor = _k(k.location_kernel, locs[p], locs[q]) if k.location_kernel else 1
                diag[j] += (k.weights[p] * k.weights[q] * factor
                            * _k(k.patch_kernel, patches[j, p], patches[j, q]))
    return cross, diag


@pytest.mark.parametrize("tick", [False, True], ids=["conv", "tick"])
@pytest.mark.parametrize("geometry", GEOMETRIES[:2], ids=["grey", "colour-padded"])
def test_covariances_match_sums_over_patches(geometry, tick):
    k = _kernel(geometry, tick)
    x = _images(3, geometry.image)
    g = torch.Generator().manual_seed(2)
    w = torch.rand(4, k.inducing_dims, generator=g, dtype=torch.float64)
    with torch.no_grad():
        cross, diag = _loop_cross_and_diag(k, w, x)
        torch.testing.assert_close(k.cross_covariance(w[None], x)[0], cross)
        torch.testing.assert_close(k.prior_variance(x), diag)
        full = k(x, x)
        torch.testing.assert_close(full.diagonal(), diag)
        torch.testing.assert_close(full, full.mT)
        assert torch.linalg.eigvalsh(full).min() > -1e-10  # a covariance
        # K_uu: the patch kernel (times the location kernel) among inducing inputs
        expected = torch.stack([torch.stack([
            _k(k.patch_kernel, a[:geometry.patch_dims], b[:geometry.patch_dims])
            * (_k(k.location_kernel, a[-2:], b[-2:]) if tick else 1) for b in w]) for a in w])
        torch.testing.assert_close(k.inducing_covariance(w[None])[0], expected)


def test_blocks_give_the_same_values_and_gradients(monkeypatch):
    geometry = GEOMETRIES[0]
    k = _kernel(geometry, True)
    x = _images(5, geometry.image)
    w = torch.rand(1, 3, k.inducing_dims, dtype=torch.float64, requires_grad=True)

    def run():
        total = k.cross_covariance(w, x).square().sum() + k.prior_variance(x).sum()
        grads = torch.autograd.grad(total, [w, k.weights, *k.patch_kernel.parameters()])
        return total.detach(), grads

    whole = run()
    monkeypatch.setattr(conv_kernel, "BLOCK_ENTRIES", 40)  # one or two images per block
    blocked = run()
    torch.testing.assert_close(blocked[0], whole[0])
    for a, b in zip(blocked[1], whole[1], strict=True):
        torch.testing.assert_close(a, b)


def test_gradcheck_on_tiny_images():
    """Gradients of K_uf (inducing inputs, weights) and diag K_ff (weights, lengthscale)."""
    geometry = PatchGeometry(ImageShape(4, 4, 1), patch=2, stride=2)
    k = _kernel(geometry, True)
    x = _images(2, geometry.image)
    w = torch.rand(1, 3, k.inducing_dims, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda w_: k.cross_covariance(w_, x), (w,))
    # the module's own parameters as gradcheck's inputs: it perturbs them in place
    raw = k.patch_kernel.base_kernel.raw_lengthscale
    torch.autograd.gradcheck(lambda *_: k.prior_variance(x), (k.weights, raw))
    torch.autograd.gradcheck(lambda *_: k.cross_covariance(w.detach(), x), (k.weights, raw))


def test_a_whole_image_patch_is_plain_solvegp():
    """One patch covering the image, weight 1, no location kernel: f = g, so the model is
    SOLVE-GP with the patch kernel, the same inducing points and the same q."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(40, 9, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=g)
    conv = build("conv-solvegp", 9, task="classification", init=(x, y), num_inducing=5,
                 num_orthogonal=4, patch_size=3, tick=False, lengthscale=0.8,
                 outputscale=1.7)
    with torch.no_grad():
        conv.kernel.weights.fill_(1.0)
        for p in (conv.q_mean_u, conv.q_mean_v):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    plain = build("solvegp", 9, task="classification", init=(x, y), num_inducing=5,
                  num_orthogonal=4, kernel="rbf", ard=False, lengthscale=0.8,
                  outputscale=1.7)
    with torch.no_grad():  # the same points and q for all three latent GPs
        plain.inducing_points.copy_(conv.inducing_points.expand_as(plain.inducing_points))
        plain.orthogonal_points.copy_(conv.orthogonal_points.expand_as(plain.orthogonal_points))
        for name in ("q_mean_u", "q_chol_u", "q_mean_v", "q_chol_v"):
            getattr(plain, name).copy_(getattr(conv, name))
        plain.mean.constant.copy_(conv.mean.constant)
    x_test = torch.rand(7, 9, generator=g, dtype=torch.float64)
    with torch.no_grad():
        a, b = conv.predict(None, x_test), plain.predict(None, x_test)
        torch.testing.assert_close(a.mean, b.mean)
        torch.testing.assert_close(a.variance, b.variance)
        torch.testing.assert_close(conv.kl(conv.condition(x, y)), plain.kl(plain.condition(x, y)))


def test_conv_svgp_is_conv_solvegp_without_orthogonal_patches():
    g = torch.Generator().manual_seed(5)
    x = torch.rand(30, 16, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (30,), generator=g)
    svgp = build("conv-svgp", 16, task="classification", init=(x, y), num_inducing=6,
                 patch_size=2)
    solve = build("conv-solvegp", 16, task="classification", init=(x, y), num_inducing=6,
                  num_orthogonal=0, patch_size=2)
    assert svgp.orthogonal_points.shape[1] == 0 and svgp.method_key == "conv-svgp"
    with torch.no_grad():
        torch.testing.assert_close(svgp.loss(svgp.condition(x, y), torch.Generator()),
                                   solve.loss(solve.condition(x, y), torch.Generator()))


@pytest.mark.parametrize("d, given, expected", [
    (784, None, (28, 28, 1)), (3072, None, (32, 32, 3)), (12, [3, 4], (3, 4, 1)),
    (24, [2, 4, 3], (2, 4, 3))])
def test_image_shapes(d, given, expected):
    s = infer_image_shape(d, given)
    assert (s.height, s.width, s.channels) == expected


@pytest.mark.parametrize("d, given, match", [
    (10, None, "not a square"), (12, [3, 5], "holds 15 numbers"), (12, [12], "H,W")])
def test_bad_image_shapes_are_refused(d, given, match):
    with pytest.raises(ValueError, match=match):
        infer_image_shape(d, given)


def test_a_patch_larger_than_the_image_is_refused():
    with pytest.raises(ValueError, match="exceeds the padded image"):
        PatchGeometry(ImageShape(4, 4), patch=5)
