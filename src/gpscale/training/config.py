"""Training configuration: a frozen dataclass validated on construction, and each method's
defaults as one (:data:`METHOD_DEFAULTS`), read from what its family declares
(``MethodSpec.training_defaults``)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from gpscale.devices import minibatch_size
from gpscale.methods.registry import DEFAULT_BUDGET_S, METHODS

__all__ = ["FitConfig", "OPTIMIZERS", "SCHEDULERS", "DTYPES", "METHOD_DEFAULTS", "PAPER_DEFAULTS",
           "PRESETS", "OPTIMUM_DEFAULTS", "DEFAULT_BUDGET_S", "MAX_LR", "PresetDefaults",
           "default_fit_config", "resolve_fit_config"]

OPTIMIZERS = ("adam", "lbfgs")
SCHEDULERS = ("plateau", "linear", "budget", "none")
DTYPES = ("float32", "float64")
MAX_LR = 10.0
"""The largest learning rate accepted: ten times the largest default (L-BFGS and CaGP-Opt start
at 1.0). Adam moves each raw (unconstrained) hyperparameter by about ``lr`` per step, so a
larger rate leaves no trace of the initial values after one step."""


@dataclass(frozen=True)
class FitConfig:
    """How ``training.fit`` optimises a model.

    Attributes:
        optimizer: ``"adam"`` (float32 or float64, minibatches allowed) or ``"lbfgs"`` (full batch,
            strong-Wolfe line search, one optimiser step per epoch).
        lr: initial learning rate, in (0, :data:`MAX_LR`].
        epochs: maximum number of epochs (passes over the data); ≥ 1.
        batch_size: minibatch size; ``None`` trains on the full data every step.
        max_time: wall-clock budget in seconds for training (evaluation excluded); ``None`` = none.
        scheduler: ``"plateau"`` multiplies the learning rate by ``plateau_factor`` when the loss
            stops improving and stops when it would fall below ``lr * lr_end_factor``;
            ``"linear"`` decays it linearly to ``lr * lr_end_factor`` over ``epochs`` (PyTorch
            ``LinearLR``, as CaGP's Table S1); ``"budget"`` decays it linearly over whichever of
            ``epochs`` and ``max_time`` runs out first; ``"none"`` keeps it constant (see
            :mod:`gpscale.training.schedules`).
        lr_end_factor: final fraction of the learning rate, in (0, 1].
        eval_every: evaluation callbacks run every this many epochs (and after the last).
        seed: seeds minibatch shuffling (and, in estimators and the CLI, initialisation).
        checkpoint: path of a checkpoint file written every ``checkpoint_every`` epochs; with
            ``resume`` a run finds it and continues where it stopped.
        checkpoint_every: epochs between checkpoints (≥ 1).
        resume: continue from ``checkpoint`` when that file exists.
        progress: show a tqdm bar; ``None`` shows it only when stderr is a terminal.
        lbfgs_max_iter: L-BFGS iterations inside one epoch's ``step``.
        grad_clip: clip the gradient norm to this value; ``None`` = no clipping.
        patience: optimiser steps without an improvement of the epoch loss (by ``min_delta``)
            before the plateau schedule lowers the learning rate, or any other schedule stops;
            ``None``: never (required by ``"plateau"``).
        min_delta: relative improvement that counts (absolute for losses below 1 in size).
        plateau_factor: learning-rate factor of a plateau, in (0, 1); also the back-off factor
            after a failed epoch (non-finite loss, failed Cholesky) under ``"plateau"``.
        noise_plateau: judge a full-batch run's plateaus against the loss's own noise
            (:mod:`gpscale.training.schedules`): an improvement below the standard error of a
            per-datum loss over n points (0.71/√n) counts as none, and a plateau reached in a
            steady descent ends the run instead of lowering the learning rate. Minibatch runs
            ignore it.
        budget_anneal: a minibatch run under ``"plateau"`` lowers its learning rate by
            ``plateau_factor`` at 50, 75 and 90 % of its budget (whichever of ``epochs`` and
            ``max_time`` runs out first) if its plateaus have not lowered it that far
            (:mod:`gpscale.training.schedules`). Full-batch runs ignore it.
        dtype: ``"float32"`` or ``"float64"``, the precision the harness trains the model and
            its data in (``training.fit`` itself follows the model's).
        device: where the harness trains and predicts: ``"cpu"`` (default), ``"cuda"``,
            ``"cuda:N"``, or ``"auto"`` (CUDA when torch sees a GPU, else the CPU). Saved models
            load on the CPU.
    """

    optimizer: str = "adam"
    lr: float = 0.01
    epochs: int = 50
    batch_size: int | None = None
    max_time: float | None = None
    scheduler: str = "none"
    lr_end_factor: float = 0.1
    eval_every: int = 1
    seed: int = 0
    checkpoint: str | None = None
    checkpoint_every: int = 1
    resume: bool = True
    progress: bool | None = None
    lbfgs_max_iter: int = 20
    grad_clip: float | None = None
    dtype: str = "float64"
    patience: int | None = None
    min_delta: float = 1e-3
    plateau_factor: float = 0.3
    noise_plateau: bool = False
    budget_anneal: bool = False
    device: str = "cpu"

    def __post_init__(self):
        _ = self.torch_device  # validates the device name and that torch can reach it
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}; got {self.dtype!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}; got {self.optimizer!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}; got {self.scheduler!r}")
        _positive("lr", self.lr, finite=True)
        if self.lr > MAX_LR:
            raise ValueError(f"lr must be at most {MAX_LR:g}; got {self.lr!r}")
        _positive_int("epochs", self.epochs)
        _positive_int("eval_every", self.eval_every)
        _positive_int("checkpoint_every", self.checkpoint_every)
        _positive_int("lbfgs_max_iter", self.lbfgs_max_iter)
        if self.batch_size is not None:
            _positive_int("batch_size", self.batch_size)
            if self.optimizer == "lbfgs":
                raise ValueError("L-BFGS trains on the full batch; use batch_size=None or Adam")
        if self.max_time is not None:
            _positive("max_time", self.max_time)
        if not 0 < self.lr_end_factor <= 1:
            raise ValueError(f"lr_end_factor must lie in (0, 1]; got {self.lr_end_factor}")
        if self.grad_clip is not None:
            _positive("grad_clip", self.grad_clip)
        if self.patience is not None:
            _positive_int("patience", self.patience)
        elif self.scheduler == "plateau":
            raise ValueError("scheduler='plateau' needs a patience (optimiser steps)")
        if not self.min_delta >= 0:
            raise ValueError(f"min_delta must be ≥ 0; got {self.min_delta}")
        if not 0 < self.plateau_factor < 1:
            raise ValueError(f"plateau_factor must lie in (0, 1); got {self.plateau_factor}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def torch_device(self) -> torch.device:
        """``device`` as a ``torch.device``; ValueError for a malformed or unavailable one."""
        name = self.device
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto'; got "
                             f"{self.device!r}") from err
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto'; got "
                             f"{self.device!r}")
        if device.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count == 0 or (device.index or 0) >= count:
                raise ValueError(f"device {self.device!r}: torch sees {count} CUDA device(s) "
                                 "(a CPU build of torch, or no GPU); use device='cpu'")
        return device

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def updated(self, **changes: Any) -> FitConfig:
        """A copy with ``changes`` applied; keys that are ``None``-valued are ignored."""
        valid = {f.name for f in fields(self)}
        unknown = set(changes) - valid
        if unknown:
            raise ValueError(f"unknown training options {sorted(unknown)}; valid: {sorted(valid)}")
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def _positive(name: str, value: float, *, finite: bool = False) -> None:
    """ValueError naming ``name`` unless ``value`` is a real number > 0 (and finite)."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (real and value > 0 and (math.isfinite(value) or not finite)):
        what = "a finite positive number" if finite else "a positive number"
        raise ValueError(f"{name} must be {what}; got {value!r}")


def _positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer ≥ 1; got {value!r}")


class PresetDefaults(Mapping[str, FitConfig]):
    """One preset's training defaults of every registered method key, as ``FitConfig`` objects:
    a read-only view of what each family declares (``MethodSpec.training_defaults``), built
    once per key (the same object on every lookup); a key that declares nothing for the preset
    is not in it (it trains with ``FitConfig()``). A preset derived from another (``base``)
    takes that preset's declarations with ``changes`` applied to every key."""

    def __init__(self, preset: str, *, base: str | None = None,
                 changes: Mapping[str, Any] | None = None):
        self.preset = preset
        self.base = base or preset
        self.changes = dict(changes or {})
        self._built: dict[str, tuple[Any, FitConfig]] = {}

    def __getitem__(self, key: str) -> FitConfig:
        spec = METHODS[key]
        declared = spec.training_defaults.get(self.base)
        if declared is None:
            raise KeyError(key)
        built = self._built.get(key)
        if built is None or built[0] is not spec:  # a key registered anew (tests) builds anew
            built = self._built[key] = (spec, FitConfig(**{**declared, **self.changes}))
        return built[1]

    def __iter__(self) -> Iterator[str]:
        return (key for key, spec in list(METHODS.items())
                if self.base in spec.training_defaults)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"PresetDefaults({self.preset!r}: {sorted(self)})"


PAPER_DEFAULTS = PresetDefaults("paper")
"""The ``paper`` preset: the fixed epoch counts and learning rates the benchmark suites ran
with before training stopped on convergence (``gpscale fit --preset paper``)."""

METHOD_DEFAULTS = PresetDefaults("default")
"""Each method key's default training settings (the ``default`` preset): stop on convergence
within :data:`DEFAULT_BUDGET_S` (:data:`gpscale.methods.registry.CONVERGE`); a key not listed
trains with ``FitConfig()``."""

OPTIMUM_CHANGES: dict[str, Any] = {"noise_plateau": False, "min_delta": 1e-6}
"""What the ``optimum`` preset changes in each key's ``default`` settings: an improvement counts
however small (relative 10⁻⁶), and none is judged against the loss's noise, so a full-batch run
goes on to the optimum of its objective (the last nats of a marginal likelihood) rather than
stopping where its gains are below what the training rows can tell apart. It predicts no better
on new data and takes longer; it is for comparing likelihoods, as of two kernels, with another
library's optimiser. A minibatch loss's noise keeps improving by chance, so there it trains on
until the budget."""

OPTIMUM_DEFAULTS = PresetDefaults("optimum", base="default", changes=OPTIMUM_CHANGES)
"""The ``optimum`` preset: the ``default`` one trained on to the objective's optimum
(:data:`OPTIMUM_CHANGES`; ``gpscale fit --preset optimum``)."""

PRESETS: dict[str, PresetDefaults] = {"default": METHOD_DEFAULTS, "paper": PAPER_DEFAULTS,
                                      "optimum": OPTIMUM_DEFAULTS}
"""The presets by name: the two each method declares
(:data:`gpscale.methods.registry.PRESETS`) and the one derived from ``default``."""


def default_fit_config(method: str, preset: str = "default") -> FitConfig:
    """The training defaults of method key ``method`` under ``preset`` (:data:`PRESETS`)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[preset].get(method, FitConfig())


def resolve_fit_config(method: str | FitConfig, num_train: int, *, preset: str = "default",
                       **overrides: Any) -> FitConfig:
    """A method's default training settings (or ``FitConfig`` ``method``) with overrides.

    ``None``-valued overrides keep the default; an unknown key is a ``ValueError`` listing the
    valid ones. An ``epochs`` given without ``max_time`` drops the default time budget (the
    user asked for that many epochs; a plateau may still end the run). A batch size at least
    ``num_train`` becomes full-batch training. A minibatch method's default batch on a GPU is
    :func:`gpscale.devices.minibatch_size` (a larger one that keeps the card busy).
    """
    base = method if isinstance(method, FitConfig) else default_fit_config(method, preset)
    if overrides.get("epochs") is not None and overrides.get("max_time") is None:
        base = replace(base, max_time=None)
    config = base.updated(**overrides)
    if overrides.get("batch_size") is None and config.batch_size is not None:
        # the method's minibatch, sized for a GPU (gpscale.devices)
        config = replace(config, batch_size=minibatch_size(config.batch_size,
                                                           config.torch_device, num_train))
    if config.batch_size is not None and config.batch_size >= num_train:
        config = replace(config, batch_size=None)
    return config
