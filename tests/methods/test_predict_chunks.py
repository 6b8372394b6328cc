"""Prediction in chunks: the joined predictive equals one pass, and its memory does not grow
with the number of test points (gpscale.methods.base.predict_in_chunks)."""

from __future__ import annotations

import pytest
import torch

from gpscale.benchmarks.memory import peak_memory_mb
from gpscale.distributions import Predictive
from gpscale.methods import build
from gpscale.methods.base import predict_in_chunks


def _fake(xc):
    s = xc.sum(1)
    return Predictive(s, s.square(), noise=torch.tensor(0.1),
                      probs=torch.stack([s.sigmoid(), 1 - s.sigmoid()], 1))


def test_chunks_join_to_one_pass():
    x = torch.randn(1001, 3, dtype=torch.float64)
    whole = _fake(x)
    for size in (1, 7, 1000, 1001, 5000):
        got = predict_in_chunks(_fake, x, size)
        for name in ("mean", "variance", "probs"):
            torch.testing.assert_close(getattr(got, name), getattr(whole, name), rtol=1e-14,
                                       atol=1e-15)
        assert got.noise.dim() == 0 and float(got.noise) == 0.1


def _svgp_predict_peak(num_points: int) -> float:
    torch.manual_seed(0)
    x = torch.rand(4000, 8)
    model = build("svgp", 8, init=(x, torch.sin(4 * x).sum(1)), num_inducing=256).eval()
    x_test = torch.rand(num_points, 8)
    from gpscale.benchmarks.memory import current_rss_mb, peak_rss_mb, reset_peak_rss

    reset_peak_rss()
    before = current_rss_mb()
    with torch.no_grad():
        pred = model.predict(None, x_test)
    assert pred.mean.shape == (num_points,)
    return peak_rss_mb() - before


@pytest.mark.long
def test_svgp_prediction_memory_does_not_grow_with_the_test_points():
    """Before the outputs were preallocated, glibc's heap grew by ~3 kB per test point (SVGP
    at 10⁶ points: 2.5 GB); now 4× the points cost little more than their outputs (8 B each)."""
    small = peak_memory_mb(_svgp_predict_peak, 50_000)[1]
    large = peak_memory_mb(_svgp_predict_peak, 200_000)[1]
    assert large < small + 60, (small, large)
