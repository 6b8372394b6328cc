"""Synthetic data sets of the reproduced papers, plus a demo set and a streamed 3-D field.

Every generator is a pure function of its seeds. Sources and the choices the papers leave open:

- ``binary_classification``: notes/000 §11.1. f ~ GP(0, s·RBF_ℓ) drawn *jointly* at the training
  and test inputs, labels y ~ Bernoulli(sigmoid(f)). 1-D: ℓ = 1, s = 5, x ~ U[-3, 5], 50 points.
  2-D: ℓ = 1, s = 10, x₁ ~ U[-3, 5], x₂ ~ U[-4, 1], 100 points. The paper has no test set; we draw
  test inputs from the same distribution.
- ``poisson_counts``: notes/000 §11.2. 100 training inputs ``linspace(0, 1)``, log-rate
  f ~ GP(0, 5·RBF_0.1), y ~ Poisson(exp f). The paper keeps f fixed and re-draws counts across runs,
  so f is fixed by ``function_seed`` and the counts by ``seed``. The paper names no test set (an
  AMBIGUITY); ours is the ``num_test`` cell midpoints ``(i + 1/2) / num_test`` of [0, 1], with f
  drawn jointly with the training points.
- ``gaussian_mixture``: notes/000 §11.3. Class means ~ U[-1, 1]³; covariance U diag(λ) Uᵀ with U
  the eigenvectors of AAᵀ, A 3×3 with U[0, 1] entries, λ ~ U[0.001, 0.1]. The components are fixed
  by ``mixture_seed``; the samples by ``seed``.
- ``noisy_sine``: notes/002 §7.1. Two periods on [0, 1]: f(x) = sin(4πx), x ~ U[0, 1],
  y = f + ε. The paper writes ε ~ N(0, 0.25); we read 0.25 as the *variance* (N(μ, σ²)
  notation, and ``noise`` is a variance throughout gpscale), i.e. noise std 0.5.
- ``demo_regression``: a 1-D sum of sines with a gap in the training inputs, for ``gpscale demo``.
- ``FieldStream``: a smooth random field on [0, 1]^d (a random-feature draw, see the class) whose
  n points are produced chunk by chunk; chunk j depends only on (seed, j).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import gpytorch
import numpy as np
import torch

from gpscale.kernels import kernel_matrix
from gpscale.typing import Float, Tensor

__all__ = [
    "SyntheticData", "MixtureComponents", "FieldStream", "rbf_prior_sample",
    "binary_classification", "poisson_counts", "mixture_components", "gaussian_mixture",
    "noisy_sine", "demo_regression", "stream_field", "field_dataset", "few_relevant_inputs",
    "additive_parts", "ADDITIVE_PARTS_KERNEL", "projections",
]

_FLOAT = torch.float64
# (amplitude, angular frequency) of the demo function f(x) = Σ a sin(ω x) on [0, 10].
_DEMO_TERMS = ((1.0, 1.0), (0.5, 3.0), (0.25, 7.0))


@dataclass(frozen=True, eq=False)
class SyntheticData:
    """A generated train/test set; ``f_*`` hold the noise-free latent function where there is one.

    Attributes:
        x_train: (n, d) float64.  y_train: (n,) float64 targets or int64 labels.
        x_test: (t, d).  y_test: (t,).
        f_train: (n,) latent values, or ``None``.  f_test: (t,) latent values, or ``None``.
    """

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    f_train: Tensor | None = None
    f_test: Tensor | None = None


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _uniform(n: int, bounds: Sequence[tuple[float, float]], generator: torch.Generator) -> Tensor:
    low = torch.tensor([b[0] for b in bounds], dtype=_FLOAT)
    high = torch.tensor([b[1] for b in bounds], dtype=_FLOAT)
    return low + (high - low) * torch.rand(n, len(bounds), generator=generator, dtype=_FLOAT)


def rbf_prior_sample(x: Float[Tensor, "n d"], *, lengthscale: float, outputscale: float,
                     generator: torch.Generator | None = None, jitter: float = 1e-6,
                     num_samples: int | None = None) -> Float[Tensor, "*s n"]:
    r"""One draw :math:`f \sim \mathcal N(0, s K_\ell(x, x) + \text{jitter}\, s I)` at x's rows.

    The RBF kernel is GPyTorch's, :math:`k(x, x') = \exp(-\|x - x'\|^2 / 2\ell^2)`. The draw is
    L z with L the Cholesky factor; the relative ``jitter`` keeps the factorisation stable for
    the smooth kernels used here and adds a white-noise variance of ``jitter * outputscale``.

    Args:
        x: inputs (n, d), float64.
        lengthscale: ℓ.  outputscale: s.
        generator: source of the standard normal z (n,).
        jitter: relative diagonal jitter.
        num_samples: draw this many independent samples at once.

    Returns:
        f, shape (n,), or (num_samples, n) when ``num_samples`` is given.
    """
    kernel = gpytorch.kernels.RBFKernel().to(_FLOAT)
    kernel.lengthscale = lengthscale
    with torch.no_grad():
        K = outputscale * kernel_matrix(kernel, x, x)  # (n, n)
    K.diagonal().add_(jitter * outputscale)
    L = torch.linalg.cholesky(K)
    if num_samples is None:
        return L @ torch.randn(x.shape[0], generator=generator, dtype=_FLOAT)
    z = torch.randn(x.shape[0], num_samples, generator=generator, dtype=_FLOAT)
    return (L @ z).T  # (num_samples, n)


def binary_classification(num_train: int = 50, num_test: int = 200, *,
                          bounds: Sequence[tuple[float, float]] = ((-3.0, 5.0),),
                          lengthscale: float = 1.0, outputscale: float = 5.0,
                          seed: int = 0) -> SyntheticData:
    """Binary labels from a GP draw (notes/000 §11.1); defaults are the 1-D set.

    Inputs are uniform in the box ``bounds`` (one (low, high) per dimension); f is drawn jointly
    at all ``num_train + num_test`` inputs; labels are int64 in {0, 1}.
    """
    generator = _generator(seed)
    x = _uniform(num_train + num_test, bounds, generator)
    f = rbf_prior_sample(x, lengthscale=lengthscale, outputscale=outputscale, generator=generator)
    y = torch.bernoulli(torch.sigmoid(f), generator=generator).long()
    return SyntheticData(x[:num_train], y[:num_train], x[num_train:], y[num_train:],
                         f[:num_train], f[num_train:])


def poisson_counts(num_train: int = 100, num_test: int = 100, *, lengthscale: float = 0.1,
                   outputscale: float = 5.0, function_seed: int = 0,
                   seed: int = 0) -> SyntheticData:
    """Poisson counts with a GP log-rate on [0, 1] (notes/000 §11.2); y is float64 counts.

    Training inputs are ``linspace(0, 1, num_train)``, test inputs the cell midpoints
    ``(i + 1/2) / num_test``. f is fixed by ``function_seed``, the counts are drawn with ``seed``.
    """
    x_train = torch.linspace(0, 1, num_train, dtype=_FLOAT).unsqueeze(-1)
    x_test = ((torch.arange(num_test, dtype=_FLOAT) + 0.5) / num_test).unsqueeze(-1)
    x = torch.cat([x_train, x_test])
    f = rbf_prior_sample(x, lengthscale=lengthscale, outputscale=outputscale,
                         generator=_generator(function_seed))
    y = torch.poisson(f.exp(), generator=_generator(seed))
    return SyntheticData(x_train, y[:num_train], x_test, y[num_train:],
                         f[:num_train], f[num_train:])


@dataclass(frozen=True, eq=False)
class MixtureComponents:
    """Gaussian mixture components: means (C, d), eigenvectors U (C, d, d), eigenvalues λ (C, d)."""

    means: Tensor
    eigenvectors: Tensor
    eigenvalues: Tensor

    @property
    def covariances(self) -> Tensor:
        """U diag(λ) Uᵀ per class, (C, d, d)."""
        U, lam = self.eigenvectors, self.eigenvalues
        return (U * lam.unsqueeze(-2)) @ U.transpose(-1, -2)


def mixture_components(num_classes: int = 10, num_dims: int = 3, *, mixture_seed: int = 0,
                       eigenvalue_range: tuple[float, float] = (0.001, 0.1)) -> MixtureComponents:
    """The fixed mixture of notes/000 §11.3: means ~ U[-1, 1]^d, covariance U diag(λ) Uᵀ."""
    generator = _generator(mixture_seed)
    means = 2 * torch.rand(num_classes, num_dims, generator=generator, dtype=_FLOAT) - 1
    A = torch.rand(num_classes, num_dims, num_dims, generator=generator, dtype=_FLOAT)
    U = torch.linalg.eigh(A @ A.transpose(-1, -2)).eigenvectors  # (C, d, d)
    low, high = eigenvalue_range
    lam = low + (high - low) * torch.rand(num_classes, num_dims, generator=generator,
                                          dtype=_FLOAT)
    return MixtureComponents(means, U, lam)


def _mixture_sample(comp: MixtureComponents, per_class: int,
                    generator: torch.Generator) -> tuple[Tensor, Tensor]:
    num_classes, num_dims = comp.means.shape
    z = torch.randn(num_classes, per_class, num_dims, generator=generator, dtype=_FLOAT)
    # x = μ + U diag(√λ) z, batched over classes: (C, k, d)
    x = comp.means.unsqueeze(1) + (z * comp.eigenvalues.sqrt().unsqueeze(1)) @ \
        comp.eigenvectors.transpose(-1, -2)
    y = torch.arange(num_classes).repeat_interleave(per_class)
    perm = torch.randperm(num_classes * per_class, generator=generator)
    return x.reshape(-1, num_dims)[perm], y[perm]


def gaussian_mixture(num_train_per_class: int = 10_000, num_test_per_class: int = 1_000, *,
                     num_classes: int = 10, num_dims: int = 3, mixture_seed: int = 0,
                     seed: int = 0) -> SyntheticData:
    """Multi-class data from the fixed mixture (notes/000 §11.3), shuffled, int64 labels.

    Each class has exactly ``num_train_per_class`` training and ``num_test_per_class`` test
    points. ``mixture_seed`` fixes the Gaussians, ``seed`` the samples.
    """
    comp = mixture_components(num_classes, num_dims, mixture_seed=mixture_seed)
    generator = _generator(seed)
    x_train, y_train = _mixture_sample(comp, num_train_per_class, generator)
    x_test, y_test = _mixture_sample(comp, num_test_per_class, generator)
    return SyntheticData(x_train, y_train, x_test, y_test)


def noisy_sine(num_train: int = 1000, num_test: int = 1000, *, noise: float = 0.25,
               seed: int = 0) -> SyntheticData:
    """y = sin(4πx) + ε, x ~ U[0, 1], ε ~ N(0, noise) with ``noise`` a variance (notes/002 §7.1)."""
    generator = _generator(seed)
    x = torch.rand(num_train + num_test, 1, generator=generator, dtype=_FLOAT)
    f = torch.sin(4 * math.pi * x[:, 0])
    y = f + math.sqrt(noise) * torch.randn(f.shape, generator=generator, dtype=_FLOAT)
    return SyntheticData(x[:num_train], y[:num_train], x[num_train:], y[num_train:],
                         f[:num_train], f[num_train:])


def demo_regression(num_train: int = 3000, num_test: int = 1000, *, noise: float = 0.04,
                    gap: tuple[float, float] = (6.0, 7.0), seed: int = 0) -> SyntheticData:
    """1-D demo set: f(x) = sin x + ½ sin 3x + ¼ sin 7x on [0, 10], noise variance ``noise``.

    Training inputs are uniform on [0, 10] minus the interval ``gap`` (so a plot shows the
    predictive band widen there); test inputs are uniform on all of [0, 10].
    """
    lo, hi = gap
    if not 0 <= lo < hi <= 10:
        raise ValueError(f"gap must satisfy 0 <= low < high <= 10; got {gap}")
    generator = _generator(seed)
    u = (10 - (hi - lo)) * torch.rand(num_train, generator=generator, dtype=_FLOAT)
    x_train = torch.where(u >= lo, u + (hi - lo), u).unsqueeze(-1)
    x_test = 10 * torch.rand(num_test, 1, generator=generator, dtype=_FLOAT)
    x = torch.cat([x_train, x_test])
    f = sum(a * torch.sin(w * x[:, 0]) for a, w in _DEMO_TERMS)
    y = f + math.sqrt(noise) * torch.randn(f.shape, generator=generator, dtype=_FLOAT)
    return SyntheticData(x_train, y[:num_train], x_test, y[num_train:],
                         f[:num_train], f[num_train:])


def few_relevant_inputs(num_train: int = 8000, num_test: int = 2000, *, num_dims: int = 32,
                        num_relevant: int = 4, noise: float = 0.01,
                        seed: int = 0) -> SyntheticData:
    r"""Regression on ``num_dims`` inputs of which only the first ``num_relevant`` matter.

    x ~ U[0, 1]^d and :math:`f(x) = \sum_{j < r} \sin(2\pi x_j + j) + \sin(2\pi (x_0 + x_1))`
    (so the relevant inputs also interact), y = f + ε with noise variance ``noise``. A method
    learns this only if its ARD lengthscales of the d − r irrelevant inputs grow: a shared
    lengthscale, or one that never moves, predicts little more than the mean.
    """
    if not 2 <= num_relevant <= num_dims:
        raise ValueError(f"need 2 <= num_relevant <= num_dims; got {num_relevant}, {num_dims}")
    generator = _generator(seed)
    x = torch.rand(num_train + num_test, num_dims, generator=generator, dtype=_FLOAT)
    f = sum(torch.sin(2 * math.pi * x[:, j] + j) for j in range(num_relevant))
    f = f + torch.sin(2 * math.pi * (x[:, 0] + x[:, 1]))
    y = f + math.sqrt(noise) * torch.randn(f.shape, generator=generator, dtype=_FLOAT)
    return SyntheticData(x[:num_train], y[:num_train], x[num_train:], y[num_train:],
                         f[:num_train], f[num_train:])


def additive_parts(num_train: int = 1_000_000, num_test: int = 100_000, *, noise: float = 0.01,
                   seed: int = 0) -> SyntheticData:
    r"""Regression on 12 inputs whose function is a sum of six 1-D and three 2-D parts.

    x ~ U[0, 1]^12, :math:`f(x) = \sum_{j < 6} \sin(2\pi x_j + j)
    + \sum_{k < 3} \sin(2\pi (x_{6+2k} + x_{7+2k})) \cos(\pi x_{7+2k})`, y = f + ε with noise
    variance ``noise``: the additive structure of ``ggp -o kernel='rbf(0) + … + rbf(10, 11)'``,
    where one grid over every input would need m^12 points.
    """
    generator = _generator(seed)
    x = torch.rand(num_train + num_test, 12, generator=generator, dtype=_FLOAT)
    f = sum(torch.sin(2 * math.pi * x[:, j] + j) for j in range(6))
    for k in range(3):
        a, b = x[:, 6 + 2 * k], x[:, 7 + 2 * k]
        f = f + torch.sin(2 * math.pi * (a + b)) * torch.cos(math.pi * b)
    y = f + math.sqrt(noise) * torch.randn(f.shape, generator=generator, dtype=_FLOAT)
    return SyntheticData(x[:num_train], y[:num_train], x[num_train:], y[num_train:],
                         f[:num_train], f[num_train:])


def projections(num_train: int = 2_250, num_test: int = 250, *, num_dims: int = 128,
                noise: float = 0.0025, seed: int = 0) -> SyntheticData:
    r"""Regression on ``num_dims`` standard-normal inputs through ten random projections of the
    first ten: :math:`f(x) = \sum_{k < 10} \sin(w_k^\top x_{0:10}) + 0.3\, x_0 x_1` with
    :math:`w_k \sim \mathcal N(0, I/10)`, y = f + ε with noise variance ``noise``. Few rows for
    many inputs, most irrelevant: the case where how an optimiser copes with ``num_dims`` ARD
    lengthscales decides between the scalable methods.
    """
    if num_dims < 10:
        raise ValueError(f"projections needs num_dims >= 10; got {num_dims}")
    generator = _generator(seed)
    x = torch.randn(num_train + num_test, num_dims, generator=generator, dtype=_FLOAT)
    w = torch.randn(10, 10, generator=generator, dtype=_FLOAT) / math.sqrt(10)
    f = torch.sin(x[:, :10] @ w.T).sum(1) + 0.3 * x[:, 0] * x[:, 1]
    y = f + math.sqrt(noise) * torch.randn(f.shape, generator=generator, dtype=_FLOAT)
    return SyntheticData(x[:num_train], y[:num_train], x[num_train:], y[num_train:],
                         f[:num_train], f[num_train:])


ADDITIVE_PARTS_KERNEL = ("rbf(0) + rbf(1) + rbf(2) + rbf(3) + rbf(4) + rbf(5) + rbf(6, 7) "
                         "+ rbf(8, 9) + rbf(10, 11)")
"""The kernel whose structure :func:`additive_parts` has."""


def _chunk_seed(seed: int, j: int) -> int:
    """A 63-bit seed that depends only on (seed, j), well mixed (NumPy's SeedSequence hash)."""
    state = np.random.SeedSequence((seed, j)).generate_state(1, dtype=np.uint64)[0]
    return int(state) >> 1


@dataclass(frozen=True)
class FieldStream:
    r"""n noisy samples of a smooth field on [0, 1]^d, produced chunk by chunk.

    The field is a fixed random-feature function (fixed by ``field_seed``)
    :math:`f(x) = \sqrt{2/K} \sum_k w_k \cos(\omega_k^\top x + b_k)`, with
    :math:`\omega_k \sim \mathcal N(0, \ell^{-2} I)`, :math:`b_k \sim U[0, 2\pi]`,
    :math:`w_k \sim \mathcal N(0, 1)`: an approximate draw from GP(0, RBF_ℓ), prior variance ≈ 1.
    Chunk j holds points ``j*chunk_size`` to ``min((j+1)*chunk_size, n)``: x ~ U[0, 1]^d and
    y = f(x) + ε, ε ~ N(0, noise), drawn from a generator seeded by (seed, j) only. So iterating
    twice gives identical data, chunks can be made in any order or in parallel, and nothing but
    the current chunk is held. Memory per chunk is O(chunk_size · d + block_size · K).

    Example:
        >>> stream = FieldStream(n=2500, chunk_size=1000)
        >>> [x.shape[0] for x, _ in stream]
        [1000, 1000, 500]
    """

    n: int
    num_dims: int = 3
    chunk_size: int = 1_000_000
    seed: int = 0
    noise: float = 0.01
    lengthscale: float = 0.2
    num_features: int = 32
    field_seed: int = 0
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        for name in ("n", "num_dims", "chunk_size", "num_features"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.seed < 0 or self.field_seed < 0:
            raise ValueError("seed and field_seed must be non-negative integers")
        if self.noise < 0 or self.lengthscale <= 0:
            raise ValueError("noise must be >= 0 and lengthscale > 0")

    @property
    def num_chunks(self) -> int:
        return -(-self.n // self.chunk_size)

    def _field(self) -> tuple[Tensor, Tensor, Tensor]:
        generator = _generator(self.field_seed)
        K, d = self.num_features, self.num_dims
        omega = torch.randn(K, d, generator=generator, dtype=self.dtype) / self.lengthscale
        phase = 2 * math.pi * torch.rand(K, generator=generator, dtype=self.dtype)
        weight = torch.randn(K, generator=generator, dtype=self.dtype) * math.sqrt(2 / K)
        return omega, phase, weight

    def latent(self, x: Float[Tensor, "n d"], *,
               block_size: int = 16_384) -> Float[Tensor, " n"]:
        """The noise-free field f at x (n, d) -> (n,), in row blocks of (block_size, K) features."""
        omega, phase, weight = (t.to(x.device, x.dtype) for t in self._field())
        f = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        for start in range(0, x.shape[0], block_size):
            rows = slice(start, start + block_size)
            f[rows] = torch.cos(torch.addmm(phase, x[rows], omega.T)) @ weight  # (b, K) @ (K,)
        return f

    def chunk(self, j: int) -> tuple[Tensor, Tensor]:
        """Chunk j: x (m, d) and y (m,), with m = chunk_size except possibly for the last chunk."""
        if not 0 <= j < self.num_chunks:
            raise ValueError(f"chunk index must be in 0..{self.num_chunks - 1}; got {j}")
        m = min(self.chunk_size, self.n - j * self.chunk_size)
        generator = _generator(_chunk_seed(self.seed, j))
        x = torch.rand(m, self.num_dims, generator=generator, dtype=self.dtype)
        y = self.latent(x)
        y.add_(torch.randn(m, generator=generator, dtype=self.dtype), alpha=self.noise**0.5)
        return x, y

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return (self.chunk(j) for j in range(self.num_chunks))


def stream_field(n: int, *, num_dims: int = 3, chunk_size: int = 1_000_000, seed: int = 0,
                 noise: float = 0.01, **options) -> FieldStream:
    """A re-iterable stream of n field samples; ``options`` go to :class:`FieldStream`."""
    return FieldStream(n=n, num_dims=num_dims, chunk_size=chunk_size, seed=seed, noise=noise,
                       **options)


def field_dataset(num_train: int = 100_000, num_test: int = 10_000, *, num_dims: int = 3,
                  seed: int = 0, noise: float = 0.01, **options) -> SyntheticData:
    """An in-memory draw of the field: the first ``num_train`` points of the stream with this
    seed for training, the next ``num_test`` for testing (all points are i.i.d.)."""
    stream = stream_field(num_train + num_test, num_dims=num_dims, seed=seed, noise=noise,
                          **options)
    chunks = list(stream)
    x = torch.cat([c[0] for c in chunks])
    y = torch.cat([c[1] for c in chunks])
    f = stream.latent(x)
    return SyntheticData(x[:num_train], y[:num_train], x[num_train:], y[num_train:],
                         f[:num_train], f[num_train:])
