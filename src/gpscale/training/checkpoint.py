"""Training checkpoints of ``training.fit``: what is written, and what a resume must match.

A checkpoint holds the model's and optimiser's state, the schedule's, the shuffling generator's,
the history, the epoch and the training time, written atomically as a data-only file
(``gpscale.io.write_file``). It also records what identifies the run (:func:`run_identity`:
method and options, optimiser, preset and training settings, probe rows of the training data):
a checkpoint written by another run, or by this one with a setting changed, is a
``SavedFileError`` naming the change, never silently trained over. Only the budget (``epochs``,
``max_time``) may change on resume. ``run`` below is ``training.fit``'s bookkeeping of one call
(optimizer, scheduler, generator, history, start_epoch, time_offset, identity).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from gpscale.errors import SavedFileError
from gpscale.io import read_file, write_file
from gpscale.training.config import PRESETS, FitConfig
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


def announce_resume(path: Path, run: Any, config: FitConfig, main: bool = True) -> None:
    """Say where a resumed run starts (on the main rank); refuse a budget the checkpoint has
    already spent (on every rank)."""
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
    if main:
        logging.getLogger("gpscale.fit").info(
            "resumed at epoch %d from %s (%d epochs, %.1f s trained before; %s)",
            run.start_epoch, path, done, run.time_offset, budget)


def run_identity(model: nn.Module, optimizer: torch.optim.Optimizer, config: FitConfig,
                 x: Tensor, y: Tensor, parallel: Any) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: everything that shapes the result but the
    budget (``epochs``, ``max_time``: a resume may extend or shorten it).

    That is the method key (or module class), its options, the optimiser, the preset the
    training settings come from, the settings themselves (seed, batch size, learning rate,
    schedule, dtype, ...) and the training data: its shapes and 16 probe rows spread over it. A
    data-parallel rank holds only its shard, so there the probe rows are gathered from the
    ranks (``parallel.global_rows``, a collective): the same rows one process would probe.
    """
    key = getattr(model, "method_key", None)
    options = getattr(model, "options", None) if key is not None else None
    if parallel is None:
        n = x.shape[0]
        idx = _probe_index(n)
        probe = (x[idx.to(x.device)].detach().double().cpu(),
                 y[idx.to(y.device)].detach().double().cpu())
    else:
        n = parallel.num_points
        idx = _probe_index(n)
        probe = tuple(parallel.global_rows(t.detach().double(), idx.to(t.device)).cpu()
                      for t in (x, y))
    return {
        "model": key or type(model).__qualname__, "optimizer": type(optimizer).__name__,
        "options": None if options is None else dict(options),
        "preset": _preset(key, config),
        "settings": {name: getattr(config, name) for name in _SETTINGS},
        "data": {"x_shape": (n, *x.shape[1:]), "y_shape": (n, *y.shape[1:]),
                 "x": probe[0], "y": probe[1]},
    }


# The training settings a resume must match (FitConfig field: what it is, the flag setting it).
# The budget (epochs, max_time) is left out on purpose, as is what only shows or evaluates.
_SETTINGS: dict[str, tuple[str, str | None]] = {
    "seed": ("seed", "--seed"), "batch_size": ("batch size", "--batch-size"),
    "lr": ("learning rate", "--lr"), "optimizer": ("optimiser", "--optimizer"),
    "scheduler": ("schedule", "--scheduler"), "dtype": ("dtype", "--dtype"),
    **{name: (name, None) for name in (
        "lr_end_factor", "patience", "min_delta", "plateau_factor", "noise_plateau",
        "budget_anneal", "lbfgs_max_iter", "grad_clip")},
}
# The settings only a preset chooses (no flag of their own): they tell which preset a run used.
_PRESET_FIELDS = tuple(name for name, (_, flag) in _SETTINGS.items() if flag is None)


def _probe_index(n: int) -> Tensor:
    return torch.linspace(0, max(n - 1, 0), min(n, 16)).round().long()


def _preset(key: str | None, config: FitConfig) -> str | None:
    """The preset (``--preset``) whose settings for method ``key`` ``config`` follows, or
    ``None`` for settings of no preset's (a ``FitConfig`` of the caller's own)."""
    for name, table in PRESETS.items():
        base = table.get(key or "", FitConfig())
        if all(getattr(config, f) == getattr(base, f) for f in _PRESET_FIELDS):
            return name
    return None


def _check_checkpoint(path: Path, state: dict[str, Any], model: nn.Module,
                      identity: dict[str, Any] | None) -> None:
    """Raise SavedFileError when the checkpoint was written by another run. What a checkpoint
    of an earlier version did not record is not compared."""
    saved, now = state.get("run") or {}, identity or {}
    for key, what, flag in (("model", "method", None), ("preset", "preset", "--preset"),
                            ("optimizer", "optimiser", "--optimizer")):
        if saved.get(key) is not None and now.get(key) is not None and saved[key] != now[key]:
            raise _changed(path, f"{what} {saved[key]}",
                           str(now[key]) + ("" if flag is None else f" ({flag})"),
                           None if flag is None else f"{flag} {str(saved[key]).lower()}")
    _check_settings(path, saved.get("settings") or {}, now.get("settings") or {})
    # the data before the options: a method's options hold start values it takes from the
    # data (the mean and variance of y, n), which other data changes too
    _check_data(path, saved.get("data"), now.get("data"))
    _check_options(path, saved.get("options"), now.get("options"))
    _check_parameters(path, state.get("model"), model)


def _changed(path: Path, was: str, now: str, again: str | None) -> SavedFileError:
    """The one-line error for a setting that differs from the checkpoint's run."""
    keep = "" if again is None else f"pass {again} to continue it, or "
    return SavedFileError(path, f"was written by a run with {was}; this run uses {now}: {keep}"
                                "delete it or pass another checkpoint path to train from the "
                                "start")


def _check_settings(path: Path, saved: dict[str, Any], now: dict[str, Any]) -> None:
    for name, (what, flag) in _SETTINGS.items():
        if name not in saved or name not in now or _same(saved[name], now[name]):
            continue
        old, new = (_setting_text(name, v) for v in (saved[name], now[name]))
        again = None if flag is None or saved[name] is None else f"{flag} {old}"
        raise _changed(path, f"{what} {old}", new + ("" if flag is None else f" ({flag})"),
                       again)


def _check_options(path: Path, saved: Any, now: Any) -> None:
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return
    for key in sorted(set(saved) & set(now)):
        if not _same(saved[key], now[key]):
            old, new = (f"-o {key}={_option_text(v)}" for v in (saved[key], now[key]))
            raise _changed(path, old, new, old)


def _check_parameters(path: Path, theirs: Any, model: nn.Module) -> None:
    own = model.state_dict()
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


def _check_data(path: Path, saved: dict[str, Any] | None, now: dict[str, Any] | None) -> None:
    if saved is None or now is None:
        return
    if tuple(saved["x_shape"]) != tuple(now["x_shape"]) or \
            tuple(saved["y_shape"]) != tuple(now["y_shape"]):
        raise SavedFileError(path, f"was written for training data of shape "
                             f"{tuple(saved['x_shape'])}; this run's is {tuple(now['x_shape'])} "
                             f"(another data set or split?){_FRESH}")
    close = all(torch.allclose(saved[k], now[k], rtol=1e-5, atol=1e-6, equal_nan=True)
                for k in ("x", "y"))
    if not close:
        raise SavedFileError(path, "was written for other training data of the same shape "
                             f"(another data set, split or seed?){_FRESH}")


def _same(a: Any, b: Any) -> bool:
    """Equal settings or option values; numbers to a relative 1e-4 or an absolute 1e-9: a
    start value computed again from the data on resume (a pre-fit's lengthscale, the mean of
    standardised targets, near 0) may differ in its last digits, e.g. with another thread
    count."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if _is_number(a) and _is_number(b):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-4,
                                                                 abs_tol=1e-9)
    return type(a) is type(b) and a == b


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _setting_text(name: str, value: Any) -> str:
    if name == "batch_size" and value is None:
        return "full batch"
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _option_text(value: Any) -> str:
    """A value as ``-o KEY=VALUE`` takes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.8g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_option_text(v) for v in value) + "]"  # one shell word
    return str(value)


def _describe(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, Tensor) else type(value).__name__
