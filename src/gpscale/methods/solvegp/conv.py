r"""``conv-solvegp`` and ``conv-svgp``: SOLVE-GP and SVGP with a convolutional kernel on images.

Shi, Titsias & Mnih (2020), arXiv:1910.10596 §4 (notes/004_solvegp.md §2.12, §2.14–2.15): both
inducing sets of SOLVE-GP may be inter-domain; in its CIFAR-10 experiments both are sets of
image patches of a convolutional (TICK) kernel. The model is
:class:`~gpscale.methods.solvegp.SolveGP` with its three covariances taken from
:class:`~gpscale.methods.solvegp.conv_kernel.ConvKernel`: K_uu
and K_vv among inducing patches, K_uf and K_vf between patches and images, diag K_ff of the
images (Alg. 1 unchanged: C_vv = K_vv − K_vu K_uu⁻¹ K_uv and C_vf likewise). With no orthogonal
patches (``conv-svgp``) it is the convolutional SVGP of van der Wilk et al. (2017).

Multi-class: the C latent functions share the kernel (patch kernel, weights, location kernel)
and both inducing sets, each with its own q(u), q(v⊥) and constant mean, so one K_uf serves all
classes (the paper's CIFAR-10 models; notes §2.12 leaves the choice open). Whitened q for both
sets, as the paper's single-layer convolutional runs (App. F, "consistently improves").

Initialisation (App. G): inducing patches by k-means with M + M2 centres on distinct patches
of up to 1,000 training images (seeded), split at random between the two sets; with TICK their
locations uniform on the grid of patch positions; the patch kernel's lengthscale the root mean
square distance between those patches (a scale that suits pixels in [0, 1] and in [0, 255]
alike), its outputscale ``outputscale`` (the paper's 5), the patch weights 1/P.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import gpytorch
import torch
from torch import Tensor

from gpscale.kernels import KERNELS, make_kernel
from gpscale.likelihoods import Bernoulli, Softmax
from gpscale.methods._common import (
    check_task_and_init,
    default_size,
    follow_init,
    gaussian_likelihood,
    kmeans_points,
    resolve_num_classes,
)
from gpscale.methods.options import GPYTORCH_NOISE_FLOOR, Option
from gpscale.methods.registry import MethodSpec, register
from gpscale.methods.solvegp.conv_kernel import ConvKernel
from gpscale.methods.solvegp.deep import DeepSolveGP, build_hidden_layer, start_rows
from gpscale.methods.solvegp.images import PatchGeometry, infer_image_shape
from gpscale.methods.solvegp.likelihoods import LIKELIHOODS, RobustMax
from gpscale.methods.solvegp.model import SolveGP
from gpscale.methods.solvegp.parts import JITTER_OPTION, SAMPLES_OPTION, check_sizes
from gpscale.methods.solvegp.pipeline import PIPELINE

__all__ = ["ConvSolveGP", "ConvSVGP", "build_conv_model", "build_conv_solvegp",
           "build_conv_svgp", "CONV_OPTIONS", "KMEANS_IMAGES"]

TASKS = ("classification", "regression")
KMEANS_IMAGES = 1_000
"""Inducing patches are initialised from the patches of at most this many training images."""


class ConvSolveGP(SolveGP):
    """SOLVE-GP (SVGP without orthogonal patches) whose inducing variables are patch values.

    Args: as :class:`~gpscale.methods.solvegp.SolveGP`, with ``kernel`` a
    :class:`~gpscale.methods.solvegp.conv_kernel.ConvKernel` and the inducing inputs patches
    (1, M, q), (1, M2, q), shared by the ``num_latents`` latent functions.
    """

    key = "conv-solvegp"

    def inducing_covariance(self, w: Tensor) -> Tensor:
        return self.kernel.inducing_covariance(w)

    def cross_covariance(self, w: Tensor, x: Tensor) -> Tensor:
        return self.kernel.cross_covariance(w, x)

    def prior_variance(self, x: Tensor) -> Tensor:
        return self.kernel.prior_variance(x)[None]

    def predict(self, state: Any, x_test: Tensor, chunk_size: int = 256) -> Any:
        """As SOLVE-GP's, in chunks of 256 images (the kernel works in blocks within them)."""
        return super().predict(state, x_test, chunk_size)


class ConvSVGP(ConvSolveGP):
    """The convolutional SVGP (van der Wilk et al. 2017): no orthogonal patches."""

    key = "conv-svgp"


def initial_patches(x: Tensor, geometry: PatchGeometry, count: int, *, seed: int,
                    max_points: int) -> tuple[Tensor, float]:
    """k-means centres (count, C·patch²) of distinct patches of up to :data:`KMEANS_IMAGES`
    images of ``x``, and the root mean square distance between those patches."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(x.shape[0], generator=g)[:KMEANS_IMAGES].to(x.device)
    patches = geometry.patches(x[rows]).reshape(-1, geometry.patch_dims)
    patches = torch.unique(patches, dim=0)
    if patches.shape[0] < count:
        raise ValueError(f"the training images have {patches.shape[0]} distinct patches, fewer "
                         f"than the {count} inducing patches asked for; lower num_inducing / "
                         "num_orthogonal or use a larger patch_size")
    spread = (2 * patches.double().var(0).sum()).sqrt().clamp_min(1e-3)
    return kmeans_points(patches, count, seed=seed, max_points=max_points), float(spread)


def build_conv_model(cls: type[ConvSolveGP], num_dims: int, *, task: str = "classification",
                       num_classes: int | None = None,
                       init: tuple[Tensor, Tensor] | None = None,
                       num_inducing: int | None = None, num_orthogonal: int | None = None,
                       image_shape: list[int] | None = None, patch_size: int = 5,
                       stride: int = 2, padding: int = 0, tick: bool = True,
                       kernel: str = "rbf", lengthscale: float | None = None,
                       outputscale: float = 5.0, location_lengthscale: float = 3.0,
                       noise: float | None = None, whiten: bool = True, seed: int = 0,
                       kmeans_max_points: int = 10_000, num_data: int | None = None,
                       jitter: float | None = None, num_quadrature: int = 40,
                       num_likelihood_samples: int = 32, optimal_q: bool = True,
                       likelihood: str = "robustmax", epsilon: float = 1e-3, layers: int = 1,
                       hidden_channels: int = 10, hidden_inducing: int | None = None,
                       hidden_orthogonal: int | None = None,
                       num_predict_samples: int = 10) -> ConvSolveGP | DeepSolveGP:
    """Build ``conv-solvegp`` / ``conv-svgp`` (their factories fix ``cls``; see
    :mod:`gpscale.methods.registry`).

    Args:
        cls: the model class, :class:`ConvSolveGP` or :class:`ConvSVGP`.
        num_dims: d = H·W·C, the numbers per (flattened, channel-last) image.
        task, num_classes, init, num_data, jitter, num_quadrature, num_likelihood_samples,
            optimal_q, whiten, seed, kmeans_max_points: as
            :func:`~gpscale.methods.solvegp.build_solvegp`.
        num_inducing: M inducing patches; ``None``: min(384, n/4).
        num_orthogonal: M2 orthogonal inducing patches; ``None``: as M (0: conv SVGP).
        image_shape: [H, W] or [H, W, C]; ``None``: a square grey or colour image.
        patch_size, stride, padding: the patches
            (:class:`~gpscale.methods.solvegp.images.PatchGeometry`).
        tick: a Matérn-3/2 kernel on patch locations multiplies the patch kernel (TICK).
        kernel: the patch kernel (isotropic): one of ``rbf``, ``matern12/32/52``.
        lengthscale: initial patch lengthscale; ``None``: the RMS distance between patches.
        outputscale: initial patch-kernel variance.
        location_lengthscale: initial lengthscale of the location kernel (patch positions).
        noise: regression: initial σ²; ``None``: 0.1 var(y).
        likelihood: classification: ``robustmax`` (the paper's; one latent function per class,
            also for two) or ``softmax`` (Monte Carlo; binary labels: the logistic).
        epsilon: robust-max's probability of a label other than the largest latent's.
        layers: 1, or 2 or 3 for a deep convolutional GP (:func:`build_deep_conv`; the patch
            options then describe its first layer).
        hidden_channels, hidden_inducing, hidden_orthogonal, num_predict_samples: the deep
            model's (:func:`build_deep_conv`).

    Raises:
        ValueError: for an unsupported task, an image shape that does not fit d, patches that
            do not fit the image, or fewer distinct patches than inducing patches.
    """
    key = cls.key
    check_task_and_init(key, task, TASKS, num_dims, init, num_classes)
    if layers != 1:
        return build_deep_conv(
            cls, num_dims, task=task, num_classes=num_classes, init=init, num_data=num_data,
            layers=layers, hidden_channels=hidden_channels, hidden_inducing=hidden_inducing,
            hidden_orthogonal=hidden_orthogonal, num_predict_samples=num_predict_samples,
            image_shape=image_shape, patch_size=patch_size, stride=stride, padding=padding,
            output=dict(num_inducing=num_inducing, num_orthogonal=num_orthogonal, tick=tick,
                        kernel=kernel, lengthscale=lengthscale, outputscale=outputscale,
                        location_lengthscale=location_lengthscale, noise=noise, whiten=whiten,
                        seed=seed, kmeans_max_points=kmeans_max_points, jitter=jitter,
                        num_quadrature=num_quadrature,
                        num_likelihood_samples=num_likelihood_samples, optimal_q=optimal_q,
                        likelihood=likelihood, epsilon=epsilon))
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; valid kernels: {', '.join(KERNELS)}")
    geometry = PatchGeometry(infer_image_shape(num_dims, image_shape), int(patch_size),
                             int(stride), int(padding))
    n_init = None if init is None else init[0].shape[0]
    num_inducing = default_size(num_inducing, n_init, 384, 4, "num_inducing")
    num_orthogonal = num_inducing if num_orthogonal is None else int(num_orthogonal)
    check_sizes(None, num_inducing=num_inducing, num_orthogonal=num_orthogonal,
                num_quadrature=num_quadrature, num_likelihood_samples=num_likelihood_samples,
                jitter=jitter, kmeans_max_points=kmeans_max_points)
    num_classes = resolve_num_classes(task, num_classes, init)
    if num_data is None and init is None:
        raise ValueError(f"{key} needs num_data (the training-set size) when init is None")
    num_data = int(init[0].shape[0] if num_data is None else num_data)
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood {likelihood!r}; valid: {', '.join(LIKELIHOODS)}")
    robust = task == "classification" and likelihood == "robustmax"
    num_latents = num_classes if num_classes is not None and (num_classes > 2 or robust) else 1
    patch_kernel = make_kernel(kernel, geometry.patch_dims, ard=False)
    conv = ConvKernel(patch_kernel, geometry, location_kernel=tick,
                      location_lengthscale=location_lengthscale)
    total = num_inducing + num_orthogonal
    if init is None:
        w = torch.zeros(total, conv.inducing_dims)
        spread = 1.0
    else:
        centres, spread = initial_patches(init[0], geometry, total, seed=seed,
                                          max_points=kmeans_max_points)
        order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
        w = centres[order.to(centres.device)]
        if tick:
            rows, cols = geometry.grid
            g = torch.Generator().manual_seed(seed + 1)
            loc = torch.rand(total, 2, generator=g, dtype=w.dtype) \
                * torch.tensor([rows - 1, cols - 1], dtype=w.dtype)
            w = torch.cat([w, loc.to(w.device)], -1)
    patch_kernel.initialize(outputscale=float(outputscale),
                            **{"base_kernel.lengthscale": float(lengthscale or spread)})
    mean = gpytorch.means.ConstantMean(
        batch_shape=torch.Size([num_latents]) if num_latents > 1 else torch.Size())
    if task == "regression":
        noise = float(0.1 * init[1].double().var()) if noise is None and init is not None \
            else (1.0 if noise is None else float(noise))
        lik = gaussian_likelihood(max(noise, GPYTORCH_NOISE_FLOOR))
        if init is not None:
            mean.initialize(constant=float(init[1].double().mean()))
    else:
        lik = (RobustMax(num_classes, epsilon) if robust else Bernoulli() if num_latents == 1
               else Softmax(num_classes=num_classes))
    options = {"num_inducing": int(num_inducing), "num_orthogonal": int(num_orthogonal),
               "image_shape": geometry.image.as_list(), "patch_size": geometry.patch,
               "stride": geometry.stride, "padding": geometry.padding, "tick": bool(tick),
               "kernel": kernel, "lengthscale": float(lengthscale or spread),
               "outputscale": float(outputscale),
               "location_lengthscale": float(location_lengthscale), "noise": noise,
               "whiten": bool(whiten), "seed": int(seed),
               "kmeans_max_points": int(kmeans_max_points), "num_data": num_data,
               "jitter": jitter, "num_quadrature": int(num_quadrature),
               "num_likelihood_samples": int(num_likelihood_samples),
               "optimal_q": bool(optimal_q), "likelihood": likelihood,
               "epsilon": float(epsilon)}
    model = cls(mean, conv, lik, w[None, :num_inducing].clone(),
                        w[None, num_inducing:].clone(), task=task, num_classes=num_classes,
                        num_dims=num_dims, num_data=num_data, whiten=whiten, jitter=jitter,
                        num_quadrature=num_quadrature,
                        num_likelihood_samples=num_likelihood_samples, seed=seed,
                        num_latents=num_latents, options=options)
    model = follow_init(model, init)
    if init is not None:
        model.reset_variational()
    return model


ARCHITECTURES = {2: ((4, 2),), 3: ((4, 2), (5, 1))}
"""Table 5: (patch, stride) of each layer after the first, the last one the output layer; a
patch larger than the feature map it meets is cut to the map."""


def build_deep_conv(cls: type[ConvSolveGP], num_dims: int, *, task: str,
                    num_classes: int | None, init: tuple[Tensor, Tensor] | None,
                    num_data: int | None, layers: int, hidden_channels: int,
                    hidden_inducing: int | None, hidden_orthogonal: int | None,
                    num_predict_samples: int, image_shape: list[int] | None, patch_size: int,
                    stride: int, padding: int, output: dict[str, Any]) -> DeepSolveGP:
    """A deep convolutional GP (SOLVE-GP §4, Table 5; :mod:`~gpscale.methods.solvegp.deep`).

    The first layer cuts ``patch_size`` patches at ``stride`` with ``padding`` from the images
    and has ``hidden_channels`` output channels; the later layers follow
    :data:`ARCHITECTURES` (Table 5: 4 × 4 at stride 2, then 5 × 5 at stride 1 for three layers,
    with ``hidden_channels`` channels in every hidden layer); the output layer is ``cls``
    (convolutional SOLVE-GP or SVGP, TICK as the one-layer model) with the ``output`` options.
    Hidden layers have ``hidden_inducing`` (+ ``hidden_orthogonal``) inducing patches:
    ``None``, min(128, n/4) and as many orthogonal ones (none for the SVGP).
    """
    if layers not in ARCHITECTURES:
        raise ValueError(f"layers must be 1, 2 or 3 (the paper's architectures); got {layers}")
    if hidden_channels < 1:
        raise ValueError(f"hidden_channels must be at least 1; got {hidden_channels}")
    num_classes = resolve_num_classes(task, num_classes, init)
    num_data, h, y = start_rows(cls.key, init, num_data, output["seed"])
    n_init = None if init is None else init[0].shape[0]
    m_hidden = default_size(hidden_inducing, n_init, 128, 4, "hidden_inducing")
    orthogonal = output["num_orthogonal"] != 0  # None: as num_inducing
    m2_hidden = (hidden_orthogonal if hidden_orthogonal is not None
                 else m_hidden if orthogonal else 0)
    shape = infer_image_shape(num_dims, image_shape)
    geometry = PatchGeometry(shape, int(patch_size), int(stride), int(padding))
    hidden = []
    for depth, (patch, step) in enumerate(ARCHITECTURES[layers]):
        layer, h = build_hidden_layer(
            h, in_dims=shape.size, geometry=geometry, channels=int(hidden_channels),
            num_inducing=m_hidden, num_orthogonal=int(m2_hidden), num_data=num_data,
            kernel=output["kernel"], whiten=output["whiten"], jitter=output["jitter"],
            seed=output["seed"] + depth, kmeans_max_points=output["kmeans_max_points"])
        hidden.append(layer)
        shape = layer.out_shape()
        patch = min(patch, shape.height, shape.width)
        geometry = PatchGeometry(shape, patch, step)
    out = build_conv_model(cls, shape.size, task=task, num_classes=num_classes,
                           init=None if h is None else (h, y), num_data=num_data,
                           image_shape=shape.as_list(), patch_size=geometry.patch,
                           stride=geometry.stride, **output)
    options = {**output, "num_inducing": out.options["num_inducing"],
               "num_orthogonal": out.options["num_orthogonal"],
               "image_shape": hidden[0].geometry.image.as_list(), "patch_size": int(patch_size),
               "stride": int(stride), "padding": int(padding), "num_data": num_data,
               "layers": int(layers), "hidden_channels": int(hidden_channels),
               "hidden_inducing": int(m_hidden), "hidden_orthogonal": int(m2_hidden),
               "num_predict_samples": int(num_predict_samples)}
    model = DeepSolveGP(hidden, out, num_dims=num_dims,
                        num_predict_samples=int(num_predict_samples), seed=output["seed"],
                        options=options)
    model = follow_init(model, init)
    if init is not None:
        model.reset_variational()
    return model


build_conv_solvegp = partial(build_conv_model, ConvSolveGP)
build_conv_solvegp.__doc__ = "Factory of ``conv-solvegp``: :func:`build_conv_model` of ConvSolveGP."
build_conv_svgp = partial(build_conv_model, ConvSVGP, num_orthogonal=0)
build_conv_svgp.__doc__ = "Factory of ``conv-svgp``: :func:`build_conv_model` of ConvSVGP."


def _options(orthogonal_default: int | None, orthogonal_help: str) -> tuple[Option, ...]:
    return (
        Option("num_inducing", "int", None, "inducing patches M; none: min(384, n/4)",
               minimum=1),
        Option("num_orthogonal", "int", orthogonal_default, orthogonal_help, minimum=0),
        Option("image_shape", "ints", None, "H,W or H,W,C of the flattened (channel-last) "
               "images; none: a square grey or colour image"),
        Option("patch_size", "int", 5, "side of the square patches", minimum=1),
        Option("stride", "int", 2, "step between patch positions (the paper's 1 costs four "
               "times as much per step with 5 x 5 patches)", minimum=1),
        Option("padding", "int", 0, "zeros added on every side", minimum=0),
        Option("tick", "bool", True, "translation-insensitive kernel: a Matérn-3/2 kernel on "
               "patch locations multiplies the patch kernel"),
        Option("kernel", "str", "rbf", "patch kernel (isotropic)", choices=KERNELS),
        Option("lengthscale", "float", None, "initial patch lengthscale; none: the RMS "
               "distance between training patches", minimum=0, exclusive=True),
        Option("outputscale", "float", 5.0, "initial patch-kernel variance", minimum=0,
               exclusive=True),
        Option("location_lengthscale", "float", 3.0, "initial location lengthscale, in patch "
               "positions", minimum=0, exclusive=True),
        Option("noise", "float", None, "regression: initial noise variance; none: 0.1 var(y)",
               minimum=GPYTORCH_NOISE_FLOOR,
               minimum_why="the floor of GPyTorch's Gaussian likelihood"),
        Option("whiten", "bool", True, "whitened parametrisation of q(u), q(v)"),
        Option("seed", "int", 0, "seeds k-means, the split of the inducing sets, locations "
               "and the Monte Carlo softmax"),
        Option("kmeans_max_points", "int", 10_000, "k-means runs on at most this many "
               "patches", minimum=1),
        JITTER_OPTION,
        Option("num_quadrature", "int", 40, "Gauss-Hermite points of the robust-max and "
               "binary likelihoods", minimum=1),
        SAMPLES_OPTION,
        Option("optimal_q", "bool", True, "regression: after training, set q and the noise to "
               "the ELBO's optimum"),
        Option("likelihood", "str", "robustmax", "classification: robust-max (one latent "
               "function per class) or softmax", choices=LIKELIHOODS),
        Option("epsilon", "float", 1e-3, "robust-max: probability of a label other than the "
               "largest latent's", minimum=0, exclusive=True),
        Option("layers", "int", 1, "1: a convolutional GP; 2 or 3: a deep convolutional GP "
               "(the paper's Table 5; the patch options describe its first layer)", minimum=1),
        Option("hidden_channels", "int", 10, "deep: output channels of each hidden layer",
               minimum=1),
        Option("hidden_inducing", "int", None, "deep: inducing patches per hidden layer; none: "
               "min(128, n/4) (the paper's 384 cost nine times as much per step)", minimum=1),
        Option("hidden_orthogonal", "int", None, "deep: orthogonal inducing patches per hidden "
               "layer; none: as hidden_inducing (0 without orthogonal output patches)",
               minimum=0),
        Option("num_predict_samples", "int", 10, "deep: samples propagated through the hidden "
               "layers at prediction", minimum=1),
        Option("num_data", "int", None, "number of training points N", minimum=1, hidden=True),
    )


CONV_OPTIONS = _options(None, "orthogonal inducing patches M2; none: as num_inducing")
"""The options of ``conv-solvegp``."""

register(MethodSpec(
    key="conv-solvegp",
    factory=build_conv_solvegp,
    tasks=TASKS,
    summary="SOLVE-GP with a convolutional (TICK) kernel on images: M + M2 inducing patches",
    options=CONV_OPTIONS, inputs="images", **PIPELINE["conv-solvegp"],
))
register(MethodSpec(
    key="conv-svgp",
    factory=build_conv_svgp,
    tasks=TASKS,
    summary="SVGP with a convolutional (TICK) kernel on images: M inducing patches",
    options=_options(0, "orthogonal inducing patches (0: SVGP)"), inputs="images",
    **PIPELINE["conv-svgp"],
))
