"""Fused stationary-profile products: every profile against its dense formula, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from gpscale.linalg import fused
from gpscale.linalg.chunked import chunked_product
from gpscale.linalg.fused import PROFILES, stationary_rule
from gpscale.linalg.reach import FAR_SQDIST

DENSE = {
    "rbf": lambda r: torch.exp(-0.5 * r.square()),
    "matern12": lambda r: torch.exp(-r),
    "matern32": lambda r: (1 + math.sqrt(3) * r) * torch.exp(-math.sqrt(3) * r),
    "matern52": lambda r: (1 + math.sqrt(5) * r + 5 / 3 * r.square())
    * torch.exp(-math.sqrt(5) * r),
}


def _inputs(generator, B=2, n1=7, n2=6, d=2, k=2):
    return (torch.randn(B, n1, d, generator=generator), torch.randn(B, n2, d, generator=generator),
            torch.randn(B, n2, k, generator=generator))


def _fused(profile, z1, z2, rhs, chunk_size=3):
    return chunked_product(stationary_rule(profile, compiled=False), z1, z2, rhs,
                           chunk_size=chunk_size)


@pytest.mark.parametrize("profile", list(PROFILES))
def test_profile_values(profile, generator):
    """Φ V with Φ = φ(cdist(z1, z2)) for each profile, batched."""
    z1, z2, rhs = _inputs(generator)
    expected = DENSE[profile](torch.cdist(z1, z2)) @ rhs
    torch.testing.assert_close(_fused(profile, z1, z2, rhs), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("profile", list(PROFILES))
def test_profile_gradcheck(profile, generator):
    """gradcheck of the hand-written backward in z1, z2 and V (float64, n ≤ 10)."""
    inputs = tuple(t.requires_grad_() for t in _inputs(generator))
    assert torch.autograd.gradcheck(lambda a, b, v: _fused(profile, a, b, v), inputs)


def test_several_column_tiles(monkeypatch, generator):
    """Tiles narrower than n2 (TILE_ENTRIES = 6 → 2 columns per 3-row chunk) change nothing."""
    monkeypatch.setattr(fused, "TILE_ENTRIES", 6)
    inputs = tuple(t.requires_grad_() for t in _inputs(generator))
    out = _fused("matern32", *inputs)
    expected = DENSE["matern32"](torch.cdist(*inputs[:2])) @ inputs[2]
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b, v: _fused("matern32", a, b, v), inputs)


def test_matern12_gradient_at_coincident_points_is_finite(generator):
    """Coincident points: the non-differentiable |r| gets gradient 0, like torch.cdist's."""
    z = torch.randn(1, 5, 2, generator=generator)
    rhs = torch.randn(1, 5, 2, generator=generator)
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    grads = torch.autograd.grad(_fused("matern12", z1, z2, rhs).sum(), [z1, z2])
    r1, r2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    expected = torch.autograd.grad((torch.exp(-torch.cdist(r1, r2)) @ rhs).sum(), [r1, r2])
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_rhs_only_gradient(generator):
    """With only V requiring grad, V̄ = Φᵀ Ȳ (the shortcut without profile derivatives)."""
    z1, z2, rhs = _inputs(generator)
    rhs.requires_grad_()
    weights = torch.randn(2, 7, 2, generator=generator)
    (grad,) = torch.autograd.grad((_fused("matern52", z1, z2, rhs) * weights).sum(), [rhs])
    torch.testing.assert_close(grad, DENSE["matern52"](torch.cdist(z1, z2)).mT @ weights,
                               rtol=1e-12, atol=1e-12)


def test_tile_sizes_cpu_and_gpu_rule():
    """CPU tensors keep the cache-sized tiles; a GPU takes TILE_ENTRIES_GPU unless its free
    memory is short (a sixteenth of it at most, never below the CPU's tile)."""
    x32, x64 = torch.zeros(1, dtype=torch.float32), torch.zeros(1, dtype=torch.float64)
    assert fused.tile_entries(x32) == fused.tile_entries(x64) == fused.TILE_ENTRIES
    assert fused.span_rows(x32) == math.isqrt(fused.TILE_ENTRIES) == 1024
    assert fused.default_rows(x32) == fused.DEFAULT_ROWS
    gib = 2**30
    assert fused.gpu_tile_entries(80 * gib, 4) == fused.TILE_ENTRIES_GPU == 2**26
    assert fused.gpu_tile_entries(2 * gib, 4) == 2 * gib // 64  # 2^25: capped by free memory
    assert fused.gpu_tile_entries(2 * gib, 8) == 2**24
    assert fused.gpu_tile_entries(0, 4) == fused.TILE_ENTRIES


@pytest.mark.parametrize("profile", list(PROFILES))
def test_profiles_reach_zero_at_infinite_distance(profile):
    """D² = ∞ (an overflowed ‖z1‖²) gives φ = 0 and φ' = 0, not Matérn's ∞ · 0 = NaN (issue #46);
    from FAR_SQDIST on every profile is exactly 0 already."""
    value, vjp = PROFILES[profile]
    inf = torch.tensor([[[math.inf]]], dtype=torch.float64)
    for sq1 in (inf, torch.full_like(inf, FAR_SQDIST)):
        P = torch.zeros(1, 1, 1, dtype=torch.float64)
        value(P, sq1, torch.zeros_like(P))
        assert float(P) == 0.0
        P, G = torch.zeros_like(P), torch.ones_like(P)
        vjp(P, sq1, torch.zeros_like(P), G)
        assert float(P) == 0.0 and float(G) == 0.0
    z1 = torch.tensor([[[1e200, 0.0], [0.1, 0.2]]], dtype=torch.float64)
    z2 = torch.tensor([[[0.0, 0.3], [0.5, -0.1]]], dtype=torch.float64)
    out = _fused(profile, z1, z2, torch.ones(1, 2, 1, dtype=torch.float64))
    assert float(out[0, 0, 0]) == 0.0 and torch.isfinite(out).all()
