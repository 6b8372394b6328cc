"""``fit``: the one training loop of gpscale.

It knows nothing about any method: it minimises ``loss_fn(model, x_batch, y_batch)`` with Adam or
L-BFGS, over minibatches or the full data, under epoch and wall-clock budgets, and records a
:class:`History`. Evaluation callbacks run outside the training clock. With a checkpoint path it
writes the model, optimiser, scheduler, history and shuffling-generator state atomically, and a
later call with the same path resumes where the earlier one stopped. The file carries a format
version and a checksum (``gpscale.io.write_file``) and what identifies the run (method and its
options, optimiser, preset and training settings, probe rows of the training data); a corrupt
checkpoint, one written by another run or by this one with a setting other than the budget
changed, is a ``SavedFileError`` (a ``ValueError``) naming the change, never silently trained
over. A non-finite loss stops training: the model is restored to the last good parameters and
``NonFiniteLossError`` is raised carrying the history and the last checkpoint (which is never
overwritten by a bad state).

Data-parallel runs pass ``parallel`` (``gpscale.training.parallel.DataParallel``): every rank
runs this loop on its shard, the hook supplies the rank's minibatches, reduces each step's loss
and gradients across ranks before the optimiser sees them, and agrees on the epoch time, so all
ranks take identical steps and stop together; only the main rank shows progress, says that it
resumed and writes the checkpoint (every rank reads it and checks it against its run).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from gpscale.allocator import training_allocator
from gpscale.devices import OOM_ERRORS, out_of_memory
from gpscale.errors import NonFiniteLossError, NumericalError
from gpscale.methods.base import Method
from gpscale.training.checkpoint import (
    announce_resume,
    load_checkpoint,
    run_identity,
    save_checkpoint,
)
from gpscale.training.config import FitConfig
from gpscale.training.history import History
from gpscale.training.interrupt import requested as interrupt_requested
from gpscale.training.schedules import BestEpoch, Schedule
from gpscale.training.validation import Validation

__all__ = ["fit", "default_loss", "condition_only"]

log = logging.getLogger("gpscale.training")
LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]


def default_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The Method contract's loss: ``model.loss(model.condition(x, y))``."""
    return model.loss(model.condition(x, y))


@dataclass
class _Run:
    """Mutable bookkeeping of one ``fit`` call."""

    optimizer: torch.optim.Optimizer
    scheduler: Schedule
    generator: torch.Generator
    history: History
    start_epoch: int = 1
    time_offset: float = 0.0
    identity: dict[str, Any] | None = None  # what a checkpoint must match (run_identity)
    deadline: float | None = None  # perf_counter() at which the budget runs out (this epoch)
    began: tuple[int, float, float] = (1, 0.0, 0.0)  # epoch, clock, perf_counter() at its start
    windowed: bool = False  # the plateau test ran on windows of the last epoch
    converged: bool = False  # a window of the last epoch found convergence
    out_of_time: bool = False  # the last epoch stopped early at the deadline
    interrupted: bool = False  # Ctrl-C asked to stop (gpscale.training.interrupt)


def fit(model: nn.Module, loss_fn: LossFn | None, data: tuple[Tensor, Tensor],
        config: FitConfig | None = None, callbacks: Sequence[Any] = (), *,
        parallel: Any = None, validation: Validation | None = None) -> History:
    """Train ``model`` in place and return its :class:`History`.

    Args:
        model: the module whose parameters are optimised.
        loss_fn: ``(model, x_batch, y_batch) -> scalar`` to minimise; ``None`` (the model is
            then a :class:`~gpscale.methods.base.Method`) uses the model's
            ``training_loss(x, y)`` (a loss function that prepares the per-data work once, e.g.
            GGP's sufficient statistics), or where that is ``None`` :func:`default_loss`.
        data: training inputs (n, d) and targets (n,).
        config: optimisation options (:class:`FitConfig`); defaults when ``None``.
        callbacks: objects with ``on_epoch_end(model, epoch, row, final=False)`` returning
            metrics to record (see ``training.callbacks``).
        parallel: ``None`` (one process) or a data-parallel hook with ``is_main``,
            ``batches(n, batch_size, generator)`` (an iterator of local index tensors or
            ``None``), ``reduce_loss(loss, batch_rows) -> float``, ``step_rows() -> int`` (the
            last step's global batch size), ``reduce_gradients(model, batch_rows)``,
            ``epoch_time(seconds) -> float`` and, with a checkpoint, ``num_points`` and
            ``global_rows(t, index)`` (see ``gpscale.training.parallel``).
        validation: scores held-out rows after every epoch (inside the training clock), stops
            when the score no longer improves and restores the best epoch's parameters at the
            end (:mod:`gpscale.training.validation`); one process only.

    Returns:
        The history, one row per epoch: ``epoch``, ``time_s`` (cumulative training time,
        evaluation excluded), ``loss`` (mean over the epoch's batches), ``lr`` and any metrics.

    Raises:
        NonFiniteLossError: the loss became NaN or infinite; the model holds the last good
            parameters, the checkpoint file (if any) the last good state.
        ValueError: no trainable parameters or mismatched data.
        SavedFileError: the checkpoint to resume from is corrupt, not a checkpoint, or was
            written by another run: another method or method options, optimiser, preset,
            training setting other than the budget, parameter shapes or training data.
    """
    config = config or FitConfig()
    x, y = data
    if loss_fn is None:  # a method may prepare per-data work once (GGP's statistics)
        loss_fn = model.training_loss(x, y) or default_loss
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but y has {y.shape[0]}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    run = _start(model, params, config, x.shape[0])
    ckpt = Path(config.checkpoint) if config.checkpoint else None
    main = parallel is None or parallel.is_main
    if ckpt is not None:  # on every rank: a data-parallel run gathers its probe rows
        run.identity = run_identity(model, run.optimizer, config, x, y, parallel)
    if ckpt is not None and config.resume and ckpt.exists():
        load_checkpoint(ckpt, model, run)
        announce_resume(ckpt, run, config, main)
    history = run.history
    clock = run.time_offset
    bar = tqdm(total=config.epochs, initial=run.start_epoch - 1,
               disable=not (_show(config) and main),
               desc="fit", unit="epoch", file=sys.stderr, dynamic_ncols=True)
    history.stopped = "running"
    allocator = contextlib.ExitStack()  # freed large blocks kept for the next epoch
    allocator.enter_context(training_allocator(x.device.type == "cpu"))
    try:
        restore_point = None  # (model, optimiser) state at the start of the previous epoch
        best = BestEpoch(config, x.shape[0])
        for epoch in range(run.start_epoch, config.epochs + 1):
            good = copy.deepcopy(model.state_dict())
            good_optimizer = copy.deepcopy(run.optimizer.state_dict())
            tic = time.perf_counter()
            run.deadline = (None if config.max_time is None or parallel is not None
                            else tic + config.max_time - clock)
            run.began = (epoch, clock, tic)
            fallback = restore_point or (good, good_optimizer)
            try:
                loss, err, restarted = _epoch_with_back_off(model, loss_fn, x, y, config, run,
                                                            parallel, epoch, fallback)
            except OOM_ERRORS as oom:  # one line, the last good state and checkpoint kept
                model.load_state_dict(good)
                history.stopped = "out-of-memory"
                kept = f"the model keeps the parameters of epoch {epoch - 1}" + (
                    f" and the last checkpoint is {ckpt}" if ckpt and ckpt.exists() else "")
                raise out_of_memory(oom, f"epoch {epoch}", x.device, kept) from None
            if config.scheduler == "plateau":  # where this epoch (finally) started from
                restore_point = fallback if restarted else (good, good_optimizer)
            if err is not None:  # e.g. a Cholesky that failed for these parameters
                model.load_state_dict(good)
                history.stopped = "numerical-error"
                raise NonFiniteLossError(
                    f"epoch {epoch} failed ({err}); the model keeps the parameters of epoch "
                    f"{epoch - 1}" + (f" and the last checkpoint is {ckpt}"
                                      if ckpt and ckpt.exists() else "")
                    + ". Lower the learning rate or use float64.",
                    epoch=epoch, history=history,
                    checkpoint=str(ckpt) if ckpt and ckpt.exists() else None) from err
            elapsed = time.perf_counter() - tic
            clock += elapsed if parallel is None else parallel.epoch_time(elapsed)
            if not math.isfinite(loss):
                model.load_state_dict(good)
                history.stopped = "non-finite"
                raise NonFiniteLossError(
                    f"the training loss became {loss} in epoch {epoch}; the model keeps the "
                    f"parameters of epoch {epoch - 1}"
                    + (f" and the last checkpoint is {ckpt}" if ckpt and ckpt.exists() else "")
                    + ". Lower the learning rate or use float64.",
                    epoch=epoch, history=history,
                    checkpoint=str(ckpt) if ckpt and ckpt.exists() else None)
            held = {}
            if validation is not None:  # part of training: on the clock
                tic = time.perf_counter()
                held = validation.epoch_end(model, epoch)
                clock += time.perf_counter() - tic
            row = {"epoch": epoch, "time_s": clock, "loss": loss,
                   "lr": _base_lr(run.optimizer), **held}
            best.record(loss, epoch, good, good_optimizer)
            reductions = run.scheduler.reductions
            converged = run.converged or run.scheduler.epoch_end(
                epoch, loss, clock, windowed=run.windowed) == "converged"
            if run.scheduler.reductions > reductions or converged:
                best.restore_if_worse(loss, model, run.optimizer, run.scheduler)
            out_of_time = run.out_of_time or (config.max_time is not None
                                              and clock >= config.max_time)
            if out_of_time or epoch == config.epochs:
                best.restore_if_worse(loss, model, run.optimizer, run.scheduler)
            run.interrupted = parallel is None and (run.interrupted or interrupt_requested())
            unimproved = validation is not None and validation.stop
            last = (epoch == config.epochs or out_of_time or converged or run.interrupted
                    or unimproved)
            if last and validation is not None:
                row.update(validation.restore(model) or {})
            _run_callbacks(callbacks, model, epoch, row, final=last)
            history.append(row)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4g}")
            if ckpt is not None and main and (epoch % config.checkpoint_every == 0 or last):
                save_checkpoint(ckpt, model, run, epoch, clock)
            if out_of_time or converged or run.interrupted or unimproved:
                history.stopped = ("interrupted" if run.interrupted else
                                   "converged" if converged else
                                   "no-improvement" if unimproved else "time")
                break
        else:
            history.stopped = "epochs"
    finally:
        bar.close()
        allocator.close()
    return history


def condition_only(model: nn.Module, data: tuple[Tensor, Tensor],
                   callbacks: Sequence[Any] = ()) -> tuple[History, Any]:
    """The "fit" of a method with nothing to train (``model.trainable`` is False).

    Runs ``state = model.condition(x, y)`` once without gradients and records one history row
    (epoch 1, ``time_s`` = the conditioning time, ``loss`` = ``model.loss(state)``); the
    callbacks run once, outside the clock. ``history.stopped`` is ``"conditioned"``.

    Returns:
        (history, state): the state is returned so that callers predict without conditioning
        again.
    """
    x, y = data
    model.eval()
    tic = time.perf_counter()
    with torch.no_grad():
        state = model.condition(x, y)
        loss = float(model.loss(state))
    row = {"epoch": 1, "time_s": time.perf_counter() - tic, "loss": loss, "lr": None}
    if not math.isfinite(loss):
        raise NonFiniteLossError(f"the loss of the conditioned model is {loss}", epoch=1)
    _run_callbacks(callbacks, model, 1, row, final=True)
    history = History()
    history.append(row)
    history.stopped = "conditioned"
    return history, state


def _base_lr(optimizer: torch.optim.Optimizer) -> float:
    """The schedule's rate (a group's rate over its ``lr_scale``)."""
    group = optimizer.param_groups[0]
    return group["lr"] / group.get("lr_scale", 1.0)


def _groups(model: nn.Module, params: list[nn.Parameter]) -> list[dict[str, Any]]:
    """Adam's parameter groups: one per learning-rate factor a method declares
    (:attr:`~gpscale.methods.base.Method.lr_scales`: a parameter-name prefix to a factor on the
    schedule's rate), the rest at 1."""
    scales = model.lr_scales if isinstance(model, Method) else {}
    if not scales:
        return [{"params": params, "lr_scale": 1.0}]
    trainable = {id(p) for p in params}
    groups: dict[float, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if id(p) in trainable:
            scale = next((f for prefix, f in scales.items() if name.startswith(prefix)), 1.0)
            groups.setdefault(float(scale), []).append(p)
    return [{"params": ps, "lr_scale": scale} for scale, ps in sorted(groups.items())]


def _start(model: nn.Module, params: list[nn.Parameter], config: FitConfig,
           num_train: int) -> _Run:
    if config.optimizer == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(_groups(model, params), lr=config.lr)
    else:
        optimizer = torch.optim.LBFGS(params, lr=config.lr, max_iter=config.lbfgs_max_iter,
                                      line_search_fn="strong_wolfe")
    steps = 1 if config.batch_size is None else math.ceil(num_train / config.batch_size)
    scheduler = Schedule(optimizer, config, steps, num_train)
    generator = torch.Generator().manual_seed(config.seed)
    return _Run(optimizer, scheduler, generator, History())


def _epoch_with_back_off(model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor,
                         config: FitConfig, run: _Run, parallel: Any, epoch: int,
                         restore_point: tuple[dict[str, Any], dict[str, Any]]
                         ) -> tuple[float, NumericalError | None, bool]:
    """One epoch; under the plateau schedule a failed epoch (non-finite loss or a numerical
    error) is retried at a lower learning rate, with a warning, until the learning rate would
    fall below its floor. Returns (mean loss, the error that ended it, whether it restarted).

    An epoch's loss is evaluated at the parameters the previous epoch's last step produced, so
    a failure is that step's fault: the retry starts from ``restore_point``, the model and
    optimiser state at the start of the previous epoch (of this epoch for the first one).
    """
    restarted = False
    while True:
        try:
            loss, err = _epoch(model, loss_fn, x, y, config, run, parallel), None
        except NumericalError as error:
            loss, err = math.nan, error
        if math.isfinite(loss) or config.scheduler != "plateau":
            return loss, err, restarted
        old_lr = run.scheduler.lr
        if not run.scheduler.reduce():
            return loss, err, restarted
        restarted = True
        model.load_state_dict(restore_point[0])
        run.optimizer.load_state_dict(restore_point[1])
        run.scheduler.apply()  # the reload brought back the old learning rate
        what = f"a numerical error ({err})" if err is not None else f"a loss of {loss}"
        warnings.warn(f"epoch {epoch} ended in {what} at learning rate {old_lr:.3g}; retrying "
                      f"it from its start at learning rate {run.scheduler.lr:.3g}",
                      RuntimeWarning, stacklevel=3)


def _batches(n: int, batch_size: int | None, generator: torch.Generator) -> Iterator[Tensor | None]:
    if batch_size is None or batch_size >= n:
        yield None
        return
    order = torch.randperm(n, generator=generator)
    yield from order.split(batch_size)


def _epoch(model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, config: FitConfig,
           run: _Run, parallel: Any = None) -> float:
    """One pass over the data; returns the mean loss (NaN/inf as soon as one batch is).

    An epoch longer than the schedule's window (one process only) is judged by the plateau
    test window by window (:mod:`~gpscale.training.schedules`); it ends early when a window
    finds convergence (``run.converged``). Any epoch of one process ends at the step that
    passes the budget's deadline (``run.out_of_time``). The mean is over the steps taken.
    """
    model.train()
    total, count = 0.0, 0
    window = run.scheduler.window if parallel is None else None
    run.windowed, run.converged, run.out_of_time = window is not None, False, False
    w_total, w_count, steps = 0.0, 0, 0
    batches = _batches if parallel is None else parallel.batches
    for idx in batches(x.shape[0], config.batch_size, run.generator):
        xb, yb = (x, y) if idx is None else (x[idx.to(x.device)], y[idx.to(y.device)])
        value = _step(model, loss_fn, xb, yb, config, run.optimizer, parallel)
        if not math.isfinite(value):
            return value
        rows = xb.shape[0] if parallel is None else parallel.step_rows()  # the global batch
        total += value * rows
        count += rows
        if parallel is None and interrupt_requested():  # Ctrl-C: end the epoch at this step
            run.interrupted = True
            break
        # the budget ends the epoch at the step that passes it, not at the next window's end
        # (10^6 rows of SVGP on a loaded machine: the run took 362 s of its 300)
        if run.deadline is not None and time.perf_counter() >= run.deadline:
            run.out_of_time = True
            break
        if window is None:
            continue
        w_total, w_count, steps = w_total + value * rows, w_count + rows, steps + 1
        if steps % window == 0:
            epoch, clock, tic = run.began  # the budget spent so far, for its anneal
            spent = run.scheduler.progress(epoch - 1, clock + time.perf_counter() - tic)
            run.converged = run.scheduler.window_end(w_total / w_count, spent) == "converged"
            w_total, w_count = 0.0, 0
            if run.converged:
                break
    return total / count


def _step(model: nn.Module, loss_fn: LossFn, xb: Tensor, yb: Tensor, config: FitConfig,
          optimizer: torch.optim.Optimizer, parallel: Any = None) -> float:
    first: list[float] = []

    def value_of(loss: Tensor) -> float:
        if parallel is None:
            return float(loss.detach())
        return parallel.reduce_loss(loss.detach(), xb.shape[0])  # every rank sees one value

    def closure() -> Tensor:
        optimizer.zero_grad(set_to_none=True)
        trial = bool(first) and config.optimizer == "lbfgs"  # a line-search point, not the start
        try:
            loss = loss_fn(model, xb, yb)
        except NumericalError:
            if not trial:
                raise
            return _line_search_penalty(first[0])
        value = value_of(loss)
        if not math.isfinite(value):
            if trial:
                return _line_search_penalty(first[0])
            first.append(value)
            return loss
        loss.backward()
        if parallel is not None:
            parallel.reduce_gradients(model, xb.shape[0])
        if config.grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        if not first:
            first.append(value)
        return loss

    if config.optimizer == "lbfgs":
        optimizer.step(closure)
        # L-BFGS evaluates the loss several times; report the value at the new parameters.
        with torch.no_grad():
            return value_of(loss_fn(model, xb, yb)) if math.isfinite(first[0]) else first[0]
    closure()
    if math.isfinite(first[0]):
        optimizer.step()
    return first[0]


def _line_search_penalty(start: float) -> Tensor:
    """The loss L-BFGS's line search sees where the model breaks down (failed Cholesky, NaN).

    Raising would end training at a point the search was only probing, and an infinite or NaN
    value turns the search's cubic interpolation into NaN steps; a large finite value (with zero
    gradient) instead makes it fall back towards the last good step.
    """
    return torch.tensor(start + 1e3 * (abs(start) + 1.0))


def _run_callbacks(callbacks: Sequence[Any], model: nn.Module, epoch: int, row: dict[str, Any],
                   *, final: bool) -> None:
    model.eval()
    for cb in callbacks:
        extra = cb.on_epoch_end(model, epoch, row, final=final)
        if extra:
            row.update(extra)


def _show(config: FitConfig) -> bool:
    if config.progress is not None:
        return config.progress
    return sys.stderr.isatty()
