"""Learning-rate schedules and the convergence test of ``training.fit``.

A :class:`Schedule` sets the optimiser's learning rate after every epoch and says when training
has converged. Kinds (``FitConfig.scheduler``):

``none``     constant learning rate.
``linear``   PyTorch's ``LinearLR`` over ``epochs``: lr → lr · ``lr_end_factor`` (the CaGP
             paper's schedule, Table S1; unchanged by a time budget).
``budget``   linear decay over the run's budget, whichever of epochs and ``max_time`` runs out
             first: lr · (1 − (1 − end) · p) with p = max(epoch / epochs, time / max_time).
``plateau``  the default of every method: the learning rate is multiplied by
             ``plateau_factor`` whenever the epoch loss has not improved for ``patience``
             optimiser steps, and training has converged when it would fall below
             lr · ``lr_end_factor``. It needs no epoch count: the budget only bounds the run,
             and, for a minibatch run, anneals it (below). Deterministic for a seed unless the
             time budget binds (only the anneal reads the clock).

Improvement means a loss below ``best − min_delta · max(1, |best|)`` (per-datum losses, so
``min_delta`` is a relative tolerance for large losses and an absolute one near zero).
``patience`` counts optimiser steps and is rounded up to whole epochs (at least 2), so one
setting serves full-batch methods (one step an epoch) and minibatch methods (n / batch steps).
With a ``patience`` and a schedule other than ``plateau``, a plateau stops training.

An epoch of more than :data:`WINDOW_STEPS` minibatch steps is judged in *windows* of that many
steps instead (the mean loss of each window against the best window's, patience rounded up to
whole windows), so the learning rate can fall and training can converge within an epoch: on
millions of rows an epoch takes minutes, and a test made once per epoch held SVGP at its initial
learning rate for its whole budget, well above the noise floor.
The training loop then also checks its time budget after every window.

**The loss's noise** (``FitConfig.noise_plateau``, on in every method's defaults; full-batch
runs only). The training loss per datum is a mean over n points, so as an estimate of the loss
on new data it has a standard error of about sd/√n; for a Gaussian negative log-likelihood,
ℓᵢ = ½ log 2πσ² + ½ zᵢ², sd(½ zᵢ²) = 1/√2. An improvement below :data:`LOSS_SD` / √n
(0.010 at n = 5,000, 0.0035 at 41,000) is within that noise and counts as none. And a plateau
reached while the loss kept falling steadily — its rises over the patience window sum to less
than the margin — is a converged run, not a step size too large for the landscape: a smaller
rate only slows the same descent. It ends the run instead of lowering the rate; a plateau with
oscillations (Adam at a high rate) lowers the rate as before. Without it CaGP-Opt's defaults
(lr 1.0, which never fell within the budget) spent much of their budget on test NLL gains of a
few hundredths or less (BENCHMARKS "Stopping on the loss's noise").

**The budget's anneal** (``FitConfig.budget_anneal``, on in every method's defaults; minibatch
runs only). A minibatch run's test error at a fixed learning rate levels off at the gradient
noise that rate admits, while its loss keeps creeping down (the hyperparameters still drift), so
its plateaus can come late: SVGP on millions of rows at a GPU's batch spent many epochs at its
starting rate while its test error crept down, then gained more in its first epoch at a lower
rate than in all of them.
A budget that ends such a run before its plateaus do leaves it at the starting rate's noise.
So by :data:`ANNEAL_AT` (50, 75 and 90 %) of its budget — whichever of ``epochs`` and
``max_time`` runs out first — the rate has been lowered by ``plateau_factor`` at least once,
twice and three times (never below lr · ``lr_end_factor``); a run whose plateaus came earlier
is unchanged. Full-batch runs have no gradient noise to anneal (and keep their best epoch).

Full-batch runs under ``plateau`` keep the best epoch's state (:class:`BestEpoch`) and return to
it when the learning rate is lowered or training ends at a loss worse than the best.
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

import torch

log = logging.getLogger("gpscale.training")

__all__ = ["ANNEAL_AT", "BestEpoch", "LOSS_SD", "Schedule", "patience_epochs", "WINDOW_STEPS"]

WINDOW_STEPS = 200
"""Longest epoch (in optimiser steps) the plateau test judges as a whole; longer ones in windows."""

LOSS_SD = 1 / math.sqrt(2)
"""Spread of a per-datum loss (the sd of ½ z² for a standard normal z): the noise floor of a
full-batch loss over n points is ``LOSS_SD / √n`` (module docstring)."""


ANNEAL_AT = (0.5, 0.75, 0.9)
"""Fractions of a minibatch run's budget by which the plateau schedule has lowered its learning
rate at least once, twice and three times (``FitConfig.budget_anneal``; module docstring)."""


def patience_epochs(patience_steps: int, steps_per_epoch: int) -> int:
    """``patience_steps`` optimiser steps in whole epochs, at least 2."""
    return max(2, math.ceil(patience_steps / max(1, steps_per_epoch)))


class Schedule:
    """Learning rate per epoch and the convergence test (see the module docstring).

    Args:
        optimizer: its parameter groups' ``lr`` is set here.
        config: a ``FitConfig`` (scheduler, lr, lr_end_factor, epochs, max_time, patience,
            min_delta, plateau_factor).
        steps_per_epoch: optimiser steps in one epoch (for ``patience``).
        num_train: training points, for the noise floor of a full-batch loss
            (``config.noise_plateau``); ``None``: no floor.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, config: Any, steps_per_epoch: int,
                 num_train: int | None = None):
        self.optimizer = optimizer
        self.kind = config.scheduler
        self.lr0 = float(config.lr)
        self.end = float(config.lr_end_factor)
        self.epochs = int(config.epochs)
        self.max_time = config.max_time
        self.factor = float(config.plateau_factor)
        self.min_delta = float(config.min_delta)
        # longer epochs are judged in windows of WINDOW_STEPS steps (module docstring)
        self.window = WINDOW_STEPS if steps_per_epoch > WINDOW_STEPS else None
        self.patience = (None if config.patience is None
                         else patience_epochs(config.patience,
                                              self.window or steps_per_epoch))
        # the loss's own noise (module docstring): full batch, one step an epoch, only
        self.noisy = bool(getattr(config, "noise_plateau", False)) and steps_per_epoch == 1
        self.floor = (LOSS_SD / math.sqrt(num_train)
                      if self.noisy and num_train and self.patience is not None else 0.0)
        # the budget's anneal (module docstring): minibatch runs under "plateau" only
        self.anneals = (bool(getattr(config, "budget_anneal", False)) and self.kind == "plateau"
                        and steps_per_epoch > 1)
        self.lr = self.lr0
        self.best = math.inf
        self.waited = 0
        self.reductions = 0
        self.recent: list[float] = []  # the losses of the patience window (noise_plateau)
        self.steady = False  # the last plateau came in a steady descent
        self.apply()  # each group at its scale of the rate

    def epoch_end(self, epoch: int, loss: float, clock: float, *,
                  windowed: bool = False) -> str | None:
        """Record epoch ``epoch``'s mean loss at training time ``clock``; set the next learning
        rate. Returns ``"converged"`` when training should stop, else ``None``. ``windowed``:
        the plateau test already ran on this epoch's windows (:meth:`window_end`)."""
        stop = None if windowed else self._plateau(loss)
        if stop is None:
            self.anneal(self.progress(epoch, clock))
        if self.kind == "linear":
            progress = min(1.0, epoch / self.epochs)
            self.lr = self.lr0 * (1.0 - (1.0 - self.end) * progress)
        elif self.kind == "budget":
            progress = epoch / self.epochs
            if self.max_time is not None:
                progress = max(progress, clock / self.max_time)
            self.lr = self.lr0 * (1.0 - (1.0 - self.end) * min(1.0, progress))
        self.apply()
        return stop

    def window_end(self, loss: float, progress: float = 0.0) -> str | None:
        """The plateau test on the mean loss of one window of an epoch; ``"converged"`` or
        ``None``, the learning rate lowered as in :meth:`epoch_end` (``progress``: the budget's
        fraction spent, :meth:`progress`)."""
        stop = self._plateau(loss)
        if stop is None:
            self.anneal(progress)
        self.apply()
        return stop

    def progress(self, epoch: float, clock: float) -> float:
        """The fraction of the budget spent after ``epoch`` epochs and ``clock`` seconds of
        training: whichever of the epoch count and the time budget runs out first."""
        done = epoch / self.epochs
        if self.max_time is not None:
            done = max(done, clock / self.max_time)
        return done

    def anneal(self, progress: float) -> bool:
        """The budget's anneal (module docstring): lower the learning rate to at most
        lr · ``plateau_factor``^k, k the fractions of :data:`ANNEAL_AT` that ``progress`` has
        passed. Returns whether it lowered the rate."""
        if not self.anneals:
            return False
        target = self.lr0 * self.factor ** sum(progress >= at for at in ANNEAL_AT)
        old, lowered = self.lr, False
        while self.lr > target * (1 + 1e-9) and self.reduce():
            lowered = True
        if lowered:
            self.waited = 0  # a new rate: its plateau is judged afresh
            log.info("%.0f%% of the budget spent: learning rate %.3g lowered to %.3g",
                     100 * progress, old, self.lr)
        return lowered

    def margin(self) -> float:
        """The improvement on the best loss that counts: ``min_delta`` relative (absolute below
        1), at least the noise floor of a full-batch loss."""
        return max(self.min_delta * max(1.0, abs(self.best)), self.floor)

    def _plateau(self, loss: float) -> str | None:
        if self.patience is None:
            return None
        margin = self.margin()
        if self.noisy:
            self.recent = (self.recent + [loss])[-(self.patience + 1):]
        if math.isinf(self.best) or loss < self.best - margin:
            self.best, self.waited = loss, 0
        else:
            self.waited += 1
        if self.waited >= self.patience:
            self.waited = 0
            self.steady = self.noisy and self._rises() < margin
            if self.steady:
                log.info("the loss fell steadily by less than %.3g over %d epochs: converged",
                         margin, self.patience)
            if self.steady or self.kind != "plateau" or not self.reduce():
                return "converged"
        return None

    def _rises(self) -> float:
        """The sum of the loss's rises from epoch to epoch over the patience window."""
        return sum(max(0.0, b - a) for a, b in itertools.pairwise(self.recent))

    def reduce(self) -> bool:
        """Multiply the learning rate by ``plateau_factor``; ``False`` (unchanged) once it would
        fall below lr · ``lr_end_factor``. Also used to back off after a failed epoch."""
        smaller = self.lr * self.factor
        if smaller < self.lr0 * self.end * (1 - 1e-9):
            return False
        self.lr = smaller
        self.reductions += 1
        self.apply()
        return True

    def apply(self) -> None:
        """Set each parameter group's learning rate to the schedule's times the group's
        ``lr_scale`` (at the start, after each change and after an optimiser reload)."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * group.get("lr_scale", 1.0)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "lr": self.lr, "best": self.best, "waited": self.waited,
                "reductions": self.reductions, "recent": list(self.recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"the checkpoint was written with scheduler {state.get('kind')!r}, "
                             f"this run uses {self.kind!r}")
        self.lr, self.best = float(state["lr"]), float(state["best"])
        self.waited, self.reductions = int(state["waited"]), int(state["reductions"])
        self.recent = [float(v) for v in state.get("recent", [])]  # absent in older files
        self.apply()


class BestEpoch:
    """The best full-batch epoch so far, restored when the schedule lowers the learning rate or
    training ends at a loss worse than it (plateau schedule, one step per epoch only).

    With one step per epoch the epoch's loss is the loss of the parameters it started from, so
    the best epoch's starting state is exactly the best point seen. Adam can climb out of a good
    region at a large learning rate: GGP on a large 3-D field reached a good loss, climbed out of
    it, and the plateau schedule, lowering the rate from there, "converged" at a far worse one
    (about twice the test error of the good region). Minibatch epoch losses are means
    over a moving trajectory with sampling noise, so minibatch runs are left as they are.
    """

    def __init__(self, config: Any, num_train: int):
        full_batch = config.batch_size is None or config.batch_size >= num_train
        self.active = config.scheduler == "plateau" and full_batch
        self.margin = float(config.min_delta)
        self.loss, self.epoch, self.state = math.inf, 0, None

    def record(self, loss: float, epoch: int, model_state: dict[str, Any],
               optimizer_state: dict[str, Any]) -> None:
        if self.active and loss < self.loss:
            self.loss, self.epoch, self.state = loss, epoch, (model_state, optimizer_state)

    def restore_if_worse(self, loss: float, model: torch.nn.Module,
                         optimizer: torch.optim.Optimizer, schedule: Schedule) -> None:
        """Reload the best epoch's model and optimiser state if ``loss`` is worse than its
        by more than ``min_delta`` (relative); the schedule's learning rate is kept."""
        if not self.active or self.state is None:
            return
        if loss <= self.loss + self.margin * max(1.0, abs(self.loss)):
            return
        model.load_state_dict(self.state[0])
        optimizer.load_state_dict(self.state[1])
        schedule.apply()  # keep the schedule's (lowered) learning rate
        log.info("loss %.6g is worse than epoch %d's %.6g: its parameters restored",
                 loss, self.epoch, self.loss)
