r"""Deep GPs of SOLVE-GP (or SVGP) layers, trained by doubly stochastic variational inference.

Shi, Titsias & Mnih (2020) §4 (notes/004_solvegp.md §2.12), after Salimbeni & Deisenroth (2017):
every layer ℓ holds its own inducing sets and q(u^ℓ), q(v⊥^ℓ); the bound (Eq. 11) is the
expected log-likelihood of the last layer minus the sum of every layer's KL terms. Its
expectation is estimated by propagating one sample per data point layer by layer: each hidden
layer's output is drawn from its marginals N(μ(h), σ²(h)) at the previous layer's sample h
(Eqs. 33–34, reparameterised), and the output layer's expectation is taken in closed form or by
quadrature given the last sample. Prediction averages the output layer's predictive over
``num_predict_samples`` such samples (a mixture; seeded, so repeated predictions agree).

A hidden layer has ``C`` output channels (latent GPs sharing one kernel and both inducing sets,
each with its own q) and a fixed linear mean function, so that a layer whose GPs are still at
their prior passes a projection of its input on: Salimbeni & Deisenroth's remedy for the
pathologies of zero-mean deep GPs.

- **Images** (deep convolutional GP, the paper's Table 5): a hidden layer sees the patches of its
  input feature maps (channel-last, flattened); its C GPs give the value of each output channel
  at each patch position, drawn independently per position (as the paper and Dutordoir et al.
  2019). The mean is a convolution whose filters are App. G's random Glorot-uniform filters;
  the next layer's inducing patches are k-means centres of the patches of up to 1,000 training
  images projected through those filters (App. G: no pre-training of shallower models).
- **Vectors** (SOLVE-DGP for tabular data): a hidden layer sees the whole input vector; its mean
  is the identity where widths agree, else the projection on the inputs' leading principal
  directions (Salimbeni & Deisenroth's choice), and its inducing points are k-means centres of
  the projected training inputs.

Each hidden layer starts with q(u), q(v⊥) at the prior's mean and a covariance 10⁻⁵ times the
prior's, so that early training sees the mean functions and the output layer (Salimbeni &
Deisenroth's initialisation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gpytorch
import torch
from torch import Tensor, nn

from gpscale.distributions import Predictive
from gpscale.kernels import make_kernel
from gpscale.methods._common import kmeans_points
from gpscale.methods.base import Method, predict_in_chunks
from gpscale.methods.solvegp.images import ImageShape, PatchGeometry
from gpscale.methods.solvegp.likelihoods import draw
from gpscale.methods.solvegp.model import SolveGP
from gpscale.methods.solvegp.parts import InducingFactors, WhitenedQ, kl_whitened
from gpscale.validation import check_x, check_xy

__all__ = ["DeepSolveGP", "DeepState", "HiddenLayer", "build_hidden_layer", "start_rows",
           "INITIAL_HIDDEN_VARIANCE", "KMEANS_ROWS"]

INITIAL_HIDDEN_VARIANCE = 1e-5
"""A hidden layer's q starts with this times the prior's covariance (module docstring)."""
PREDICT_ROWS = 1 << 14
"""Prediction propagates at most about this many patches (or rows) per chunk and sample."""
KMEANS_ROWS = 1_000
"""Inducing inputs of the layers are initialised from at most this many training rows."""


class HiddenLayer(nn.Module):
    """A hidden layer: ``C`` latent GPs (one :class:`SolveGP` with ``num_latents = C``) on the
    patches of the input feature maps (``geometry``) or on the input vectors (``None``), plus
    the fixed linear mean ``projection`` (q, C).

    Its output is (b, P·C) for b inputs: the C channels at each of the P patch positions,
    channel-last (a vector of C numbers without ``geometry``).
    """

    def __init__(self, gp: SolveGP, geometry: PatchGeometry | None, projection: Tensor):
        super().__init__()
        self.gp = gp
        self.geometry = geometry
        self.register_buffer("projection", projection)

    @property
    def channels(self) -> int:
        """C: output channels (latent GPs)."""
        return self.projection.shape[-1]

    def out_shape(self) -> ImageShape | None:
        """The output's image shape (``None`` for vectors)."""
        if self.geometry is None:
            return None
        rows, cols = self.geometry.grid
        return ImageShape(rows, cols, self.channels)

    def inputs(self, h: Tensor) -> Tensor:
        """(b·P, q): what the layer's GPs see of inputs ``h`` (b, d)."""
        if self.geometry is None:
            return h
        return self.geometry.patches(h).reshape(-1, self.geometry.patch_dims)

    def mean_output(self, h: Tensor) -> Tensor:
        """The mean function's output (b, P·C) alone: the layer at the GPs' zero."""
        return (self.inputs(h) @ self.projection.to(h.dtype)).reshape(h.shape[0], -1)

    def forward(self, h: Tensor, factors: InducingFactors, q: WhitenedQ,
                generator: torch.Generator | None) -> Tensor:
        """One draw of the layer's output (b, P·C) at inputs ``h`` (b, d), each value drawn
        independently from its marginal."""
        flat = self.inputs(h)
        mean, var = self.gp.marginals(q, self.gp.projections(factors, flat))  # (C, b·P)
        f = draw(mean, var, 1, generator)[0]
        return (f.mT + flat @ self.projection.to(f.dtype)).reshape(h.shape[0], -1)


@dataclass(frozen=True)
class DeepState:
    """A batch and every layer's inducing factors and q (hidden layers first)."""

    x: Tensor
    y: Tensor
    factors: tuple[InducingFactors, ...]
    q: tuple[WhitenedQ, ...]


class DeepSolveGP(Method):
    """A deep GP: hidden layers, then an output :class:`SolveGP` (or its convolutional subclass)
    on the last hidden layer's output (module docstring).

    Args:
        hidden: the hidden layers, input first.
        output: the output layer; its task, classes and likelihood are the model's.
        num_dims: input dimension d.
        num_predict_samples: samples propagated through the hidden layers at prediction.
        seed: seeds the prediction's samples.
        options: resolved factory options (stored as ``self.options``).
    """

    minibatch = True
    needs_data_for_prediction = False

    def __init__(self, hidden: list[HiddenLayer], output: SolveGP, *, num_dims: int,
                 num_predict_samples: int = 10, seed: int = 0,
                 options: dict[str, Any] | None = None):
        super().__init__(task=output.task, num_classes=output.num_classes, options=options)
        if num_predict_samples < 1:
            raise ValueError(f"num_predict_samples must be at least 1; got {num_predict_samples}")
        self.hidden = nn.ModuleList(hidden)
        self.output = output
        self.key = output.key
        self.num_dims, self.num_predict_samples, self.seed = num_dims, num_predict_samples, seed

    @property
    def layers(self) -> list[SolveGP]:
        """The GPs of every layer, input first."""
        return [layer.gp for layer in self.hidden] + [self.output]

    @property
    def num_data(self) -> int:
        return self.output.num_data

    def propagate(self, x: Tensor, factors: tuple[InducingFactors, ...],
                  q: tuple[WhitenedQ, ...], generator: torch.Generator | None) -> Tensor:
        """One sample of the last hidden layer's output at inputs ``x`` (b, d)."""
        h = x
        for layer, f, qq in zip(self.hidden, factors, q, strict=False):
            h = layer(h, f, qq, generator)
        return h

    # -- Method contract --------------------------------------------------------------------------
    def condition(self, x: Tensor, y: Tensor) -> DeepState:
        """The validated batch with every layer's factors and q."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y, task=self.task, num_classes=self.num_classes)
        labels = self.task == "classification" and self.output.num_latents > 1
        y = y.long() if labels else y.to(x.dtype)
        factors = tuple(gp.factors() for gp in self.layers)
        q = tuple(gp.variational(f) for gp, f in zip(self.layers, factors, strict=True))
        return DeepState(x, y, factors, q)

    def expected_log_lik(self, state: DeepState,
                         generator: torch.Generator | None = None) -> Tensor:
        """Batch mean of one doubly stochastic estimate of E[log p(y_n | f_n)]: the hidden
        layers sampled once per point, the output layer's expectation exact given them."""
        h = self.propagate(state.x, state.factors, state.q, generator)
        out = self.output
        mean, var = out.marginals(state.q[-1], out.projections(state.factors[-1], h))
        return out._ell(mean, var, state.y, generator).mean()

    def kl(self, state: DeepState) -> Tensor:
        """Σ over layers of (KL_u + KL_v), divided by N (float64)."""
        total = sum((kl_whitened(q.mean_u, q.chol_u) + kl_whitened(q.mean_v, q.chol_v)).sum()
                    for q in state.q)
        return total / self.num_data

    def loss(self, state: DeepState, generator: torch.Generator | None = None) -> Tensor:
        """kl − expected_log_lik: −Eq. (11) / N, unbiased on minibatches."""
        return self.kl(state).to(state.x.dtype) - self.expected_log_lik(state, generator)

    def predict(self, state: DeepState | None, x_test: Tensor,
                chunk_size: int | None = None) -> Predictive:
        """The mixture over ``num_predict_samples`` propagated samples of the output layer's
        predictive: class probabilities and latent moments averaged, the latent variance with
        the spread of the samples' means (law of total variance)."""
        check_x(x_test, num_dims=self.num_dims, name="x_test")
        if state is None:
            factors = tuple(gp.factors() for gp in self.layers)
            q = tuple(gp.variational(f) for gp, f in zip(self.layers, factors, strict=True))
        else:
            factors, q = state.factors, state.q
        S = self.num_predict_samples
        out = self.output
        eps = torch.randn((out.num_likelihood_samples, out.num_latents, 1),
                          generator=torch.Generator().manual_seed(self.seed),
                          dtype=x_test.dtype).to(x_test.device)
        generator = torch.Generator(device=x_test.device).manual_seed(self.seed)
        if chunk_size is None:  # the hidden layers of an image hold P·(M + M2) numbers each
            per_row = max((layer.geometry.num_patches if layer.geometry is not None else 1)
                          for layer in self.hidden) if len(self.hidden) else 1
            chunk_size = max(1, PREDICT_ROWS // (S * per_row))

        def chunk(xc: Tensor) -> Predictive:
            t = xc.shape[0]
            h = self.propagate(xc.repeat(S, 1), factors, q, generator)  # sample-major rows
            mean, var = out.marginals(q[-1], out.projections(factors[-1], h))
            return mixture(out._predictive(mean, var, eps), S, t)

        return predict_in_chunks(chunk, x_test, chunk_size)

    def reset_variational(self) -> None:
        """Every layer's q at its prior; the hidden layers' covariances shrunk to
        :data:`INITIAL_HIDDEN_VARIANCE` times the prior's (module docstring)."""
        for gp in self.layers:
            gp.reset_variational()
        scale = math.sqrt(INITIAL_HIDDEN_VARIANCE)
        with torch.no_grad():
            for layer in self.hidden:
                for p in (layer.gp.q_chol_u, layer.gp.q_chol_v):
                    if p is not None:
                        p.mul_(scale)

    @property
    def noise(self) -> Tensor:
        """σ² of the output layer's Gaussian likelihood (regression)."""
        return self.output.noise


def mixture(pred: Predictive, samples: int, rows: int) -> Predictive:
    """The equal-weight mixture of ``samples`` predictives stacked sample-major in ``pred``
    (samples·rows rows) as one predictive of ``rows`` rows."""
    def split(t: Tensor) -> Tensor:
        return t.reshape(samples, rows, *t.shape[1:])

    means, variances = split(pred.mean), split(pred.variance)
    mean = means.mean(0)
    variance = (variances + means.square()).mean(0) - mean.square()
    probs = None if pred.probs is None else split(pred.probs).mean(0)
    noise = pred.noise
    if noise is not None and noise.dim() > 0:
        noise = split(noise).mean(0)
    return Predictive(mean, variance.clamp_min(0.0), noise=noise, probs=probs)


def start_rows(key: str, init: tuple[Tensor, Tensor] | None, num_data: int | None,
               seed: int) -> tuple[int, Tensor | None, Tensor | None]:
    """N, and up to :data:`KMEANS_ROWS` seeded rows ``(x, y)`` of ``init`` that the layers'
    inducing inputs start from (``None, None`` without ``init``).

    Raises:
        ValueError: neither ``init`` nor ``num_data``.
    """
    if init is None:
        if num_data is None:
            raise ValueError(f"{key} needs num_data (the training-set size) when init is None")
        return int(num_data), None, None
    x, y = init
    rows = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    rows = rows[:KMEANS_ROWS].to(x.device)
    return int(x.shape[0] if num_data is None else num_data), x[rows], y[rows]


def build_hidden_layer(h: Tensor | None, *, in_dims: int, geometry: PatchGeometry | None,
                       channels: int, num_inducing: int, num_orthogonal: int, num_data: int,
                       kernel: str, whiten: bool, jitter: float | None, seed: int,
                       kmeans_max_points: int) -> tuple[HiddenLayer, Tensor | None]:
    """A hidden layer, and its mean function's output at ``h`` (the next layer's start).

    Args:
        h: inputs of up to :data:`KMEANS_ROWS` training rows as this layer sees them (the
            previous layers' mean functions applied), or ``None`` for placeholders that
            ``load_state_dict`` overwrites.
        in_dims: numbers per input row. geometry: patches, or ``None`` for vectors.
        channels: C. num_inducing, num_orthogonal: M, M2. num_data: N. kernel: the
            (isotropic on patches, ARD on vectors) kernel's name. whiten, jitter: as SOLVE-GP.
        seed: seeds the filters and k-means.
    """
    q = in_dims if geometry is None else geometry.patch_dims
    g = torch.Generator().manual_seed(seed)
    like = torch.zeros(()) if h is None else h
    if h is None:
        projection = torch.zeros(q, channels)
        points = torch.zeros(num_inducing + num_orthogonal, q)
        lengthscale, outputscale = 1.0, 1.0
    else:
        flat = h if geometry is None else geometry.patches(h).reshape(-1, q)
        if geometry is not None:  # App. G: Glorot-uniform random filters
            bound = math.sqrt(6.0 / (q + channels))
            projection = (torch.rand(q, channels, generator=g, dtype=torch.float64) * 2 - 1) \
                * bound
        elif channels == q:
            projection = torch.eye(q, dtype=torch.float64)
        else:  # the leading principal directions of the inputs
            centred = flat.double() - flat.double().mean(0)
            projection = torch.linalg.svd(centred, full_matrices=False)[2][:channels].mT
        projection = projection.to(flat)
        unique = torch.unique(flat, dim=0)
        total = num_inducing + num_orthogonal
        if unique.shape[0] < total:
            raise ValueError(f"a hidden layer's inputs have {unique.shape[0]} distinct rows, "
                             f"fewer than its {total} inducing inputs; lower hidden_inducing")
        points = kmeans_points(unique, total, seed=seed, max_points=kmeans_max_points)
        points = points[torch.randperm(total, generator=g).to(points.device)]
        # patches: the RMS distance between them (isotropic); vectors: √q per input (ARD)
        lengthscale = (float((2 * unique.double().var(0).sum()).sqrt().clamp_min(1e-3))
                       if geometry is not None else math.sqrt(q))
        outputscale = float((flat @ projection).double().var(0).mean().clamp_min(1e-6))
    patch_kernel = make_kernel(kernel, q, ard=geometry is None)
    patch_kernel.initialize(outputscale=outputscale)
    patch_kernel.base_kernel.lengthscale = lengthscale
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([channels]))
    z, o = points[None, :num_inducing].clone(), points[None, num_inducing:].clone()
    gp = SolveGP(mean, patch_kernel, None, z, o, task="regression", num_classes=None,
                 num_dims=q, num_data=num_data, whiten=whiten, jitter=jitter,
                 num_latents=channels)
    layer = HiddenLayer(gp, geometry, projection).to(device=like.device, dtype=like.dtype)
    return layer, (None if h is None else layer.mean_output(h))
