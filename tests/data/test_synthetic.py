"""Synthetic generators: shapes, seeds, the constructions of notes/000 §11 and notes/002 §7.1."""

from __future__ import annotations

import math

import pytest
import torch

from gpscale.benchmarks.memory import peak_memory_mb, peak_rss_mb, reset_peak_rss
from gpscale.data.synthetic import (
    FieldStream,
    binary_classification,
    demo_regression,
    few_relevant_inputs,
    field_dataset,
    gaussian_mixture,
    mixture_components,
    noisy_sine,
    poisson_counts,
    rbf_prior_sample,
    stream_field,
)


def test_binary1d_shapes_range_and_seed():
    a, b, c = binary_classification(seed=0), binary_classification(seed=0), \
        binary_classification(seed=1)
    assert a.x_train.shape == (50, 1) and a.x_test.shape == (200, 1)
    assert a.y_train.dtype == torch.int64 and set(a.y_train.tolist()) <= {0, 1}
    assert float(a.x_train.min()) >= -3 and float(a.x_train.max()) <= 5
    torch.testing.assert_close(a.x_train, b.x_train, rtol=0, atol=0)
    assert torch.equal(a.y_test, b.y_test) and not torch.equal(a.x_train, c.x_train)


def test_binary2d_bounds_per_dimension():
    data = binary_classification(100, 400, bounds=((-3.0, 5.0), (-4.0, 1.0)), outputscale=10.0)
    x = torch.cat([data.x_train, data.x_test])
    assert data.x_train.shape == (100, 2)
    assert float(x[:, 0].min()) >= -3 and float(x[:, 0].max()) <= 5
    assert float(x[:, 1].min()) >= -4 and float(x[:, 1].max()) <= 1


def test_binary_latent_is_one_joint_draw():
    """Train and test f come from one draw: at nearby x they agree (sd of f_i - f_j ≈ √s |dx|)."""
    data = binary_classification(300, 300, seed=2)
    dx = (data.x_train - data.x_test.T).abs()  # (300, 300)
    i, j = torch.nonzero(dx < 0.01, as_tuple=True)
    assert i.numel() > 20
    assert float((data.f_train[i] - data.f_test[j]).abs().max()) < 0.2


def test_binary_labels_follow_sigmoid_of_latent():
    """E[y - sigmoid(f)] = 0; the mean of 2000 deviations has sd <= 0.5 / sqrt(2000) ≈ 0.011."""
    data = binary_classification(2000, 1, seed=5)
    deviation = (data.y_train.double() - torch.sigmoid(data.f_train)).mean()
    assert abs(float(deviation)) < 0.05


def test_rbf_prior_sample_covariance():
    """Empirical covariance of 40,000 draws at x = (0, 1) ≈ s [[1, e^{-1/2}], [e^{-1/2}, 1]]."""
    x = torch.tensor([[0.0], [1.0]])
    g = torch.Generator().manual_seed(0)
    draws = rbf_prior_sample(x, lengthscale=1.0, outputscale=5.0, generator=g,
                             num_samples=40_000)
    single = rbf_prior_sample(x, lengthscale=1.0, outputscale=5.0, generator=g)
    assert draws.shape == (40_000, 2) and single.shape == (2,)
    expected = 5.0 * torch.tensor([[1.0, math.exp(-0.5)], [math.exp(-0.5), 1.0]])
    # sampling sd of each entry is about 5 * sqrt(2 / 40000) ≈ 0.035
    torch.testing.assert_close(draws.T.cov(correction=0), expected, rtol=0, atol=0.15)


def test_poisson_counts_inputs_and_integrality():
    data = poisson_counts()
    x = data.x_train[:, 0]
    assert data.x_train.shape == (100, 1) and data.x_test.shape == (100, 1)
    assert (float(x[0]), float(x[-1])) == (0.0, 1.0)
    torch.testing.assert_close(x.diff(), torch.full((99,), 1 / 99))
    torch.testing.assert_close(data.x_test[:2, 0], torch.tensor([0.005, 0.015]))
    y = torch.cat([data.y_train, data.y_test])
    assert bool((y >= 0).all()) and torch.equal(y, y.round())


def test_poisson_function_seed_fixes_latent_and_counts_match_rate():
    a, b = poisson_counts(seed=0), poisson_counts(seed=1)
    torch.testing.assert_close(a.f_train, b.f_train, rtol=0, atol=0)
    assert not torch.equal(a.y_train, b.y_train)
    assert not torch.equal(a.f_train, poisson_counts(function_seed=1).f_train)
    rate = a.f_train.exp()
    z = (a.y_train - rate).sum() / rate.sum().sqrt()  # approximately N(0, 1)
    assert abs(float(z)) < 5


def test_mixture_components_construction():
    """Means in [-1, 1]^3; λ in [0.001, 0.1]; U orthonormal and diagonalising AAᵀ."""
    comp = mixture_components(10, 3, mixture_seed=7)
    g = torch.Generator().manual_seed(7)
    torch.rand(10, 3, generator=g, dtype=torch.float64)  # the means come first
    A = torch.rand(10, 3, 3, generator=g, dtype=torch.float64)
    U = comp.eigenvectors
    assert bool((comp.means.abs() <= 1).all())
    assert bool(((comp.eigenvalues >= 0.001) & (comp.eigenvalues <= 0.1)).all())
    eye = torch.eye(3).expand(10, 3, 3)
    torch.testing.assert_close(U.transpose(-1, -2) @ U, eye, rtol=0, atol=1e-12)
    rotated = U.transpose(-1, -2) @ A @ A.transpose(-1, -2) @ U
    torch.testing.assert_close(rotated, torch.diag_embed(rotated.diagonal(dim1=-2, dim2=-1)),
                               rtol=0, atol=1e-12)
    eig = torch.linalg.eigvalsh(comp.covariances)
    torch.testing.assert_close(eig, comp.eigenvalues.sort(-1).values, rtol=0, atol=1e-12)


def test_mixture_balance_and_class_moments():
    data = gaussian_mixture(2000, 100, mixture_seed=3, seed=0)
    comp = mixture_components(mixture_seed=3)
    assert data.x_train.shape == (20_000, 3) and data.x_test.shape == (1000, 3)
    assert torch.bincount(data.y_train).tolist() == [2000] * 10
    assert torch.bincount(data.y_test).tolist() == [100] * 10
    for c in range(10):
        xc = data.x_train[data.y_train == c]
        # sd of a mean entry <= sqrt(0.1 / 2000) ≈ 0.007; of a covariance entry ≈ 0.1·√(2/2000)
        torch.testing.assert_close(xc.mean(0), comp.means[c], rtol=0, atol=0.035)
        torch.testing.assert_close(xc.T.cov(), comp.covariances[c], rtol=0, atol=0.02)


def test_mixture_seed_fixes_gaussians_seed_fixes_samples():
    a, b = gaussian_mixture(50, 5, seed=0), gaussian_mixture(50, 5, seed=1)
    assert not torch.equal(a.x_train, b.x_train)
    torch.testing.assert_close(gaussian_mixture(50, 5, seed=0).x_train, a.x_train, rtol=0, atol=0)
    m0, m1 = mixture_components(mixture_seed=0), mixture_components(mixture_seed=1)
    assert not torch.equal(m0.means, m1.means)


def test_noisy_sine_function_and_noise_variance():
    data = noisy_sine(20_000, 10, noise=0.25, seed=1)
    x = data.x_train[:, 0]
    assert bool(((x >= 0) & (x <= 1)).all())
    torch.testing.assert_close(data.f_train, torch.sin(4 * math.pi * x))
    # variance estimate of 20,000 N(0, 0.25) draws has sd 0.25·sqrt(2/20000) = 0.0025
    assert abs(float((data.y_train - data.f_train).var()) - 0.25) < 0.015


def test_demo_regression_gap():
    data = demo_regression(seed=0)
    x, x_test = data.x_train[:, 0], data.x_test[:, 0]
    assert data.x_train.shape == (3000, 1) and data.x_test.shape == (1000, 1)
    assert not bool(((x > 6) & (x < 7)).any())
    assert bool(((x_test > 6) & (x_test < 7)).any())
    assert float(x.min()) >= 0 and float(x.max()) <= 10


def test_stream_chunk_lengths_sum_to_n():
    stream = stream_field(2500, chunk_size=1000, seed=3)
    assert isinstance(stream, FieldStream) and stream.num_chunks == 3
    sizes = [x.shape[0] for x, _ in stream]
    assert sizes == [1000, 1000, 500] and sum(sizes) == stream.n
    assert all(x.shape[1] == 3 for x, _ in stream)


def test_stream_is_deterministic_and_order_independent():
    stream = FieldStream(n=3500, chunk_size=1000, seed=11)
    first = list(stream)
    reverse = [stream.chunk(j) for j in reversed(range(stream.num_chunks))][::-1]
    again = list(FieldStream(n=3500, chunk_size=1000, seed=11))
    for (x1, y1), (x2, y2), (x3, y3) in zip(first, reverse, again, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
        assert torch.equal(x1, x3) and torch.equal(y1, y3)
    other = FieldStream(n=3500, chunk_size=1000, seed=12).chunk(0)[0]
    assert not torch.equal(other, first[0][0])
    assert not torch.equal(first[0][0], first[1][0][:1000])


def test_stream_latent_matches_dense_formula_and_noise():
    """f(x) = sqrt(2/K) Σ w_k cos(ω_kᵀx + b_k): row blocks of 999 vs one matrix product."""
    stream = FieldStream(n=20_000, chunk_size=20_000, noise=0.01, seed=1)
    x, y = stream.chunk(0)
    omega, phase, weight = stream._field()
    dense = torch.cos(x @ omega.T + phase) @ weight
    torch.testing.assert_close(stream.latent(x, block_size=999), dense, rtol=1e-12, atol=1e-12)
    # variance of 20,000 N(0, 0.01) draws: sd 0.01·sqrt(2/20000) = 1e-4
    assert abs(float((y - dense).var()) - 0.01) < 6e-4
    assert bool(((x >= 0) & (x <= 1)).all())


def _iterate_stream(n: int) -> int:
    count = 0
    for x, _ in FieldStream(n=n, chunk_size=100_000, seed=0):
        count += x.shape[0]
    return count


def _stream_peak_growth_mb(n: int) -> tuple[int, float]:
    """In a fresh process: warm up on 2 chunks, then the growth of peak RSS while streaming n."""
    _iterate_stream(200_000)  # imports, allocator pools and thread pools settle here
    reset_peak_rss()
    before = peak_rss_mb()
    count = _iterate_stream(n)
    return count, peak_rss_mb() - before


@pytest.mark.slow
def test_stream_is_memory_light():
    """Streaming 10⁷ points (305 MB as float64 x and y) raises the peak RSS by far less.

    The allocator keeps 10-35 MB of freed chunk pages whatever n is (measured at 4·10⁶ and
    8·10⁶), so n must be large enough that holding the data would stand out from that noise.
    """
    n = 10_000_000
    _, (count, growth_mb) = peak_memory_mb(_stream_peak_growth_mb, n)
    full_mb = n * 4 * 8 / 2**20
    assert count == n
    assert growth_mb < full_mb / 5


def test_stream_bad_chunk_index_and_config():
    with pytest.raises(ValueError, match=r"0\.\.1"):
        FieldStream(n=10, chunk_size=5).chunk(2)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        FieldStream(n=10, chunk_size=0)


def test_field_dataset_is_the_stream_prefix():
    data = field_dataset(800, 200, seed=4, chunk_size=300)
    x, y = (torch.cat(parts) for parts in zip(*FieldStream(n=1000, chunk_size=300, seed=4),
                                              strict=True))
    torch.testing.assert_close(data.x_train, x[:800], rtol=0, atol=0)
    torch.testing.assert_close(data.y_test, y[800:], rtol=0, atol=0)


def test_few_relevant_inputs_depend_on_the_first_inputs_only():
    """f is a function of the first r columns (changing the others leaves it unchanged), the
    noise has the stated variance, and the draw is reproducible from the seed."""
    data = few_relevant_inputs(3000, 500, num_dims=12, num_relevant=3, noise=0.04, seed=5)
    assert data.x_train.shape == (3000, 12) and data.y_test.shape == (500,)
    x = data.x_train
    f = sum(torch.sin(2 * math.pi * x[:, j] + j) for j in range(3))
    f = f + torch.sin(2 * math.pi * (x[:, 0] + x[:, 1]))
    torch.testing.assert_close(data.f_train, f, rtol=0, atol=1e-12)
    noise = data.y_train - data.f_train
    assert abs(noise.var().item() - 0.04) < 0.005
    again = few_relevant_inputs(3000, 500, num_dims=12, num_relevant=3, noise=0.04, seed=5)
    torch.testing.assert_close(again.y_test, data.y_test, rtol=0, atol=0)
    with pytest.raises(ValueError, match="num_relevant"):
        few_relevant_inputs(10, 10, num_dims=3, num_relevant=4)
