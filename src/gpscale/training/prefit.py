"""Hyperparameter pre-fits, run by the harness (:func:`gpscale.training.harness.build_method`)
before it builds a method: training steps, so they live here.

- The methods that keep their kernel fixed (``iterncgp``, ``sod-laplace``; a registry entry with
  ``prefit=True``): a short SVGP fit supplies the lengthscale and outputscale the user did not
  give (paper 000, §C.4).
- A regression method whose ``prefit`` option (:data:`~gpscale.methods.options.PREFIT_OPTIONS`,
  ``cagp-opt``; opt-in) is ``'exact'``: an exact GP fitted to ``prefit_size`` random training
  points (the ``exact`` key's L-BFGS defaults, at most :data:`EXACT_PREFIT_SECONDS`) supplies
  the lengthscales, outputscale and noise not given. CaGP-Opt's epoch is O(n²), so at
  n ≳ 30,000 its 300 s budget holds ~60–90 epochs: from √d lengthscales that ends far from
  converged (Kin40k test NLL 0.065, SVGP −0.143), from the subset's values (and lr 0.1) it
  reaches −0.52. Not the default: on Bike the subset's maximum likelihood is degenerate (noise
  at its 1e-4 floor, lengthscales ~10⁶, outputscale ~2,000) and CaGP-Opt from there predicts
  with test NLL +8.4 (BENCHMARKS "defaults").
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from gpscale.errors import NumericalError
from gpscale.kernels import kernel_hyperparameters
from gpscale.methods.registry import build, get_spec
from gpscale.training.config import METHOD_DEFAULTS, FitConfig
from gpscale.training.fit import fit

__all__ = ["prefit_hyperparameters", "fill_prefit_options", "exact_prefit",
           "EXACT_PREFIT_SECONDS"]

log = logging.getLogger("gpscale.training")

EXACT_PREFIT_SECONDS = 60.0
"""Most seconds of the exact-GP pre-fit's L-BFGS (n = 2,000, d = 8: ~40 s here)."""

_PRIOR_KEYS = ("lengthscale", "outputscale", "noise")


def fill_prefit_options(method: str, train: tuple[Tensor, Tensor], *, task: str,
                        num_classes: int | None, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the missing prior options filled in by a pre-fit: ``lengthscale``,
    ``outputscale`` and ``noise`` by :func:`exact_prefit` for a regression method whose
    ``prefit`` option is ``'exact'`` (a failed pre-fit warns and leaves them to the defaults);
    ``lengthscale`` and ``outputscale`` by :func:`prefit_hyperparameters` for a fixed-kernel
    method (a registry entry with ``prefit=True``), using its ``prefit_*`` options. Other
    methods' options are returned unchanged."""
    spec = get_spec(method)
    opts = spec.resolve(options)
    if opts.get("prefit") == "exact" and task == "regression":
        missing = [k for k in _PRIOR_KEYS if opts[k] is None]
        if not missing:
            return options
        try:
            found = exact_prefit(*train, kernel=opts["kernel"], ard=opts["ard"],
                                 size=opts["prefit_size"], seed=opts.get("seed", 0))
        except (NumericalError, RuntimeError) as err:  # a start value only: recover
            warnings.warn(f"{method}: the exact-GP pre-fit of the hyperparameters failed "
                          f"({err}); training starts from the default values (√d, var(y), "
                          f"0.1 var(y)); -o prefit=off skips the pre-fit", stacklevel=2)
            return options
        return {**options, **{k: found[k] for k in missing}}
    if not spec.prefit:
        return options
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


def exact_prefit(x: Tensor, y: Tensor, *, kernel: str, ard: bool, size: int, seed: int,
                 max_time: float = EXACT_PREFIT_SECONDS) -> dict[str, Any]:
    """Lengthscale(s), outputscale and noise of an exact GP (float64, the ``exact`` key's L-BFGS
    defaults within ``max_time`` seconds) fitted to ``size`` training points drawn at random
    (all of them when n ≤ ``size``). Returns ``{"lengthscale", "outputscale", "noise"}``, the
    lengthscale a list of d floats with ``ard``."""
    n = x.shape[0]
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(n, generator=generator)[:size] if n > size else torch.arange(n)
    xs, ys = x[rows.to(x.device)].double().cpu(), y[rows.to(y.device)].double().cpu()
    tic = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build("exact", x.shape[1], init=(xs, ys), kernel=kernel, ard=ard)
        config = replace(METHOD_DEFAULTS["exact"], max_time=max_time, progress=False, seed=seed)
        history = fit(model, None, (xs, ys), config)
    hp = kernel_hyperparameters(model.kernel)
    if hp is None:
        raise ValueError(f"cannot read the hyperparameters of the pre-fitted {kernel!r} kernel")
    ls = hp.lengthscale.detach().reshape(-1).tolist()
    found = {"lengthscale": ls if ard else ls[0], "outputscale": float(hp.outputscale.detach()),
             "noise": float(model.likelihood.noise.detach())}
    if not all(math.isfinite(v) for v in (*ls, found["outputscale"], found["noise"])):
        raise NumericalError(f"non-finite pre-fitted hyperparameters {found}")
    log.info("pre-fit: exact GP on %d of %d points, %.1f s (%s): outputscale %.3g, noise %.3g, "
             "lengthscales %s", xs.shape[0], n, time.perf_counter() - tic, history.stopped,
             found["outputscale"], found["noise"],
             ", ".join(f"{v:.3g}" for v in ls))
    return found
