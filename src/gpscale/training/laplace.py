"""Kernel learning for IterNCGP: Newton/IterGP steps alternating with hyperparameter steps.

The objective is the computation-aware Laplace evidence of
:mod:`gpscale.methods.iterncgp.evidence` (derivation: ``docs/iterncgp_evidence.md``). One
round (:class:`~gpscale.methods.iterncgp.evidence.KernelLearning`):

1. fix the current iterate f̂, W(f̂) and IterGP's buffered actions;
2. maximise the evidence over the kernel hyperparameters with L-BFGS (a few iterations; two
   parameters for the default shared, isotropic kernel);
3. restart Newton from the previous representer weights and actions under the new kernel
   (f = m + K v and T = K S recomputed in one product; the actions are recycled as in Alg. 3).

Rounds stop when the raw hyperparameters move by less than the tolerance, or when a round's
starting evidence gained less than the noise of a per-datum evidence over the rounds' n points
(``LOSS_SD`` / √n, as full-batch training's plateaus, :mod:`gpscale.training.schedules`); the
last round conditions from scratch, so the returned state is exactly ``model.condition(x, y)``
for the learned kernel (a reloaded model predicts the same). Each round is one history row with the
evidence, the hyperparameters and the Newton steps it took.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gpscale.errors import ConvergenceWarning, NumericalError
from gpscale.kernels import kernel_hyperparameters
from gpscale.training.config import FitConfig
from gpscale.training.fit import _run_callbacks
from gpscale.training.history import History
from gpscale.training.schedules import LOSS_SD

__all__ = ["IMPROVEMENT_TOL", "learn_kernel", "learning_subset"]

IMPROVEMENT_TOL = 1e-4
"""A round whose starting evidence (per datum) is below the best earlier one by more than this
undoes the previous step and stops: the alternation never ends at a worse evidence."""

log = logging.getLogger("gpscale.training")


def learn_kernel(model, data: tuple[Tensor, Tensor], config: FitConfig,
                 callbacks: Sequence[Any] = ()) -> tuple[History, Any]:
    """Learn ``model``'s kernel (an IterNCGP with ``learns_kernel``) on ``data``.

    Args:
        model: the method; its ``kernel_learning`` says how many rounds and steps.
        data: (x, y) training data.
        config: ``max_time`` bounds the rounds (the final conditioning runs after it).
        callbacks: run after each round, outside the clock (``on_epoch_end``).

    Returns:
        (history, state): one row per round (``loss`` = −log Ẑ/n at the round's start, i.e. at
        the mode of its hyperparameters — for the variational objective the ELBO of the
        round's posterior with all its actions, ``problem.reference``; ``stepped_evidence``
        after its step with the iterate fixed; ``lengthscale``, ``outputscale``,
        ``newton_steps``, ``actions``);
        ``history.stopped`` is ``"converged"``, ``"no-improvement"`` (the evidence at the new
        mode fell: the previous hyperparameters are restored), ``"epochs"`` (all rounds ran),
        ``"time"`` or ``"non-finite"``.

    Warns:
        RuntimeWarning: when a round's evidence is not finite; the hyperparameters before that
            round are kept (``history.stopped == "non-finite"``) and their state returned.
    """
    plan = model.kernel_learning
    points = plan.points_for(data[0].shape[0], model.likelihood.num_latents)
    x, y = learning_subset(data, points, config.seed)
    params = [p for p in model.kernel.parameters()]
    history = History()
    model.eval()
    tic = time.perf_counter()
    state = _newton(model, x, y, None, cold=True, final=False)
    best: tuple[float, list[Tensor]] | None = None  # (evidence at a round's start, its θ)
    noise = LOSS_SD / math.sqrt(x.shape[0])  # of a per-datum evidence over the rounds' points
    previous = math.nan  # the last round's starting loss
    for r in range(plan.rounds):
        problem = model.evidence_problem(state)
        before = [p.detach().clone() for p in params]
        reference = problem.reference  # the ELBO of the round's actual posterior, if known
        if reference is not None and math.isfinite(reference) and previous + reference < noise:
            start = loss = -reference  # settled before another step: θ stays (change 0)
        else:
            start, loss = _hyperparameter_step(model, problem, params, plan.steps)
            if reference is not None and math.isfinite(start):
                start = -reference
        stopped = None
        if best is not None and math.isfinite(start) and -start < best[0] - IMPROVEMENT_TOL:
            _restore(params, best[1])  # the last step lowered the evidence at the new mode
            stopped = "no-improvement"
        elif not (math.isfinite(start) and math.isfinite(loss)):
            _restore(params, before)
            warnings.warn(f"IterNCGP kernel learning: the Laplace evidence became "
                          f"{loss if math.isfinite(start) else start} in round {r + 1}; the "
                          "hyperparameters before that round are kept", RuntimeWarning,
                          stacklevel=2)
            stopped = "non-finite"
        else:
            best = (-start, before)
        change = max(float(((p.detach() - old).abs() / old.abs().clamp_min(1.0)).max())
                     for p, old in zip(params, before, strict=True))
        out_of_time = config.max_time is not None and time.perf_counter() - tic >= config.max_time
        if stopped is None and (change <= plan.rtol or previous - start < noise):
            stopped = "converged"  # θ settled, or the evidence gained less than its noise
        elif stopped is None and (r + 1 == plan.rounds or out_of_time):
            stopped = "time" if out_of_time else "epochs"
        previous = start
        try:  # the last round conditions on all the data, from scratch
            state = _newton(model, *(data if stopped else (x, y)), state,
                            cold=stopped is not None, problem=problem)
        except NumericalError as error:  # the new θ breaks Newton even from scratch
            _restore(params, before)
            warnings.warn(f"IterNCGP kernel learning: Newton failed under the hyperparameters "
                          f"of round {r + 1} ({error}); the hyperparameters before that round "
                          "are kept", RuntimeWarning, stacklevel=2)
            stopped = "non-finite"
            state = _newton(model, *data, state, cold=True)
        row = {"epoch": r + 1, "time_s": time.perf_counter() - tic, "loss": start, "lr": None,
               "log_evidence": -start, "stepped_evidence": -loss, "change": change,
               "newton_steps": len(state.trace), "actions": problem.num_actions,
               "points": x.shape[0], **_hyperparameters(model)}
        log.info("IterNCGP kernel round %d: log Z/n %.5g at its start, %.5g after the step "
                 "(iterate fixed), change %.3g%s, %s", r + 1, -start, -loss, change,
                 "" if stopped is None else f", stopped: {stopped}",
                 {k: row[k] for k in ("lengthscale", "outputscale") if k in row})
        _run_callbacks(callbacks, model, r + 1, row, final=stopped is not None)
        history.append(row)
        if stopped is not None:
            history.stopped = stopped
            break
    return history, state


def learning_subset(data: tuple[Tensor, Tensor], points: int,
                    seed: int = 0) -> tuple[Tensor, Tensor]:
    """The training points the kernel rounds see: all of ``data`` when ``points`` is at least
    n, ``points`` of them drawn at random (seeded) otherwise (the model's
    ``kernel_learning.points_for`` says how many)."""
    x, y = data
    n = x.shape[0]
    if points >= n:
        return x, y
    keep = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:points]
    keep = keep.sort().values.to(x.device)
    return x[keep], y[keep]


def _newton(model, x: Tensor, y: Tensor, state, *, cold: bool, problem=None,
            final: bool | None = None):
    """Newton under the current kernel: from scratch (``cold``: the state a reload gives), else
    warm-started from ``state``, falling back to a cold start if the warm one diverges (a large
    hyperparameter step can make f = m + K v overflow the likelihood). A variational model
    restarts from the round's sites (``problem.likelihood``), without Laplace steps. Only the
    ``final`` state (default: a cold one) warns when its iterations did not converge."""
    with torch.no_grad(), warnings.catch_warnings():
        if not (cold if final is None else final):
            warnings.simplefilter("ignore", ConvergenceWarning)  # a round's state is replaced
        if not cold:
            try:
                return model.warm_condition(state, getattr(problem, "likelihood", None))
            except NumericalError as error:
                log.info("IterNCGP warm start failed (%s); conditioning from scratch", error)
        return model.condition(x, y)


def _restore(params: list[Tensor], values: list[Tensor]) -> None:
    with torch.no_grad():
        for p, value in zip(params, values, strict=True):
            p.copy_(value)


def _hyperparameter_step(model, problem, params: list[Tensor], steps: int
                         ) -> tuple[float, float]:
    """L-BFGS on −log Ẑ/n with the problem fixed; returns the loss before and after the step
    (NaN where it failed)."""
    optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=steps, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-7, tolerance_change=1e-9)

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = -_objective(model, problem)
        if loss.requires_grad:
            loss.backward()
        return loss

    model.kernel.requires_grad_(True)
    start = loss = float("nan")
    try:
        start = float(optimizer.step(closure).detach())
        with torch.no_grad():
            loss = float(-_objective(model, problem))
    except RuntimeError as error:  # e.g. a non-finite Cholesky on a wild line-search trial
        log.warning("IterNCGP kernel step failed: %s", error)
    finally:
        model.kernel.requires_grad_(False)
        optimizer.zero_grad(set_to_none=True)
    return start, loss


def _objective(model, problem) -> Tensor:
    """The value a round maximises (``model.learning_objective``)."""
    return model.learning_objective(problem)


def _hyperparameters(model) -> dict[str, Any]:
    """The kernel's lengthscale(s) and outputscale(s) as plain numbers (or lists)."""
    hp = kernel_hyperparameters(model.kernel)
    if hp is None:
        return {}

    def plain(t: Tensor) -> Any:
        t = t.detach().reshape(-1)
        return float(t[0]) if t.numel() == 1 else t.tolist()

    return {"lengthscale": plain(hp.lengthscale), "outputscale": plain(hp.outputscale)}
