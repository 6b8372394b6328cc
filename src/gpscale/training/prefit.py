"""The hyperparameter pre-fit of the methods that keep their kernel fixed (``iterncgp``,
``sod-laplace``): a short SVGP fit supplies the lengthscale and outputscale the user did not
give (paper 000, §C.4). It is a training step, so it lives here and the harness
(:func:`gpscale.training.harness.build_method`) runs it before building the method.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from gpscale.kernels import kernel_hyperparameters
from gpscale.methods.registry import build, get_spec
from gpscale.training.config import FitConfig
from gpscale.training.fit import fit

__all__ = ["prefit_hyperparameters", "fill_prefit_options"]


def fill_prefit_options(method: str, train: tuple[Tensor, Tensor], *, task: str,
                        num_classes: int | None, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with a missing ``lengthscale`` / ``outputscale`` of a pre-fit method (a
    registry entry with ``prefit=True``) filled in by :func:`prefit_hyperparameters`, using its
    ``prefit_*`` options; other methods' options are returned unchanged."""
    spec = get_spec(method)
    if not spec.prefit:
        return options
    opts = spec.resolve(options)
    if opts["lengthscale"] is not None and opts["outputscale"] is not None:
        return options
    x, y = train
    if task == "classification" and num_classes is None:
        num_classes = max(2, int(y.max()) + 1)
    ls, os_ = prefit_hyperparameters(
        x, y, task=task, num_classes=num_classes, kernel=opts["kernel"], ard=opts["ard"],
        per_latent=not opts["shared_kernel"], num_inducing=opts["prefit_num_inducing"],
        steps=opts["prefit_steps"], lr=opts["prefit_lr"], batch_size=opts["prefit_batch_size"],
        seed=opts["seed"])
    return {**options, "lengthscale": ls if opts["lengthscale"] is None else opts["lengthscale"],
            "outputscale": os_ if opts["outputscale"] is None else opts["outputscale"]}


def prefit_hyperparameters(x: Tensor, y: Tensor, *, task: str, num_classes: int | None,
                           kernel: str, ard: bool, num_inducing: int, steps: int, lr: float,
                           batch_size: int, seed: int, per_latent: bool = False
                           ) -> tuple[Any, Any]:
    """Kernel hyperparameters from a short SVGP fit (paper §C.4: SVGP, batch 1024, Adam).

    ``steps`` Adam steps (rounded up to whole epochs) on minibatches of ``batch_size``.

    Counts are fitted as SVGP regression on log(1 + y) (the SVGP baseline has no Poisson
    likelihood). With C > 2 classes SVGP learns one kernel per class: ``per_latent`` returns
    them all, else the shared values are the geometric mean of the lengthscales and the mean of
    the outputscales.

    Returns:
        (lengthscale, outputscale): floats (lengthscale a list of d with ``ard``); with
        ``per_latent`` and C > 2 lists over the C classes (see :func:`fixed_kernel`).
    """
    svgp_task, targets = (("regression", torch.log1p(y.to(x.dtype))) if task == "counts"
                          else (task, y))
    n = x.shape[0]
    model = build("svgp", x.shape[1], task=svgp_task, num_classes=num_classes, init=(x, targets),
                  num_inducing=min(num_inducing, n), seed=seed, kernel=kernel, ard=ard)
    batches = math.ceil(n / batch_size)
    config = FitConfig(optimizer="adam", lr=lr, epochs=max(1, math.ceil(steps / batches)),
                       batch_size=batch_size if batch_size < n else None, seed=seed,
                       progress=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fit(model, None, (x, targets), config)
    hp = kernel_hyperparameters(model.gp.covar_module)
    if hp is None:
        raise ValueError(f"cannot read the hyperparameters of the pre-fitted {kernel!r} kernel")
    ls = hp.lengthscale.detach().double().reshape(-1, hp.lengthscale.shape[-1])  # (C or 1, d)
    os_ = hp.outputscale.detach().double().reshape(-1)  # (C or 1,)
    if per_latent and ls.shape[0] > 1:
        return (ls.tolist() if ard else ls[:, 0].tolist()), os_.tolist()
    ls = ls.log().mean(0).exp()  # geometric mean over classes, (d,) or (1,)
    return (ls.tolist() if ard else float(ls[0])), float(os_.mean())
