"""Training checkpoints of ``training.fit``: what is written, and what a resume must match.

A checkpoint holds the model's and optimiser's state, the schedule's, the shuffling generator's,
the history, the epoch and the training time, written atomically as a data-only file
(``gpscale.io.write_file``). It also records what identifies the run (method, optimiser, probe
rows of the training data): a checkpoint written by another run is a ``SavedFileError``, never
silently trained over. ``run`` below is ``training.fit``'s bookkeeping of one call (optimizer,
scheduler, generator, history, start_epoch, time_offset, identity).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from gpscale.errors import SavedFileError
from gpscale.io import read_file, write_file
from gpscale.training.config import FitConfig
from gpscale.training.history import History

__all__ = ["save_checkpoint", "load_checkpoint", "announce_resume", "run_identity"]


def save_checkpoint(path: Path, model: nn.Module, run: Any, epoch: int, clock: float) -> None:
    state = {
        "run": run.identity,
        "epoch": epoch,
        "time_s": clock,
        "model": model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict() if run.scheduler is not None else None,
        "generator": run.generator.get_state(),
        "history": run.history.state_dict(),
    }
    write_file(path, "checkpoint", state)


def load_checkpoint(path: Path, model: nn.Module, run: Any) -> None:
    state = read_file(path, ("checkpoint",))
    _check_checkpoint(path, state, model, run.identity)
    try:
        model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        if run.scheduler is not None and state["scheduler"] is not None:
            run.scheduler.load_state_dict(state["scheduler"])
        run.generator.set_state(state["generator"])
        run.history = History.from_state_dict(state["history"])
        run.start_epoch = int(state["epoch"]) + 1
        run.time_offset = float(state["time_s"])
    except (KeyError, TypeError, AttributeError, ValueError, RuntimeError) as err:
        text = " ".join(str(err).split())[:200]
        raise SavedFileError(path, f"cannot resume from this checkpoint ({text}){_FRESH}") \
            from None


_FRESH = "; delete it, or pass another checkpoint path, to train from the start"


def announce_resume(path: Path, run: Any, config: FitConfig) -> None:
    """Say where a resumed run starts; refuse a budget the checkpoint has already spent."""
    done = run.start_epoch - 1
    if done >= config.epochs:
        raise ValueError(f"{path} already holds {done} epochs of training, as many as the "
                         f"{config.epochs} epochs asked for (--epochs); ask for more epochs "
                         "to train on, or pass another checkpoint path to start afresh")
    if config.max_time is not None and run.time_offset >= config.max_time:
        raise ValueError(f"{path} already holds {run.time_offset:.1f} s of training, past the "
                         f"budget of {config.max_time:g} s (--max-time counts the time before "
                         "the checkpoint); raise it, or pass another checkpoint path")
    budget = f"at most {config.epochs} epochs" + (
        "" if config.max_time is None else f" or {config.max_time:g} s in all")
    logging.getLogger("gpscale.fit").info(
        "resumed at epoch %d from %s (%d epochs, %.1f s trained before; %s)",
        run.start_epoch, path, done, run.time_offset, budget)


def run_identity(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor,
              parallel: Any) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the method (or module class), the optimiser
    and, in one process, the training data's shapes and 16 probe rows (a data-parallel rank
    holds only its shard, so there the data is not compared)."""
    identity: dict[str, Any] = {
        "model": getattr(model, "method_key", None) or type(model).__qualname__,
        "optimizer": type(optimizer).__name__, "data": None}
    if parallel is None:
        n = x.shape[0]
        idx = torch.linspace(0, max(n - 1, 0), min(n, 16)).round().long()
        identity["data"] = {"x_shape": tuple(x.shape), "y_shape": tuple(y.shape),
                            "x": x[idx.to(x.device)].detach().double().cpu(),
                            "y": y[idx.to(y.device)].detach().double().cpu()}
    return identity


def _check_checkpoint(path: Path, state: dict[str, Any], model: nn.Module,
                      identity: dict[str, Any] | None) -> None:
    """Raise SavedFileError when the checkpoint was written by another run."""
    saved, now = state.get("run") or {}, identity or {}
    for key, what in (("model", "method"), ("optimizer", "optimiser")):
        if saved.get(key) is not None and now.get(key) is not None and saved[key] != now[key]:
            raise SavedFileError(path, f"was written by a run with {what} {saved[key]}; this "
                                 f"run uses {now[key]}{_FRESH}")
    theirs, own = state.get("model"), model.state_dict()
    if not isinstance(theirs, dict):
        raise SavedFileError(path, f"holds no model parameters{_FRESH}")
    diffs = [f"{k} missing" for k in own if k not in theirs]
    diffs += [f"unexpected {k}" for k in theirs if k not in own]
    diffs += [f"{k} has shape {_describe(theirs[k])} there, {_describe(own[k])} here"
              for k in own if k in theirs and _describe(theirs[k]) != _describe(own[k])]
    dtypes = {(str(v.dtype), str(own[k].dtype)) for k, v in theirs.items()
              if isinstance(v, Tensor) and k in own and v.dtype != own[k].dtype}
    if dtypes and not diffs:
        there, here = (", ".join(sorted({d[i].replace("torch.", "") for d in dtypes}))
                       for i in (0, 1))
        raise SavedFileError(path, f"was written by a {there} run; this run trains in {here} "
                             f"(--dtype){_FRESH}")
    if diffs:
        raise SavedFileError(path, f"its parameters do not match this model ({'; '.join(diffs[:3])}"
                             f"{'; ...' if len(diffs) > 3 else ''}): written with other method "
                             f"options (-o)?{_FRESH}")
    _check_data(path, saved.get("data"), now.get("data"))


def _check_data(path: Path, saved: dict[str, Any] | None, now: dict[str, Any] | None) -> None:
    if saved is None or now is None:
        return
    if tuple(saved["x_shape"]) != now["x_shape"] or tuple(saved["y_shape"]) != now["y_shape"]:
        raise SavedFileError(path, f"was written for training data of shape "
                             f"{tuple(saved['x_shape'])}; this run's is {now['x_shape']} "
                             f"(another data set or split?){_FRESH}")
    close = all(torch.allclose(saved[k], now[k], rtol=1e-5, atol=1e-6, equal_nan=True)
                for k in ("x", "y"))
    if not close:
        raise SavedFileError(path, "was written for other training data of the same shape "
                             f"(another data set, split or seed?){_FRESH}")


def _describe(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, Tensor) else type(value).__name__
