"""Hyperparameter pre-fits, run by the harness (:func:`gpscale.training.harness.build_method`)
before it builds a method: training steps, so they live here. Which pre-fit a method wants, and
its family's part in it, is declared on its registry entry
(:class:`~gpscale.methods.registry.Prefit`, ``MethodSpec.prefit``):

- ``"kernel"``: the method keeps its kernel fixed (IterNCGP, SoD-Laplace): a short fit of the
  declared variational model supplies the lengthscale and outputscale the user did not give
  (paper 000, §C.4), with the settings the family resolves from its ``prefit_*`` options.
- ``"subset"``: a regression method whose ``prefit`` option
  (:data:`~gpscale.methods.options.PREFIT_OPTIONS`: CaGP-Opt, CaGP-CG) is ``'exact'``, or
  ``'auto'`` (the default) with more than :data:`AUTO_PREFIT_MIN_POINTS` training points: the
  declared exact GP fitted to ``prefit_size`` random training points (its key's L-BFGS
  defaults, at most :data:`EXACT_PREFIT_EPOCHS`), its noise then chosen on held-out training
  points (:func:`validated_noise`), supplies the lengthscales, outputscale and noise not given.
  CaGP's epoch is O(n²), so at a few ten thousand points its default budget holds only tens of
  epochs: from √d lengthscales that ends far from converged (behind SVGP), from the subset's
  values (at lr ≤ ``prefit_max_lr``, :func:`prefit_lr_cap`) well ahead of it. A start the
  training dtype cannot resolve (noise below :data:`RESOLVABLE_ULPS` rounding units of the
  outputscale: Bike's subset in float32), or whose Gram matrix the training dtype cannot factor
  (:func:`start_resolvable`, KEGGu), or one the family's check refuses (CaGP-CG: its CG actions
  cannot solve there, Kin40k), is not used; like a failed pre-fit it warns and training starts
  from the defaults (BENCHMARKS "defaults").
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
from gpscale.kernels import is_expression, kernel_hyperparameters
from gpscale.methods.base import Method
from gpscale.methods.options import (
    AUTO_PREFIT_MIN_POINTS,
    GPYTORCH_NOISE_FLOOR,
    PREFIT_AUTO,
    PREFIT_EXACT,
)
from gpscale.methods.registry import build, get_spec
from gpscale.training.config import FitConfig, default_fit_config
from gpscale.training.fit import fit

__all__ = ["prefit_hyperparameters", "fill_prefit_options", "fill_start_options", "exact_prefit",
           "prefit_lr_cap",
           "validated_noise", "exact_prefit_wanted", "start_resolvable", "EXACT_PREFIT_EPOCHS",
           "EXACT_PREFIT_SECONDS", "RESOLVABLE_ULPS", "VALIDATION_POINTS",
           "VALIDATION_MIN_GAIN", "AUTO_PREFIT_MIN_POINTS"]

log = logging.getLogger("gpscale.training")
announce = logging.getLogger("gpscale.fit.prefit")
"""The pre-fits' start and result lines: under ``gpscale.fit``, which ``gpscale fit`` shows
without ``--verbose`` (a pre-fit takes 10–90 s before the progress bar starts)."""

EXACT_PREFIT_EPOCHS = 30
"""Most epochs (of 5 L-BFGS iterations) of the exact-GP pre-fit: its stopping rule besides
convergence, so that the result does not depend on the machine's speed or load (a time limit
stops the same pre-fit at different points under different loads). Uncapped on the default
subset the pre-fit converges well within this cap (evidence: docs/notes)."""

EXACT_PREFIT_SECONDS = 300.0
"""A safety limit on the pre-fit's seconds; convergence or the epoch cap
:data:`EXACT_PREFIT_EPOCHS` ends it first (evidence: docs/notes)."""

VALIDATION_POINTS = 1000
"""Most training points outside the pre-fit's subset on which :func:`validated_noise` picks the
noise (half the subset's size at most)."""

VALIDATION_MIN_GAIN = 0.01
"""Held-out NLL per point (nats) by which another noise must beat the fitted one to replace it."""

RESOLVABLE_ULPS = 10.0
"""A pre-fitted noise must be at least this many rounding units (machine epsilon of the training
dtype) of the pre-fitted outputscale: below that the kernel entries, rounded in the training
dtype, carry errors as large as the noise, and the start is not used (a nearly noise-free
target in float32: CaGP-Opt from such a start ends far worse than from the defaults)."""

_PRIOR_KEYS = ("lengthscale", "outputscale", "noise")


def fill_prefit_options(method: str, train: tuple[Tensor, Tensor], *, task: str,
                        num_classes: int | None, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the missing prior options filled in by the pre-fit the method declares
    (``MethodSpec.prefit``): ``"subset"``: ``lengthscale``, ``outputscale`` and ``noise`` by
    :func:`exact_prefit` for regression where its ``prefit`` option asks for it (a failed
    pre-fit warns and leaves them to the defaults); ``"kernel"``: ``lengthscale`` and
    ``outputscale`` by :func:`prefit_hyperparameters` with the settings the family resolves
    from its options, or, where the family says the method learns its kernel from a start that
    needs none (``learned_start``), :func:`median_distance_start` and outputscale 1. Other
    methods' options are returned unchanged."""
    spec = get_spec(method)
    opts = spec.resolve(options)
    policy = spec.prefit
    if policy is None:
        return options
    if policy.kind == "subset":
        if task != "regression" or not exact_prefit_wanted(opts, train[0].shape[0]):
            return options
        missing = [k for k in _PRIOR_KEYS if opts[k] is None]
        if not missing:
            return options
        try:
            found = exact_prefit(*train, method=policy.model, kernel=opts["kernel"],
                                 ard=opts["ard"], size=opts["prefit_size"],
                                 seed=opts.get("seed", 0))
            _check_resolvable(found, train[0].dtype)
            if policy.check is not None:
                policy.check(found, opts, train[0].shape[0])
        except (NumericalError, RuntimeError) as err:  # a start value only: recover
            warnings.warn(f"{method}: the exact-GP pre-fit of the hyperparameters failed "
                          f"({err}); training starts from the default values (√d, var(y), "
                          f"0.1 var(y)) at the default learning rate; -o prefit=off skips the "
                          f"pre-fit", stacklevel=2)
            return options
        return {**options, **{k: found[k] for k in missing}}
    if opts["lengthscale"] is not None and opts["outputscale"] is not None:
        return options
    x, y = train
    if task == "classification" and num_classes is None:
        num_classes = max(2, int(y.max()) + 1)
    if policy.learned_start is not None and policy.learned_start(opts, task):
        ls, os_ = median_distance_start(x), 1.0  # only a start: the rounds learn θ
        return {**options,
                "lengthscale": ls if opts["lengthscale"] is None else opts["lengthscale"],
                "outputscale": os_ if opts["outputscale"] is None else opts["outputscale"]}
    ls, os_ = prefit_hyperparameters(x, y, task=task, num_classes=num_classes,
                                     method=policy.model, **policy.arguments(opts, x))
    return {**options, "lengthscale": ls if opts["lengthscale"] is None else opts["lengthscale"],
            "outputscale": os_ if opts["outputscale"] is None else opts["outputscale"]}


def fill_start_options(method: str, options: dict[str, Any], found: dict[str, Any],
                       dtype: torch.dtype) -> dict[str, Any]:
    """``options`` with the prior options left out taken from ``found``, an :func:`exact_prefit`
    run once for several methods (``auto``'s race starts every candidate from one): each of
    ``lengthscale``, ``outputscale`` and ``noise`` that ``method`` declares with a default
    estimated from the data (``None``) and the user did not give.

    The three belong together: long lengthscales with a large outputscale describe much the
    same function as short ones with a small outputscale, each fitted against that noise, and
    the lengthscales alone (outputscale 1, noise 0.1 var(y)) are a worse start than the
    defaults. So a method whose noise is fixed (SoftKI's interpolation noise) takes no start.
    The noise is raised to the least the training ``dtype`` resolves at that outputscale
    (:data:`RESOLVABLE_ULPS` rounding units): a start that training moves on from. A kernel
    expression or object takes no start (its options name no lengthscale)."""
    kernel = options.get("kernel")
    estimated = {o.name for o in get_spec(method).options if o.default is None}
    if "noise" not in estimated or (kernel is not None and (
            not isinstance(kernel, str) or is_expression(kernel))):
        return dict(options)
    keys = ("lengthscale", "outputscale", "noise")
    filled = {**options, **{key: found[key] for key in keys
                            if key in estimated and options.get(key) is None}}
    if options.get("noise") is None:
        floor = RESOLVABLE_ULPS * torch.finfo(dtype).eps * float(filled["outputscale"])
        filled["noise"] = max(float(found["noise"]), floor)
    return filled


def median_distance_start(x: Tensor, size: int = 1000, seed: int = 0) -> float:
    """The median distance between ``size`` random training points: the starting lengthscale
    of a kernel that learning will move (a ``"kernel"`` pre-fit's ``learned_start``: IterNCGP's
    classification with ``learn_kernel``, whose rounds reach the same θ from it as from the SVGP
    pre-fit, without the pre-fit's time)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(x.shape[0], generator=g)[:size]
    sub = x[idx].double()
    D = torch.cdist(sub, sub)
    positive = D[D > 0]
    return float(positive.median()) if positive.numel() else 1.0


def exact_prefit_wanted(opts: dict[str, Any], num_train: int) -> bool:
    """Whether resolved options ``opts`` ask for :func:`exact_prefit` with ``num_train`` points:
    ``prefit='exact'``, or ``'auto'`` above :data:`AUTO_PREFIT_MIN_POINTS`."""
    prefit = opts.get("prefit")
    return prefit == PREFIT_EXACT or (prefit == PREFIT_AUTO and num_train > AUTO_PREFIT_MIN_POINTS)


def prefit_lr_cap(method: str, given: dict[str, Any], filled: dict[str, Any],
                  num_train: int) -> float | None:
    """The learning rate training on ``num_train`` rows may start at, at most, after
    :func:`fill_prefit_options` (or :func:`fill_start_options`) turned options ``given`` into
    ``filled``: the method's ``prefit_max_lr`` when start values were supplied where its own
    rule pre-fits those rows (:func:`exact_prefit_wanted`: a close start that CaGP-Opt's
    default lr 1.0 throws away in its first steps), else ``None``. Below
    :data:`AUTO_PREFIT_MIN_POINTS` a start shared by ``auto``'s race is trained at the full
    rate: there CaGP-Opt's epochs are cheap, and at the capped rate it fell behind its own
    defaults."""
    opts = get_spec(method).resolve(filled)
    if (opts.get("prefit") not in (PREFIT_AUTO, PREFIT_EXACT) or filled == given
            or not exact_prefit_wanted(opts, num_train)):
        return None
    return float(opts["prefit_max_lr"])


def _check_resolvable(found: dict[str, Any], dtype: torch.dtype) -> None:
    """NumericalError when the pre-fitted noise is below :data:`RESOLVABLE_ULPS` rounding units
    of the outputscale in ``dtype`` (the precision the method trains in)."""
    floor = RESOLVABLE_ULPS * torch.finfo(dtype).eps * found["outputscale"]
    if found["noise"] < floor:
        raise NumericalError(
            f"the pre-fitted noise {found['noise']:.3g} is below {RESOLVABLE_ULPS:g} rounding "
            f"units of the outputscale {found['outputscale']:.3g} in {str(dtype)[6:]} "
            f"({floor:.3g}): the kernel is not resolved at that noise (--dtype float64 "
            "resolves it)")


def start_resolvable(method: str, model: Method, x: Tensor, y: Tensor) -> bool:
    """Whether ``model``, built at pre-fitted values, computes its training quantities in the
    training dtype (:meth:`~gpscale.methods.base.Method.resolves`, CaGP's SᵀK̂S; the default
    passes); if not, warns that training starts from the defaults. A start with a large
    outputscale can pass :func:`_check_resolvable` while its float32 Gram errs by more than the
    noise: trained from there CaGP-Opt needs large jitter and ends worse than from the
    defaults."""
    if model.resolves(x, y):
        return True
    warnings.warn(f"{method}: at the pre-fitted hyperparameters the {x.dtype} kernel products "
                  "do not resolve the noise (its Gram matrix is not positive definite); "
                  "training starts from the default values at the default learning rate "
                  "instead (float64 training, "
                  "--dtype float64, would keep them at 2-4x the cost per epoch)", stacklevel=3)
    return False


def prefit_hyperparameters(x: Tensor, y: Tensor, *, task: str, num_classes: int | None,
                           method: str, kernel: str, ard: bool, num_inducing: int, steps: int,
                           lr: float, batch_size: int, seed: int, per_latent: bool = False
                           ) -> tuple[Any, Any]:
    """Kernel hyperparameters from a short fit of the SVGP of key ``method`` (paper §C.4:
    SVGP, batch 1024, Adam).

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
    model = build(method, x.shape[1], task=svgp_task, num_classes=num_classes,
                  init=(x, targets), num_inducing=min(num_inducing, n), seed=seed, kernel=kernel,
                  ard=ard)
    batches = math.ceil(n / batch_size)
    config = FitConfig(optimizer="adam", lr=lr, epochs=max(1, math.ceil(steps / batches)),
                       batch_size=batch_size if batch_size < n else None, seed=seed,
                       progress=False)
    tic = time.perf_counter()
    announce.info("pre-fit: an SVGP with %d inducing points, %d epochs of Adam, chooses the "
                  "kernel (-o lengthscale=... -o outputscale=... skip it)",
                  min(num_inducing, n), config.epochs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fit(model, None, (x, targets), config)
    hp = kernel_hyperparameters(model.gp.covar_module)
    if hp is None:
        raise ValueError(f"cannot read the hyperparameters of the pre-fitted {kernel!r} kernel")
    ls = hp.lengthscale.detach().double().reshape(-1, hp.lengthscale.shape[-1])  # (C or 1, d)
    os_ = hp.outputscale.detach().double().reshape(-1)  # (C or 1,)
    announce.info("pre-fit: done in %.0f s: outputscale%s, lengthscale%s",
                  time.perf_counter() - tic, _spread(os_.tolist()),
                  _spread(ls.reshape(-1).tolist()))
    if per_latent and ls.shape[0] > 1:
        return (ls.tolist() if ard else ls[:, 0].tolist()), os_.tolist()
    ls = ls.log().mean(0).exp()  # geometric mean over classes, (d,) or (1,)
    return (ls.tolist() if ard else float(ls[0])), float(os_.mean())


def exact_prefit(x: Tensor, y: Tensor, *, method: str, kernel: str, ard: bool, size: int,
                 seed: int, max_epochs: int = EXACT_PREFIT_EPOCHS,
                 max_time: float = EXACT_PREFIT_SECONDS, quiet: bool = False,
                 stop_on_noise: bool = False) -> dict[str, Any]:
    """Lengthscale(s), outputscale and noise of the exact GP of key ``method`` (float64, that
    key's L-BFGS defaults for at most ``max_epochs`` epochs and ``max_time`` seconds) fitted to
    ``size``
    training points drawn at random (all of them when n ≤ ``size``); with more points than
    that, the noise is then chosen on up to :data:`VALIDATION_POINTS` other training points
    (:func:`validated_noise`). Returns ``{"lengthscale", "outputscale", "noise"}``, the
    lengthscale a list of d floats with ``ard``, the noise at least GPyTorch's floor; with
    held-out points also ``"heldout_mse"``, the fitted GP's mean squared error on them. Its
    start and result are logged on ``gpscale.fit.prefit`` (at debug level with ``quiet``, for
    a caller that says its own).
    ``stop_on_noise`` ends the fit once its loss gains less than its noise
    (:attr:`FitConfig.noise_plateau`): sooner, at a start worse for CaGP-Opt, so only for a
    caller that needs the scale of the noise rather than a start (``auto``'s probe)."""
    say = announce.debug if quiet else announce.info
    n = x.shape[0]
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator) if n > size else torch.arange(n)
    rows, held = order[:size], order[size:size + min(size // 2, VALIDATION_POINTS)]
    xs, ys = x[rows.to(x.device)].double().cpu(), y[rows.to(y.device)].double().cpu()
    tic = time.perf_counter()
    say("pre-fit: an exact GP on %d of %d training points chooses the start "
        "hyperparameters (float64 L-BFGS, at most %d epochs; -o prefit=off skips it)",
        xs.shape[0], n, max_epochs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(method, x.shape[1], init=(xs, ys), kernel=kernel, ard=ard)
        config = replace(default_fit_config(method), epochs=max_epochs, max_time=max_time,
                         progress=False, seed=seed, noise_plateau=stop_on_noise)
        history = fit(model, None, (xs, ys), config)
    hp = kernel_hyperparameters(model.kernel)
    if hp is None:
        raise ValueError(f"cannot read the hyperparameters of the pre-fitted {kernel!r} kernel")
    ls = hp.lengthscale.detach().reshape(-1).tolist()
    # at the floor the likelihood's value may be a rounding below it (float32 9.9999997e-05),
    # which the noise option refuses
    found = {"lengthscale": ls if ard else ls[0], "outputscale": float(hp.outputscale.detach()),
             "noise": max(float(model.likelihood.noise.detach()), GPYTORCH_NOISE_FLOOR)}
    if not all(math.isfinite(v) for v in (*ls, found["outputscale"], found["noise"])):
        raise NumericalError(f"non-finite pre-fitted hyperparameters {found}")
    fitted = found["noise"]
    if held.numel():
        xh, yh = x[held.to(x.device)].double().cpu(), y[held.to(y.device)].double().cpu()
        found["noise"] = max(validated_noise(model, (xs, ys), (xh, yh)), GPYTORCH_NOISE_FLOOR)
        with torch.no_grad():  # the model is left at the chosen noise
            mean = model.predict(model.condition(xs, ys), xh).mean
        found["heldout_mse"] = float(((yh - mean) ** 2).mean())
    stopped = {"epochs": "at its epoch cap", "time": "at its time limit"}.get(
        history.stopped, history.stopped)
    say("pre-fit: done in %.0f s after %d epochs (%s): outputscale %.3g, noise %.3g%s, "
        "lengthscale%s", time.perf_counter() - tic, history.epochs, stopped,
        found["outputscale"], found["noise"],
        "" if found["noise"] == fitted else f" (held-out choice; fitted {fitted:.3g})",
        _spread(ls))
    return found


def _spread(values: list[float]) -> str:
    """``' 1.2'`` for one value, ``'s 0.17–9.9 (median 0.58)'`` for several."""
    if len(values) == 1:
        return f" {values[0]:.3g}"
    ordered = sorted(values)
    return f"s {ordered[0]:.3g}–{ordered[-1]:.3g} (median {ordered[len(values) // 2]:.3g})"


def validated_noise(model: Any, train: tuple[Tensor, Tensor], held: tuple[Tensor, Tensor]
                    ) -> float:
    """The noise variance, among the fitted one times 10^(k/4) for k = −4, …, 12 (at least the
    likelihood's floor 10⁻⁴), whose predictions of ``held`` from ``model`` conditioned on
    ``train`` have the smallest negative log likelihood; the kernel stays as fitted, and the
    model is left at the chosen noise.

    The subset's marginal likelihood can end at the noise floor on data that is not noise-free
    (many inputs, few of them relevant, on a subset of a few thousand points), and CaGP-Opt's
    ELBO, whose trace term is divided by the noise, then shrinks the outputscale into
    overconfidence. On data that is nearly noise-free the held-out points keep the floor. The
    fitted noise stays unless another improves the held-out NLL by more than
    :data:`VALIDATION_MIN_GAIN` per point: a slightly larger noise that wins on the held-out
    points by a hair can still give CaGP-Opt a worse start than the fitted one."""
    fitted = float(model.likelihood.noise.detach())
    floor = float(model.likelihood.noise_covar.raw_noise_constraint.lower_bound)  # GPyTorch's: 1e-4
    nlls = {}
    model.eval()
    with torch.no_grad():
        for k in range(-4, 13):
            noise = fitted * 10.0 ** (k / 4)
            if noise < floor and k:
                continue
            model.likelihood.noise = noise
            pred = model.predict(model.condition(*train), held[0])
            var = pred.observed_variance
            nlls[noise] = float((torch.log(2 * math.pi * var)
                                 + (held[1] - pred.mean) ** 2 / var).mean())
    best = min(nlls, key=nlls.get)
    if nlls[best] > nlls[fitted] - VALIDATION_MIN_GAIN:
        best = fitted  # a flat held-out curve: keep the fitted noise
    model.likelihood.noise = best
    return best
