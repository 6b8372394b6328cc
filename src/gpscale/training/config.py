"""Training configuration: a frozen dataclass validated on construction, and each method's
defaults as one (:data:`METHOD_DEFAULTS`)."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from gpscale.devices import minibatch_size

__all__ = ["FitConfig", "OPTIMIZERS", "SCHEDULERS", "DTYPES", "METHOD_DEFAULTS", "PAPER_DEFAULTS",
           "PRESETS", "DEFAULT_BUDGET_S", "MAX_LR",
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


_FULL_BATCH_ADAM = FitConfig(optimizer="adam", batch_size=None)
_MINIBATCH = FitConfig(optimizer="adam", lr=0.01, epochs=50, batch_size=1024, dtype="float32")

PAPER_DEFAULTS: dict[str, FitConfig] = {
    # GPyTorch baselines: full batch in float64; SVGP minibatches in float32 as GPyTorch's examples.
    "exact": replace(_FULL_BATCH_ADAM, lr=0.1, epochs=50),
    "cggp": replace(_FULL_BATCH_ADAM, lr=0.1, epochs=50),
    "sgpr": replace(_FULL_BATCH_ADAM, lr=0.1, epochs=100),
    "svgp": _MINIBATCH,
    # SOLVE-GP as the svgp baseline; the paper (App. G): Adam, lr 0.01, batch 1024.
    "solvegp": _MINIBATCH,
    # SoftKI: the paper's Adam, lr 0.01, batch 1024 in float32.
    "softki": _MINIBATCH,
    # CaGP, Table S1: Adam in float32 with LinearLR(end_factor=0.1), full batch; lr 0.1 is the
    # middle of the paper's sweep {1, 0.1, 0.01}. The paper runs 1000 (CaGP-Opt) and 250
    # (CaGP-CG) epochs on a GPU; on a CPU a CaGP-Opt epoch at ten thousand points or more takes
    # seconds and a CaGP-CG epoch minutes, hence 200 and 50.
    "cagp-opt": FitConfig(lr=0.1, epochs=200, scheduler="linear", lr_end_factor=0.1,
                          dtype="float32"),
    "cagp-cg": FitConfig(lr=0.1, epochs=50, scheduler="linear", lr_end_factor=0.1,
                         dtype="float32"),
    # IterNCGP and its SoD baseline train nothing (``trainable`` is False); float64 as the paper.
    "iterncgp": replace(_FULL_BATCH_ADAM, epochs=1),
    "sod-laplace": replace(_FULL_BATCH_ADAM, epochs=1),
    # SKI/GGP: full batch (the statistics are sums over all data; a minibatch needs new ones).
    "ski": replace(_FULL_BATCH_ADAM, lr=0.05, epochs=40),
    "ggp": replace(_FULL_BATCH_ADAM, lr=0.05, epochs=40),
}
"""The ``paper`` preset: the fixed epoch counts and learning rates the benchmark suites ran
with before training stopped on convergence (``gpscale fit --preset paper``)."""

DEFAULT_BUDGET_S = 300.0
"""Wall-clock training budget of every method's defaults (seconds); ``--max-time`` overrides."""

# Every trainable method: Adam from a method-specific learning rate, lowered by 0.3 whenever the
# loss has not improved by 0.1% for 50 optimiser steps, until it reaches 1% of its start (then
# the run has converged), within 1000 epochs and the time budget. A full-batch run also stops at
# a plateau its loss reached in a steady descent, and an improvement below the loss's standard
# error (0.71/√n per datum) counts as none (``noise_plateau``; BENCHMARKS "Stopping on the
# loss's noise"). A minibatch run whose plateaus come late is annealed on the budget's clock
# (``budget_anneal``: lr × 0.3 at 50, 75 and 90 % of it), so a run its budget ends does not end
# at the starting rate's gradient noise.
_CONVERGE = dict(epochs=1000, max_time=DEFAULT_BUDGET_S, scheduler="plateau", patience=50,
                 lr_end_factor=0.01, plateau_factor=0.3, min_delta=1e-3, noise_plateau=True,
                 budget_anneal=True)

METHOD_DEFAULTS: dict[str, FitConfig] = {
    **PAPER_DEFAULTS,
    **{key: replace(PAPER_DEFAULTS[key], **_CONVERGE, lr=lr) for key, lr in (
        ("exact", 0.1), ("cggp", 0.1), ("sgpr", 0.1),
        # Table 1 of the CaGP paper: the best SVGP learning rate is 0.1 or 0.01 by data set; start
        # high (ARD lengthscales of unimportant inputs need large steps) and let plateaus lower it.
        ("svgp", 0.1), ("solvegp", 0.1),
        # SoftKI: 3× the paper's 0.01. Under the plateau schedule 0.01 stops short, behind
        # SVGP's test NLL; 0.03 gains clearly on most sets at a small cost on a few, and 0.1
        # overshoots (BENCHMARKS "defaults").
        ("softki", 0.03),
        # CaGP-Opt and CaGP-CG train best at lr 1.0 on most sets of Table 1 (0.1 on Protein,
        # which the plateau schedule reaches); a failed first step backs off by 0.3. (With
        # CaGP-Opt's opt-in ``-o prefit=exact`` use ``--lr 0.1``: lr 1.0 throws the pre-fitted
        # values away in its first steps.)
        ("cagp-opt", 1.0), ("cagp-cg", 1.0),
        ("ski", 0.05), ("ggp", 0.05))},
}
"""Each method key's default training settings (the ``default`` preset): stop on convergence
within :data:`DEFAULT_BUDGET_S`; a key not listed trains with ``FitConfig()``."""

# The exact GP: its loss and gradient are deterministic and an evaluation costs O(n³) (seconds
# at a few thousand points), so L-BFGS with a line search is far ahead of Adam per evaluation
# within the time budget (BENCHMARKS "defaults"). Five iterations per
# epoch keep the time budget checked often; a plateau of 2 epochs is 10 iterations.
METHOD_DEFAULTS["exact"] = replace(METHOD_DEFAULTS["exact"], optimizer="lbfgs", lr=1.0,
                                   lbfgs_max_iter=5, patience=2)

# IterNCGP learns its kernel by default (rounds of L-BFGS and warm-started refinements, not
# epochs): the same budget bounds the rounds (the final conditioning runs after it).
METHOD_DEFAULTS["iterncgp"] = replace(METHOD_DEFAULTS["iterncgp"], max_time=DEFAULT_BUDGET_S)

PRESETS: dict[str, dict[str, FitConfig]] = {"default": METHOD_DEFAULTS, "paper": PAPER_DEFAULTS}


def default_fit_config(method: str, preset: str = "default") -> FitConfig:
    """The training defaults of method key ``method`` under ``preset`` (default or paper)."""
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
