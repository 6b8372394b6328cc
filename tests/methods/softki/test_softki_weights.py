"""SoftKI's softmax interpolation weights (gpscale.methods.softki.weights): the old expansion's
numbers near the data, the exact limit far away, and the hand-written backward (issue #46)."""

from __future__ import annotations

import pytest
import torch

from gpscale.methods.softki.weights import SoftmaxInterpolation, _ShiftedDistance


def _expansion(x, z, tau):
    """The weights as computed before: softmax(−√(‖x‖² − 2xᵀz + ‖z‖²)/τ) on centred inputs."""
    shift = z.mean(0, keepdim=True)
    xs, zs = x - shift, z - shift
    sq = xs.square().sum(-1, keepdim=True) - 2 * xs @ zs.mT + zs.square().sum(-1)[None, :]
    return torch.softmax(-sq.clamp_min(torch.finfo(sq.dtype).tiny).sqrt() / tau, -1)


def test_weights_near_the_data_are_the_expansions(generator):
    """Rows within the data (one of them on an inducing point) keep the old numbers."""
    z = torch.randn(12, 4, generator=generator, dtype=torch.float64) * 2
    x = torch.cat([torch.randn(30, 4, generator=generator, dtype=torch.float64) * 2, z[:3]])
    for tau in (1.0, 0.3):
        torch.testing.assert_close(SoftmaxInterpolation(tau)(x, z), _expansion(x, z, tau),
                                   rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_far_rows_reach_the_projection_limit(dtype, generator):
    """‖x‖ → ∞ along x̂: softmax_j(x̂ᵀz_j/τ), finite and the same at every magnitude (the
    expansion gave rounding noise at 10²⁰ and NaN at 10²⁰⁰); other rows are unaffected."""
    z = torch.randn(6, 2, generator=generator, dtype=dtype)
    direction = torch.tensor([0.6, -0.8], dtype=dtype)
    limit = torch.softmax((z - z.mean(0)) @ direction / 0.5, 0)
    magnitudes = (1e8, 1e20, 1e30, 3e38) if dtype == torch.float32 else (1e8, 1e20, 1e200, 1e300)
    near = torch.randn(3, 2, generator=generator, dtype=dtype)
    x = torch.cat([near, torch.stack([m * direction for m in magnitudes])])
    W = SoftmaxInterpolation(0.5)(x, z)
    assert torch.isfinite(W).all()
    torch.testing.assert_close(W[3:], limit.expand(len(magnitudes), 6), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(W[:3], SoftmaxInterpolation(0.5)(near, z), rtol=0, atol=0)


def test_shifted_distance_gradcheck(generator):
    """The hand-written backward, near and far (a row at 10⁴) and on a coincident pair."""
    z = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    x = torch.cat([torch.randn(4, 3, generator=generator, dtype=torch.float64),
                   torch.tensor([[1e4, -2e4, 5e3]], dtype=torch.float64)])
    assert torch.autograd.gradcheck(_ShiftedDistance.apply,
                                    (x.requires_grad_(), z.requires_grad_()))
    value = _ShiftedDistance.apply(x.detach(), z.detach())
    expected = torch.cdist(x.detach(), z.detach()) - (x.detach().square().sum(-1, keepdim=True)
                                                      + 1).sqrt()
    torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_at_coincident_points_are_the_expansions(dtype, generator):
    """A row on an inducing point far from the origin (|x| > 1, so its row unit is > 1): the
    clamped distance has gradient 0 there, as the expansion's clamp gives. Found by the demo:
    a gradient of Ḡ / 1e-19 stopped SoftKI's fit at RMSE 0.35 instead of 0.27."""
    z = (torch.randn(6, 2, generator=generator, dtype=dtype) * 3 + 5).requires_grad_()
    x = torch.cat([torch.randn(5, 2, generator=generator, dtype=dtype) * 3 + 5,
                   z.detach()[:2]]).requires_grad_()
    G = torch.randn(7, 6, generator=generator, dtype=dtype)
    grads = []
    for weights in (SoftmaxInterpolation(0.7), lambda a, b: _expansion(a, b, 0.7)):
        (weights(x, z) * G).sum().backward()
        grads.append((x.grad.clone(), z.grad.clone()))
        x.grad = z.grad = None
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)
    for new, old in zip(*grads, strict=True):
        assert torch.isfinite(new).all()
        torch.testing.assert_close(new, old, **tol)
