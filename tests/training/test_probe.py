"""The probe ``method="auto"`` runs: an exact GP on a subset and the residual of the inducing
points at its hyperparameters (:mod:`gpscale.training.probe`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from gpscale.kernels import kernel_matrix, make_kernel
from gpscale.methods.auto import PROBE_RATIO_MIN
from gpscale.training.probe import inducing_probe, mean_nystrom_residual


def _data(n: int, noise: float, *, kind: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 6, generator=g, dtype=torch.float64)
    f = {"smooth": lambda: torch.sin(2 * x[:, 0]) + x[:, 1],
         "rough": lambda: torch.sin(9 * x[:, :4]).sum(1) * torch.cos(7 * x[:, 4]),
         "three": lambda: torch.sin(6 * x[:, 0]) * torch.exp(x[:, 1]) + 3 * x[:, 2]}[kind]()
    return x, f + noise * torch.randn(n, generator=g, dtype=torch.float64)


@pytest.mark.slow
def test_the_ratio_separates_noisy_targets_from_ones_a_small_exact_gp_predicts():
    """Noisy data: the inducing points miss far less than the noise the exact GP cannot
    predict (ρ ≪ 1, SVGP's side of PROBE_RATIO_MIN). A nearly noise-free function of three
    inputs: the 1,000-point exact GP predicts held-out points closely and the inducing points'
    residual is many times its error (CaGP-Opt's side)."""
    x, y = _data(3000, 0.5, kind="smooth")
    noisy = inducing_probe(x, y)
    clean = inducing_probe(*_data(3000, 0.001, kind="three"))
    assert noisy.ratio < 0.01 and clean.ratio > 3 * PROBE_RATIO_MIN
    # the noise and the held-out error follow the generating noise (standardised target)
    assert noisy.noise == pytest.approx(0.25 / float(y.var()), rel=0.3)
    assert noisy.error == pytest.approx(0.25 / float(y.var()), rel=0.3)
    assert clean.error < 1e-4
    for probe in (noisy, clean):
        assert 0 <= probe.residual <= probe.outputscale
        assert probe.num_inducing == 512 and probe.points == 1000 and probe.seconds > 0
        assert probe.ratio == pytest.approx(probe.residual / probe.error)
        assert probe.gain == pytest.approx(np.sqrt(1 + probe.ratio) - 1)
    no_error = dataclasses.replace(noisy, error=math.nan)
    assert no_error.ratio == pytest.approx(noisy.residual / noisy.noise)


def test_the_ratio_does_not_depend_on_the_target_s_or_the_inputs_units():
    x, y = _data(900, 0.1, kind="rough", seed=1)
    base = inducing_probe(x, y, size=300, num_inducing=64)
    moved = inducing_probe(3.0 * x - 7.0, 250.0 * y + 40.0, size=300, num_inducing=64)
    assert moved.ratio == pytest.approx(base.ratio, rel=1e-4)
    assert moved.noise == pytest.approx(base.noise, rel=1e-4)
    assert moved.error == pytest.approx(base.error, rel=1e-4)


def test_the_residual_is_the_mean_nystrom_residual_of_a_dense_reference():
    """mean(k(x, x) − k_xZ K_ZZ⁻¹ k_Zx) against an explicit float64 inverse, 0 at the inducing
    points themselves, and smaller with more inducing points."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(200, 4, generator=g, dtype=torch.float64)
    k = make_kernel("matern32", 4, ard=True).double()
    k.base_kernel.lengthscale = torch.tensor([0.3, 0.5, 0.7, 1.1], dtype=torch.float64)
    k.outputscale = 2.5
    z = x[:30]
    kxz = kernel_matrix(k, x, z).detach().numpy()
    kzz = kernel_matrix(k, z, z).detach().numpy()
    dense = np.mean(2.5 - np.einsum("ij,jk,ik->i", kxz, np.linalg.inv(kzz), kxz))
    assert mean_nystrom_residual(k, z, x, jitter=0.0) == pytest.approx(dense, rel=1e-7)
    assert mean_nystrom_residual(k, z, z) < 1e-6
    assert mean_nystrom_residual(k, x[:80], x) < mean_nystrom_residual(k, z, x) < 2.5


def test_the_probe_caps_its_inducing_points_at_half_the_rows():
    x, y = _data(120, 0.05, kind="rough", seed=2)
    probe = inducing_probe(x, y, size=120, num_inducing=512)
    assert probe.num_inducing == 60 and probe.points == 120


def test_bad_input_is_a_value_error():
    x = torch.rand(50, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="target that varies"):
        inducing_probe(x, torch.ones(50, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least 4"):
        inducing_probe(x[:3], torch.rand(3, dtype=torch.float64))
