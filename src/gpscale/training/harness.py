"""The one path from training data to a trained model: build → fit → finalise → condition.

Every caller goes through these two functions — ``gpscale fit`` and the benchmark suites
(:mod:`gpscale.run`, in one process or as the ranks of a data-parallel run,
:mod:`gpscale.run_parallel`, which shards the data between the two) and the scikit-learn
estimators:

1. :func:`build_method` builds the method from the registry under a forked, seeded RNG (so the
   initialisation is reproducible and the caller's RNG untouched), in the training dtype, and
   times it; first it runs the pre-fit the method declares (``MethodSpec.prefit``: the SVGP
   pre-fit of a fixed kernel's hyperparameters not given, IterNCGP; the exact-GP pre-fit on a
   subset, CaGP-Opt and CaGP-CG; :mod:`gpscale.training.prefit`).
2. :func:`train_built` trains it with ``training.fit`` (at most the model's ``max_start_lr``
   from a pre-fitted start; or conditions a method with nothing to train, or learns its kernel
   where it ``learns_kernel``), then runs the method's closed-form
   ``finalize(x, y, reduce, held)`` step (SoftKI calibrates its noise there; SVGP, SOLVE-GP
   and SGPR set q and σ² to their bound's optimum; the default does nothing), and returns the
   state to predict with. A method that asks for held-out rows (``holdout_rows``, SoftKI)
   trains on the others, with the best epoch on the held-out rows kept
   (:mod:`gpscale.training.validation`); ``finalize`` gets both and the state conditions on all
   rows. A method that declares ``heldout_noise`` (GGP, SKI, SGPR, CaGP-CG)
   trains on all but a few rows and sets σ² by them after training
   (:mod:`gpscale.training.calibration`).

Each hook is a documented method of :class:`~gpscale.methods.base.Method` with a default that
changes nothing; nothing here names a method key or probes a model for an attribute.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

import torch
from torch import Tensor

from gpscale.devices import check_dense_fits, inducing_options, on_cpu_after_oom
from gpscale.errors import NonFiniteLossError, NumericalError
from gpscale.methods.base import Method
from gpscale.methods.registry import build
from gpscale.training.calibration import calibrate_noise, heldout_rows
from gpscale.training.config import FitConfig
from gpscale.training.fit import condition_only, fit
from gpscale.training.history import History
from gpscale.training.laplace import learn_kernel
from gpscale.training.parallel import DataParallel
from gpscale.training.prefit import (
    fill_prefit_options,
    fill_start_options,
    prefit_lr_cap,
    start_resolvable,
)
from gpscale.training.schedules import LOSS_SD
from gpscale.training.validation import Validation, split_holdout, validation_patience

__all__ = ["Trained", "build_method", "cast", "train_built", "train_method", "load_warm",
           "start_warm", "restart_time", "after_build", "RESTART_MIN_SHARE", "MIN_FINAL_SECONDS"]

log = logging.getLogger("gpscale.training")

NOISE_FLOOR = 1.1e-4
"""The lowest σ² the held-out calibration tries (the Gaussian likelihood's bound is 1e-4)."""


@dataclass
class Trained:
    """A trained model, its history, the state to predict with and the build time."""

    model: Method
    history: History
    state: Any
    setup_time: float


def cast(train: tuple[Tensor, Tensor], config: FitConfig, task: str) -> tuple[Tensor, Tensor]:
    """Inputs, and the targets of regression and counts, in the training dtype (class labels
    stay as they are)."""
    x, y = train
    return x.to(config.torch_dtype), (y if task == "classification" else y.to(config.torch_dtype))


def build_method(method: str, train: tuple[Tensor, Tensor], *, task: str,
                 num_classes: int | None, options: dict[str, Any], config: FitConfig,
                 seed: int | None, device: torch.device | None = None,
                 start: dict[str, Any] | None = None) -> tuple[Method, float]:
    """Build ``method`` on ``train`` (in ``config.dtype``); returns (model, seconds).

    ``start``: hyperparameters pre-fitted elsewhere (an
    :func:`~gpscale.training.prefit.exact_prefit` result; ``auto``'s race fits one for every
    candidate) that take the place of the method's own pre-fit
    (:func:`~gpscale.training.prefit.fill_start_options`); the start is then treated as the
    method's own: trained at its ``prefit_max_lr``, dropped where it does not resolve.

    ``seed`` seeds torch's RNG for the build in a forked RNG state; ``None`` draws from the
    caller's RNG (:func:`train_method` seeds build and training together). On a GPU the
    inducing sets the user left at their defaults are sized for it
    (:func:`gpscale.devices.inducing_options`).
    """
    x, y = cast(train, config, task)
    options = inducing_options(method, options, device, task, x.shape[0])  # sized for a GPU
    with torch.random.fork_rng(enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        tic = time.perf_counter()
        filled = (fill_prefit_options(method, (x, y), task=task, num_classes=num_classes,
                                      options=options) if start is None else
                  fill_start_options(method, options, start, config.torch_dtype))
        def built(opts: dict[str, Any]) -> Method:
            model = build(method, x.shape[1], task=task, num_classes=num_classes, init=(x, y),
                          **opts)
            model.to(device=device, dtype=config.torch_dtype)
            model.max_start_lr = prefit_lr_cap(method, options, opts,  # read by train_built
                                               x.shape[0])
            return model

        model = built(filled)
        if model.max_start_lr is not None and not start_resolvable(
                method, model, x.to(device), y.to(device)):  # the model is on the device
            model = built(options)  # the default start, at the default lr
        return model, time.perf_counter() - tic


def train_built(model: Method, train: tuple[Tensor, Tensor], config: FitConfig,
                callbacks: Sequence[Any] = (), *, loss_fn: Callable | None = None,
                parallel: DataParallel | None = None, condition: bool = True,
                on_trained: Callable[[Method], None] | None = None
                ) -> tuple[History, Any]:
    """Train (or condition) ``model`` on ``train``; returns (history, state).

    ``state`` is ``model.posterior(*train)`` after training (``None`` with ``condition=False``,
    e.g. for a rank that holds a shard only). ``parallel`` is the data-parallel hook of
    ``training.fit``; its ``all_reduce`` (sum over ranks) is handed to ``finalize``.
    ``on_trained(model)`` sees the model as its optimiser left it, before ``finalize`` and the
    held-out calibration change its noise and scale for prediction (``auto``'s race continues
    training from there, not from the calibrated values).
    """
    x, y = train
    cap = model.max_start_lr
    if cap is not None and config.lr > cap:  # a pre-fitted start: keep it
        log.info("training from the pre-fitted hyperparameters at lr %g (not %g; "
                 "-o prefit_max_lr)", cap, config.lr)
        config = replace(config, lr=cap)
    split = _holdout(model, train, config, parallel)
    calibrating = split is not None and model.heldout_noise
    if calibrating:  # trains on the rest, calibrates σ² on the held-out rows below
        history, state = fit(model, loss_fn, split[0], config, callbacks), None
    elif split is not None:  # trains on the rest, keeps the best epoch on the held-out rows
        validation = Validation(model.validation_score(*split, seed=config.seed),
                                patience=validation_patience(split[0][0].shape[0],
                                                             config.batch_size),
                                tolerance=LOSS_SD / math.sqrt(split[1][0].shape[0]))
        history = fit(model, loss_fn, split[0], config, callbacks, validation=validation)
        state = None
    elif model.trainable:
        history, state = fit(model, loss_fn, train, config, callbacks, parallel=parallel), None
    elif model.learns_kernel:  # IterNCGP: Newton and evidence steps
        history, state = learn_kernel(model, train, config, callbacks)
    else:
        history, state = condition_only(model, train, callbacks)
    if on_trained is not None:
        on_trained(model)
    handed = model.finalize_reads_posterior and condition and not calibrating
    if handed and state is None:
        state = _condition(model, x, y)
    with torch.no_grad():
        changed = model.finalize(x, y, None if parallel is None else parallel.all_reduce,
                                 **({} if split is None else {"held": split}),
                                 **({"state": state} if handed else {}))
    if changed:  # e.g. {"noise_calibrated": 0.012}: recorded with the last epoch
        if history.rows:
            history.rows[-1].update(changed)
        if not handed:
            state = None
    if calibrating:
        model.eval()
        with torch.no_grad():
            changed = calibrate_noise(model, *split, floor=NOISE_FLOOR)
        if history.rows:
            history.rows[-1].update(changed)
    if state is None and condition:
        state = _condition(model, x, y)
    return history, state


def _condition(model: Method, x: Tensor, y: Tensor) -> Any:
    """``model``'s posterior on ``x``, ``y`` in eval mode (on the CPU after an out-of-memory
    error on the device)."""
    model.eval()

    def posterior(device: torch.device):
        with torch.no_grad():
            return model.posterior(x.to(device), y.to(device))

    return on_cpu_after_oom(posterior, model, "conditioning the trained model")


def _holdout(model: Method, train: tuple[Tensor, Tensor], config: FitConfig,
             parallel: DataParallel | None
             ) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]] | None:
    """(rows to train on, rows held out) for a method that asks for held-out rows
    (``holdout_rows(n)``, e.g. SoftKI), else ``None``. One process only: the ranks of a
    data-parallel run train on all their rows (SoftKI then calibrates by the likelihood)."""
    rows = heldout_rows if model.heldout_noise else model.holdout_rows
    if not model.trainable:
        return None
    count = rows(train[0].shape[0])
    if count and parallel is not None:
        log.info("several processes: no rows held out (one process holds rows out to pick the "
                 "best epoch or calibrate by)")
        return None
    if not count:
        return None
    log.info("holding out %d of %d training rows to %s", count, train[0].shape[0],
             "calibrate the noise by" if model.heldout_noise
             else "pick the best epoch and calibrate by")
    return split_holdout(*train, count, config.seed)


def train_method(method: str, train: tuple[Tensor, Tensor], *, task: str,
                 num_classes: int | None, options: dict[str, Any], config: FitConfig,
                 seed: int, callbacks: Sequence[Any] = (),
                 warm: Mapping[str, Tensor] | None = None) -> Trained:
    """:func:`build_method` then :func:`train_built` in one process, under one seeded RNG
    stream (forked: the caller's RNG state is left as it was). ``warm``: parameters to start
    from (:func:`start_warm`), as ``auto``'s race leaves its winner's (empty for a winner that
    starts from its own start); given, its build (a pre-fit) counts against ``max_time``, what
    the race left of the budget. A full-batch L-BFGS run
    that converges from them with at least :data:`RESTART_MIN_SHARE` of its budget left is
    trained again from its own start and the run with the lower loss kept (:func:`restart_time`;
    its history's clock counts both runs).

    The method is built from ``train`` where it lies (initialisation, pre-fits) and then moved
    with the data to ``config.device`` to train; the returned state lives there too.
    """
    train = cast(train, config, task)
    device = config.torch_device
    check_dense_fits(method, train[0].shape[0], config.torch_dtype, device)

    def once(warm: Mapping[str, Tensor] | None, config: FitConfig) -> Trained:
        with torch.random.fork_rng():  # one seeded stream for initialisation and training
            torch.manual_seed(seed)
            model, setup_time = build_method(method, train, task=task, num_classes=num_classes,
                                             options=options, config=config, seed=None,
                                             device=device)
            config = after_build(config, warm, setup_time)
            if warm:
                start_warm(model, warm, method, options)
            history, state = train_built(model, tuple(t.to(device) for t in train), config,
                                         callbacks)
        return Trained(model, history, state, setup_time)

    trained = once(warm, config)
    left = (restart_time(trained.history, after_build(config, warm, trained.setup_time))
            if warm is not None else None)
    if left is None:
        return trained
    log.info("%s converged from its warm start after %.0f s at loss %.4g; training it again "
             "from its own start for the %.0f s left, keeping the lower loss", method,
             trained.history.train_time, _final_loss(trained.history), left)
    try:  # an empty warm start: its build, too, counts against the time left
        fresh = once({}, replace(config, max_time=left, checkpoint=None))
    except (NonFiniteLossError, NumericalError, RuntimeError, ValueError) as err:
        log.warning("%s: the run from its own start failed (%s); keeping the warm-started one",
                    method, str(err).splitlines()[0][:120] if str(err) else type(err).__name__)
        return trained
    kept, other = ((fresh, trained) if _final_loss(fresh.history) < _final_loss(trained.history)
                   else (trained, fresh))
    log.info("keeping the run from its %s start (loss %.4g against %.4g)",
             "own" if kept is fresh else "warm", _final_loss(kept.history),
             _final_loss(other.history))
    kept.history.rows[-1]["time_s"] = trained.history.train_time + fresh.history.train_time
    return kept


MIN_FINAL_SECONDS = 1.0
"""Least training seconds a race's winner gets after its build, whatever the build took."""
RESTART_MIN_SHARE = 0.5
"""Least share of its time budget a full-batch L-BFGS run warm-started by ``auto``'s race must
have left when it converges for :func:`train_method` to train it again from its own start."""


def after_build(config: FitConfig, warm: Mapping[str, Tensor] | None,
                setup_time: float) -> FitConfig:
    """``config`` for training after a build of ``setup_time`` seconds: a race's winner
    (``warm`` given, empty where it starts from its own start) must finish within what the race
    left of the budget, so its build (a pre-fit) counts against ``max_time``; any other run's
    ``max_time`` is its training time alone."""
    if warm is None or config.max_time is None:
        return config
    return replace(config, max_time=max(config.max_time - setup_time, MIN_FINAL_SECONDS))


def restart_time(history: History, config: FitConfig) -> float | None:
    """Seconds a converged warm-started run has left for a second run from the method's own
    start, or ``None`` where there is to be none.

    A full-batch L-BFGS run (the exact GP's) is deterministic, so the start decides which
    optimum of the marginal likelihood it converges to; the race leaves its parameters on
    fewer rows in short slices, and on many ARD lengthscales that start can sit on a plateau
    of a worse optimum that its own defaults would have passed. Its loss is the same
    objective on the same rows from either start, so the lower one is kept. Minibatch runs
    (Adam) are not restarted: their warm start is what lets them use the race's time."""
    if (config.optimizer != "lbfgs" or history.stopped != "converged"
            or config.max_time is None):
        return None
    left = config.max_time - history.train_time
    return left if left >= RESTART_MIN_SHARE * config.max_time else None


def _final_loss(history: History) -> float:
    """The loss the model of a full-batch run ends at: its best epoch's (it returns there)."""
    losses = [float(v) for v in history.column("loss") if v is not None]
    return min(losses, default=math.inf)


def load_warm(model: torch.nn.Module, warm: Mapping[str, Tensor]) -> list[str]:
    """Copy into ``model`` each parameter or buffer of ``warm`` whose name and shape it has;
    the names copied (one of another shape, as actions learned on other rows, keeps its fresh
    start)."""
    copied = []
    with torch.no_grad():
        for name, p in chain(model.named_parameters(), model.named_buffers()):
            value = warm.get(name)
            if value is not None and value.shape == p.shape:
                p.copy_(value.to(device=p.device, dtype=p.dtype))
                copied.append(name)
    return copied


def start_warm(model: Method, warm: Mapping[str, Tensor], method: str,
               options: Mapping[str, Any]) -> None:
    """Start ``model`` from ``warm`` (:func:`load_warm`) and train it at no more than the
    ``prefit_max_lr`` in ``options``, where they hold one: the race passes on the cap its
    winner trained under (a start from the shared pre-fit, which a first large step would
    throw away); a winner that raced from its own defaults goes on at its own rate."""
    copied = load_warm(model, warm)
    log.info("starting %s from %d trained parameter tensors of %d", method, len(copied),
             len(warm))
    if options.get("prefit_max_lr") is not None:
        model.max_start_lr = float(options["prefit_max_lr"])
