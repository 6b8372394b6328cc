"""SoftKI's noise calibration against dense float64 references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpscale.estimators import GPRegressor
from gpscale.methods import build
from gpscale.methods.softki.noise import (
    NOISE_FLOOR,
    calibrate_noise,
    negative_log_likelihood,
    noise_statistics,
)


def _dense_nll(G, r, beta2):
    n = r.shape[0]
    cov = G @ G.mT + beta2 * torch.eye(n, dtype=torch.float64)
    dist = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=torch.float64), cov)
    return -dist.log_prob(r) / n


@pytest.mark.parametrize("rank", [8, 3])  # full column rank, and a rank-deficient G
def test_nll_from_statistics_equals_the_dense_likelihood(rank, generator):
    n, m = 40, 8
    G = torch.randn(n, rank, generator=generator) @ torch.randn(rank, m, generator=generator)
    r = torch.randn(n, generator=generator)
    A, b, rr, nn_ = noise_statistics(lambda rows: G[rows[:, 0].long()], torch.arange(n)[:, None]
                                     .double(), r, chunk_size=7)
    torch.testing.assert_close(A, G.mT @ G)
    for beta2 in (1e-3, 0.1, 2.0):
        ours = negative_log_likelihood(torch.tensor(beta2), A, b, rr, nn_)
        torch.testing.assert_close(ours, _dense_nll(G, r, beta2), rtol=1e-9, atol=1e-9)


def test_calibration_finds_the_dense_minimiser(generator):
    n, m = 60, 6
    G = torch.randn(n, m, generator=generator)
    r = G @ torch.randn(m, generator=generator) + 0.3 * torch.randn(n, generator=generator)
    stats = (G.mT @ G, G.mT @ r, r.square().sum(), torch.tensor(float(n)))
    best = calibrate_noise(*stats)
    grid = torch.logspace(-4, 1, 2001, dtype=torch.float64)
    dense = torch.stack([_dense_nll(G, r, float(b)) for b in grid])
    assert best == pytest.approx(float(grid[dense.argmin()]), rel=1e-2)
    eps = 1e-4  # a stationary point in log β²
    up, down = (float(negative_log_likelihood(torch.tensor(best * math.exp(s)), *stats))
                for s in (eps, -eps))
    assert abs(up - down) / (2 * eps) < 1e-6
    exact = G @ torch.randn(m, generator=generator)  # interpolated exactly: β² at its floor
    floor = calibrate_noise(G.mT @ G, G.mT @ exact, exact.square().sum(), torch.tensor(float(n)))
    assert floor == pytest.approx(NOISE_FLOOR, rel=1e-6)


def test_statistics_are_sums_over_shards(generator):
    """What a data-parallel run all-reduces: two halves add up to the whole."""
    n, m = 30, 5
    G = torch.randn(n, m, generator=generator)
    r = torch.randn(n, generator=generator)
    idx = torch.arange(n)[:, None].double()
    whole = noise_statistics(lambda rows: G[rows[:, 0].long()], idx, r, 4)
    halves = [noise_statistics(lambda rows: G[rows[:, 0].long()], idx[s], r[s], 4)
              for s in (slice(0, 13), slice(13, n))]
    for total, a, b in zip(whole, *halves, strict=True):
        torch.testing.assert_close(total, a + b)


def test_finalize_sets_the_noise_unless_switched_off(generator):
    x = torch.rand(400, 1, generator=generator) * 6
    y = torch.sin(x[:, 0]) + 0.2 * torch.randn(400, generator=generator)
    model = build("softki", 1, init=(x, y), num_inducing=20)
    assert model.options["calibrate_noise"] is True
    before = float(model.noise)
    out = model.finalize(x, y)
    assert out == {"noise_trained": before, "noise_calibrated": pytest.approx(float(model.noise))}
    assert float(model.noise) != before
    off = build("softki", 1, init=(x, y), num_inducing=20, calibrate_noise=False)
    assert off.finalize(x, y) is None and float(off.noise) == pytest.approx(1e-3)
    # a learned β² (biased by the minibatch objective) is calibrated too, to the same maximiser
    learned = build("softki", 1, init=(x, y), num_inducing=20, learn_noise=True)
    with torch.no_grad():
        learned.log_noise.fill_(math.log(0.5))
    assert learned.finalize(x, y)["noise_trained"] == pytest.approx(0.5)
    assert float(learned.noise.detach()) == pytest.approx(float(model.noise), rel=1e-6)


def test_calibrated_softki_predicts_the_noise_level():
    """A noisy 2-D function (noise sd 0.3 on a unit-scale signal): the calibrated β² is near the
    noise variance (in standardised units) and the test NLL beats the paper's fixed β²."""
    rng = np.random.default_rng(0)
    X = rng.random((3000, 2))
    f = np.sin(4 * X[:, 0]) + np.cos(3 * X[:, 1])
    y = f + 0.3 * rng.standard_normal(3000)
    Xt, yt = X[2500:], y[2500:]
    nll = {}
    for calibrate in (True, False):
        reg = GPRegressor(method="softki", epochs=15, num_inducing=64,
                          calibrate_noise=calibrate).fit(X[:2500], y[:2500])
        mean, std = reg.predict(Xt, return_std=True)
        nll[calibrate] = float(np.mean(0.5 * np.log(2 * np.pi * std**2)
                                       + 0.5 * ((yt - mean) / std) ** 2))
        if calibrate:
            noise_var = float(reg.model_.noise) * float(np.var(y[:2500]))
            assert 0.5 * 0.09 < noise_var < 2.0 * 0.09
            assert reg.history_.rows[-1]["noise_calibrated"] == pytest.approx(
                float(reg.model_.noise))
    assert nll[True] < 0.5 and nll[True] < nll[False] - 1.0
