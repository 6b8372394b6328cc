"""``method="auto"`` for regression beyond the exact GP: a race of the candidate methods on
held-out rows of the user's own data, inside the time budget.

Which scalable method serves a data set best depends on things no rule on n and d sees — how
SVGP's optimiser copes with many ARD lengthscales, how far CaGP-Opt's actions reach, whether a
grid fits the function — so ``auto`` fits its candidates and looks:

1. :func:`gpscale.methods.auto.race_candidates` lists the keys that can take the task and the
   user's options (the exact GP where its epochs are seconds, GGP for d ≤ 3 or an additive
   kernel, CaGP-Opt up to its size bound, SVGP, SOLVE-GP and SoftKI).
2. A share :data:`HELD_SHARE` of the training rows (at least :data:`HELD_MIN`, at most
   :data:`HELD_MAX`, drawn under the seed) is held out; each candidate is built and trained on
   the rest with its own defaults, sized for every row (``MethodSpec.row_sized``: CaGP-Opt's
   number of actions is that of its final run, which starts from the race), and from one
   start: an exact GP fitted to
   :data:`START_POINTS` of those rows (float64 L-BFGS, seconds to a minute) supplies every
   candidate's lengthscales, outputscale and noise where the user gave none
   (:func:`~gpscale.training.prefit.fill_start_options`). From the default √d lengthscales a
   candidate on data with a few relevant inputs among many spends its first minute finding
   them; every candidate stays at the same error meanwhile, and the halving would decide on
   noise. From the shared start the race compares the approximations, not who finds the
   relevant inputs first. Where the exact GP races (its likelihood fitted by L-BFGS, up to a
   few thousand rows) there is no shared start: on 128 inputs and 2,250 rows the start took
   a third of the race and every candidate, the exact GP included, ended worse from it than
   from its own defaults. A candidate with a pre-fit rule of its own (CaGP-Opt) trains from
   the shared start at its capped ``prefit_max_lr`` only where that rule would pre-fit its
   rows (:func:`~gpscale.training.prefit.prefit_lr_cap`); below, at its full learning rate,
   as alone: its epochs are cheap there, and at the capped rate it fell behind its own
   defaults, while from its own defaults it had not found the relevant inputs of a 12-input
   set by the end of the first round.
3. Successive halving: the race's share of the budget (:data:`RACE_SHARE`) is split evenly
   between ⌈log₂ k⌉ rounds, a round's time evenly between the candidates still in it; after
   each round the candidates are ranked by their held-out negative log predictive density
   (NLL, the quantity that judges mean and intervals together) and the better half goes on,
   training on from where its optimiser stopped: the noise and scale a method calibrates
   after training for prediction (SoftKI rescales its outputscale, CaGP-Opt its latent
   variance and noise, each slice as at the end of its final run) are scored, then set back
   to their trained values, which the training loss moves on from smoothly. So every
   candidate is judged by the intervals its final run delivers. (CaGP-Opt's uncalibrated
   intervals are wide by the error of its untrained actions early in training; its
   calibration, not a scale fitted to the judged rows, is what removes that.)
4. The winner is rebuilt on every row and trained for the rest of the budget, starting from
   the parameters its race's training ended with (again before the calibration:
   hyperparameters, inducing points and variational parameters), at most at the learning
   rate it raced under (``prefit_max_lr`` after the shared start). A winner with parameters
   per training row (CaGP-Opt's actions) has them grown to every row by
   :meth:`~gpscale.methods.base.Method.warm_for_rows` (CaGP-Opt's blocks keep their learned
   entries and take the held-out rows near them, at zero, so the final run starts at the
   race's posterior; it calibrates its intervals on some of those rows, which no run has
   trained on): it trains full batch for hundreds of epochs, and from its own start it
   would lose its race time, while its race's hyperparameters without the actions they were
   trained with started it worse than its own pre-fit. Where they cannot be grown (a
   default number of actions that differs on every row) it starts from its own defaults
   and pre-fit. A full-batch L-BFGS winner (the exact GP)
   that converges from there with most of its time left is trained again from its own
   defaults and the lower loss kept (:func:`gpscale.training.harness.restart_time`): on 128
   inputs its race's parameters sat on a plateau of a worse optimum. :class:`RaceResult`
   records each candidate's held-out NLL, RMSE, epochs and seconds for the reason line
   (``method_reason_``, the ``gpscale fit`` log).

A slice does not anneal its learning rate towards its end (``FitConfig.budget_anneal`` is
off in the race): a slice is a stretch of its candidate's run, not the run's last epochs, and
an anneal in each short slice held a candidate at small rates for much of its race time (a
12-input set whose candidates must first find the relevant inputs stayed at the start's
error), which the winner's final run, warm-started, then had to climb out of.

The race is a wall-clock race: each slice is seconds (and, where ``epochs`` is given, a share
of the epochs). With the same seed, the rows held out, every candidate's start and its
minibatches are the same; the epochs a slice holds depend on the machine's speed, so a
choice between two candidates whose held-out NLLs lie closer than that variation can differ
between machines. A candidate that fails (a non-finite loss, out of memory) is out, named in
the table.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from gpscale.errors import NonFiniteLossError, NumericalError
from gpscale.kernels import is_expression
from gpscale.methods import auto
from gpscale.methods.auto import Choice, resolve_options
from gpscale.methods.base import Method
from gpscale.methods.options import PREFIT_OFF
from gpscale.methods.registry import get_spec
from gpscale.training.config import FitConfig
from gpscale.training.harness import build_method, load_warm, train_built
from gpscale.training.prefit import exact_prefit
from gpscale.training.probe import inducing_probe

__all__ = ["HELD_SHARE", "HELD_MIN", "HELD_MAX", "RACE_SHARE", "Runner", "RaceResult",
           "AutoPick", "START_POINTS", "START_SHARE", "shared_start", "MIN_FINAL_SHARE",
           "final_budget", "race", "pick_auto", "held_out_split", "warm_parameters", "warm_options"]

log = logging.getLogger("gpscale.fit")

HELD_SHARE = 0.15
"""Share of the training rows the race holds out to judge its candidates by."""
HELD_MIN = 200
"""Fewest held-out rows (the NLL's standard error over 200 rows is about 0.05 for a
well-calibrated Gaussian predictive: close enough to part candidates the race must part)."""
HELD_MAX = 5_000
"""Most held-out rows (prediction on them is part of each round's time)."""
RACE_SHARE = 0.5
"""Share of the time budget the race may use; the winner trains on every row for the rest
(warm-started, so the race's time is not lost to it)."""

MIN_FINAL_SHARE = 0.1
"""Least share of the budget the race's winner trains for on every row, should the race
overrun its own share."""


def final_budget(budget: float, spent: float) -> float:
    """Seconds the race's winner trains for on every row: what the race left of ``budget``,
    at least :data:`MIN_FINAL_SHARE` of it."""
    return max(budget - spent, MIN_FINAL_SHARE * budget)


RACE_LBFGS_ITER = 5
"""L-BFGS iterations per epoch in a race slice (the exact GP's): the slice's clock is read
between epochs, and a default epoch of 20 iterations at a few thousand points outlasts a
slice several times over."""

START_POINTS = 1000
"""Rows of the exact GP whose hyperparameters start every candidate (a few seconds to tens of
seconds on a CPU; the inducing probe's size)."""
START_SHARE = 0.25
"""The shared start's time limit as a share of the race's time; it is read between the fit's
epochs, so the last epoch may run past it."""


@dataclass
class Runner:
    """One candidate in the race: its key, typed options, model and its held-out scores."""

    key: str
    options: dict[str, Any]
    model: Method | None = None
    seconds: float = 0.0
    epochs: int = 0
    nll: float = math.inf
    rmse: float = math.inf
    round_out: int | None = None
    failure: str | None = None
    trained: dict[str, Tensor] | None = field(default=None, repr=False)
    """The parameters as training left them, before the noise and scale were calibrated for
    prediction: where the next slice and the winner's final run start."""

    @property
    def judged(self) -> float:
        """What the race ranks by: the held-out NLL (``inf`` where it is not finite)."""
        return self.nll if math.isfinite(self.nll) else math.inf

    def describe(self) -> str:
        """``svgp NLL −1.002 RMSE 0.110 (41 epochs, 38 s)`` and how it left the race."""
        if self.failure is not None:
            return f"{self.key} failed ({self.failure})"
        text = (f"{self.key} NLL {self.nll:.3f} RMSE {self.rmse:.3g} ({self.epochs} "
                f"epochs, {self.seconds:.0f} s)")
        return text if self.round_out is None else text + f", out after round {self.round_out}"


@dataclass(frozen=True)
class RaceResult:
    """The race's winner, its options and parameters, and every candidate's figures.

    Attributes:
        choice: the winner and the reason line (each candidate's held-out figures).
        options: the winner's options, typed.
        warm: the winner's trained parameters by name for a model on every row (for
            :func:`gpscale.training.harness.load_warm`; rows grown by
            :meth:`~gpscale.methods.base.Method.warm_for_rows`); empty where they cannot be
            carried over: the winner then trains from its own start, pre-fit included,
            within what the race left.
        runners: every candidate, best first.
        seconds: the race's time, from the split to the winner's last evaluation.
        held: rows held out.
    """

    choice: Choice
    options: dict[str, Any]
    warm: dict[str, Tensor] = field(repr=False)
    runners: tuple[Runner, ...]
    seconds: float
    held: int


def held_out_split(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """(rows to train on, rows held out) of ``n`` rows, drawn under ``seed``."""
    count = min(max(HELD_MIN, round(HELD_SHARE * n)), HELD_MAX, n // 2)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[count:].sort().values, order[:count].sort().values


def warm_parameters(model: torch.nn.Module) -> dict[str, Tensor]:
    """The model's parameters by name, detached copies on the CPU."""
    return {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}


def shared_start(x: Tensor, y: Tensor, options: Mapping[str, Any], *, seed: int,
                 max_time: float) -> dict[str, Any] | None:
    """The hyperparameters every candidate starts from: an exact GP with the user's named kernel
    (Matérn-3/2 by default) fitted to :data:`START_POINTS` rows of ``x``, ``y``; ``None`` for
    a kernel expression or object, or where the fit fails (then each candidate starts from its
    own defaults, warned)."""
    kernel = options.get("kernel", "matern32")
    if not isinstance(kernel, str) or is_expression(kernel):
        return None
    try:
        return exact_prefit(x, y, method=auto.PROBE_METHOD, kernel=kernel,
                            ard=bool(options.get("ard", True)), size=START_POINTS, seed=seed,
                            max_time=max_time, quiet=True)
    except (NumericalError, RuntimeError, ValueError) as err:
        log.warning("method auto: the race's shared start failed (%s); each candidate starts "
                    "from its own defaults", str(err).splitlines()[0][:120])
        return None


def _rounds(count: int) -> int:
    return max(1, math.ceil(math.log2(count)))


def race(keys: list[str], x: Tensor, y: Tensor, *, options: Mapping[str, Any],
         config_for: Callable[[str], FitConfig], budget: float, seed: int,
         epochs: int | None = None, limit: float | None = None) -> RaceResult:
    """Race ``keys`` on ``x`` (n, d), ``y`` (n,) (standardised, as the methods train on
    them) for at most :data:`RACE_SHARE` of ``budget`` seconds (module docstring).

    Args:
        keys: the candidates, at least two, in the order that breaks a tie.
        options: the user's options (each candidate types them for itself).
        config_for: each key's training configuration (its defaults with the user's
            overrides); the race sets its time, and no checkpoint or progress bar.
        budget: the whole run's time budget in seconds.
        seed: seeds the held-out rows, each candidate's build and its minibatches.
        epochs: the user's epoch budget, if any: each slice gets the round's share of it.
        limit: most seconds the race may take whatever the budget (a data-parallel run's
            other processes wait for rank 0's race inside one collective's timeout).
    """
    if len(keys) < 2:
        raise ValueError(f"a race needs at least two candidates; got {keys}")
    tic = time.perf_counter()
    train_rows, held_rows = held_out_split(x.shape[0], seed)
    train, held = (x[train_rows], y[train_rows]), (x[held_rows], y[held_rows])
    runners = [Runner(key, get_spec(key).sized_for_rows(
        resolve_options(Choice(key, "a race candidate"), options), x.shape[0])) for key in keys]
    rounds, alive = _rounds(len(runners)), list(runners)
    allowed = RACE_SHARE * budget if limit is None else min(RACE_SHARE * budget, limit)
    log.info("method auto: racing %s on %d held-out rows of %d, %d round%s in %.0f s",
             ", ".join(keys), len(held_rows), x.shape[0], rounds, "s" * (rounds > 1),
             allowed)
    exact_races = any(config_for(key).optimizer == "lbfgs" for key in keys)
    start = None if exact_races else shared_start(*(t.double() for t in train), options,
                                                  seed=seed, max_time=START_SHARE * allowed)
    start_seconds = time.perf_counter() - tic
    if start is not None:
        log.info("method auto: every candidate starts from an exact GP on %d rows (%.0f s): "
                 "outputscale %.3g, noise %.3g", min(START_POINTS, len(train_rows)),
                 start_seconds, start["outputscale"], start["noise"])
    for number in range(1, rounds + 1):
        spent = time.perf_counter() - tic
        left = allowed - spent
        if left <= 0 and number > 1:
            log.info("method auto: the race's time is spent after round %d", number - 1)
            break
        share = max(left, 0.0) / (rounds - number + 1) / len(alive)
        per_slice = None if epochs is None else max(1, epochs // (rounds * len(alive)))
        for runner in alive:
            _run_slice(runner, train, held, config_for, share, per_slice, seed, start)
        ranked = sorted(alive, key=lambda r: (r.judged, runners.index(r)))
        keep = max(1, math.ceil(len(ranked) / 2)) if number < rounds else 1
        for runner in ranked[keep:]:
            runner.round_out = number
            runner.model = None  # its memory back for the rest
        alive = ranked[:keep]
        log.info("method auto: round %d: %s", number,
                 "; ".join(r.describe() for r in ranked))
    best = min(alive, key=lambda r: (r.judged, runners.index(r)))
    if not math.isfinite(best.judged):
        raise RuntimeError("method auto: every candidate of the race failed: "
                           + "; ".join(r.describe() for r in runners))
    order = sorted(runners, key=lambda r: (r.judged, runners.index(r)))
    seconds = time.perf_counter() - tic
    began = ("" if start is None else
             f", from an exact GP's start on {min(START_POINTS, len(train_rows)):,} rows "
             f"({start_seconds:.0f} s)")
    reason = (f"a race on {len(held_rows):,} held-out rows of {x.shape[0]:,} ({seconds:.0f} s"
              f"{began}): " + "; ".join(r.describe() for r in order)
              + f": {best.key}, the best held-out NLL")
    trained = best.trained if best.trained is not None else warm_parameters(best.model)
    warm = best.model.warm_for_rows(trained, x, train_rows, held_rows, best.options) or {}
    options = dict(best.options)
    if warm and best.model.max_start_lr is not None:  # the cap it raced under goes on
        options["prefit_max_lr"] = best.model.max_start_lr
    return RaceResult(Choice(best.key, reason), options, warm, tuple(order), seconds,
                      len(held_rows))


def _run_slice(runner: Runner, train: tuple[Tensor, Tensor], held: tuple[Tensor, Tensor],
               config_for: Callable[[str], FitConfig], seconds: float, epochs: int | None,
               seed: int, start: dict[str, Any] | None = None) -> None:
    """Build ``runner``'s model (first slice, from the shared ``start`` where there is one) and
    train it on for ``seconds`` (and at most ``epochs``), then score it on ``held``. A failure
    takes it out of the race, except in a first slice from the shared start: then it starts
    again from its own defaults for the rest of the slice (SVGP's inducing-point matrix at a
    large pre-fitted outputscale may not factor in float32)."""
    if runner.failure is not None:
        return
    config = config_for(runner.key)
    config = replace(config, max_time=max(seconds, 1e-3), checkpoint=None, progress=False,
                     budget_anneal=False,  # a slice is not the end of its candidate's run
                     lbfgs_max_iter=min(config.lbfgs_max_iter, RACE_LBFGS_ITER),
                     **({} if epochs is None else {"epochs": epochs}))
    data = tuple(t.to(config.torch_dtype) for t in train)
    tic = time.perf_counter()
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            if runner.model is None:
                runner.model, _ = build_method(runner.key, data, task="regression",
                                               num_classes=None, options=runner.options,
                                               config=config, seed=None,
                                               device=config.torch_device, start=start)
            elif runner.trained is not None:  # on from where training, not calibration, left it
                load_warm(runner.model, runner.trained)
            device = config.torch_device

            def keep(model: Method) -> None:
                runner.trained = warm_parameters(model)

            history, state = train_built(runner.model, tuple(t.to(device) for t in data),
                                         config, on_trained=keep)
            runner.model.eval()
            with torch.no_grad():
                pred = runner.model.predict(state, held[0].to(device=device,
                                                              dtype=config.torch_dtype))
            pred = pred.to("cpu")
            scores = pred.metrics(held[1].to(torch.float64))
    except (NonFiniteLossError, RuntimeError, ValueError, MemoryError) as err:
        why = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        runner.model, runner.nll = None, math.inf
        if start is not None and runner.trained is None:  # the shared start did not suit it
            spent = time.perf_counter() - tic
            runner.seconds += spent
            log.info("method auto: %s failed from the shared start (%s); it starts from its "
                     "own defaults", runner.key, why)
            _run_slice(runner, train, held, config_for, max(seconds - spent, 1.0), epochs,
                       seed, None)
            return
        runner.failure = why
        log.warning("method auto: %s left the race: %s", runner.key, runner.failure)
        return
    runner.seconds += time.perf_counter() - tic
    runner.epochs += history.epochs
    nll = float(scores["test_nll"])
    runner.nll = nll if math.isfinite(nll) else math.inf
    runner.rmse = float(scores["test_rmse"])


@dataclass(frozen=True)
class AutoPick:
    """What ``auto`` resolved to: the choice, its typed options, and where a race chose, the
    winner's parameters to start from (``warm``) and the race."""

    choice: Choice
    options: dict[str, Any]
    warm: dict[str, Tensor] | None = field(default=None, repr=False)
    race: RaceResult | None = None


def pick_auto(task: str, x: Tensor, y: Tensor, *, num_classes: int | None,
              options: Mapping[str, Any], device: Any, seed: int,
              config_for: Callable[[str], FitConfig], budget: float,
              epochs: int | None = None, parallel: bool = False,
              race_limit: float | None = None) -> AutoPick:
    """Resolve ``method="auto"`` on standardised training data: a race
    (:func:`race`) among :func:`~gpscale.methods.auto.race_candidates` where there are two or
    more, else the rules (:func:`gpscale.methods.auto.pick`, with the inducing probe where it
    decides). ``-o auto=rules`` asks for the rules."""
    mode, rest = auto.split_mode(options)
    keys = ([] if mode == "rules" else
            auto.race_candidates(task, x.shape[0], x.shape[1], rest, device=device,
                                 parallel=parallel))
    if len(keys) < 2:
        choice, typed = auto.pick(task, x.shape[0], x.shape[1], num_classes=num_classes,
                                  options=rest, device=device,
                                  probe=lambda: inducing_probe(x, y, seed=seed))
        return AutoPick(choice, typed)
    auto.check_options(task, rest)
    result = race(keys, x, y, options=rest, config_for=config_for, budget=budget, seed=seed,
                  epochs=epochs, limit=race_limit)
    log.info("method auto: %s", result.choice.reason)
    return AutoPick(result.choice, result.options, result.warm, result)


def warm_options(key: str, options: Mapping[str, Any], given: Mapping[str, Any],
                 warm: Mapping[str, Tensor] | None = None) -> dict[str, Any]:
    """The winner's options for its final run: warm-started (``warm`` not empty), no pre-fit
    (its race trained the hyperparameters a pre-fit would estimate) unless the user asked for
    one; from its own start, ``options`` as they are."""
    if not warm:
        return dict(options)
    declared = {o.name for o in get_spec(key).options}
    if "prefit" in declared and "prefit" not in given:
        return {**options, "prefit": PREFIT_OFF}
    return dict(options)
