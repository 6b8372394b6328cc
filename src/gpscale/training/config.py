"""Training configuration: a frozen dataclass validated on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

__all__ = ["FitConfig", "OPTIMIZERS", "SCHEDULERS", "resolve_fit_config"]

OPTIMIZERS = ("adam", "lbfgs")
SCHEDULERS = ("linear", "none")


@dataclass(frozen=True)
class FitConfig:
    """How ``training.fit`` optimises a model.

    Attributes:
        optimizer: ``"adam"`` (float32 or float64, minibatches allowed) or ``"lbfgs"`` (full batch,
            strong-Wolfe line search, one optimiser step per epoch).
        lr: initial learning rate (> 0).
        epochs: maximum number of epochs (passes over the data); ≥ 1.
        batch_size: minibatch size; ``None`` trains on the full data every step.
        max_time: wall-clock budget in seconds for training (evaluation excluded); ``None`` = none.
        scheduler: ``"linear"`` decays the learning rate linearly to ``lr * lr_end_factor`` over
            ``epochs`` (PyTorch ``LinearLR``, as CaGP's Table S1); ``"none"`` keeps it constant.
        lr_end_factor: final fraction of the learning rate under the linear schedule, in (0, 1].
        eval_every: evaluation callbacks run every this many epochs (and after the last).
        seed: seeds minibatch shuffling (and, in estimators and the CLI, initialisation).
        checkpoint: path of a checkpoint file written every ``checkpoint_every`` epochs; with
            ``resume`` a run finds it and continues where it stopped.
        checkpoint_every: epochs between checkpoints (≥ 1).
        resume: continue from ``checkpoint`` when that file exists.
        progress: show a tqdm bar; ``None`` shows it only when stderr is a terminal.
        lbfgs_max_iter: L-BFGS iterations inside one epoch's ``step``.
        grad_clip: clip the gradient norm to this value; ``None`` = no clipping.
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

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}; got {self.optimizer!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}; got {self.scheduler!r}")
        _positive("lr", self.lr)
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def updated(self, **changes: Any) -> FitConfig:
        """A copy with ``changes`` applied; keys that are ``None``-valued are ignored."""
        valid = {f.name for f in fields(self)}
        unknown = set(changes) - valid
        if unknown:
            raise ValueError(f"unknown training options {sorted(unknown)}; valid: {sorted(valid)}")
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive; got {value}")


def _positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer ≥ 1; got {value!r}")


def resolve_fit_config(defaults: dict[str, Any], num_train: int,
                       **overrides: Any) -> tuple[FitConfig, torch.dtype]:
    """A method's default training options (``MethodSpec.fit_defaults``) with overrides.

    ``None``-valued overrides keep the default. The ``dtype`` default (``"float32"`` or
    ``"float64"``, overridable by ``dtype=``) is returned separately as a torch dtype. A batch
    size at least ``num_train`` becomes full-batch training.
    """
    defaults = dict(defaults)
    dtype_name = overrides.pop("dtype", None) or defaults.pop("dtype", "float64")
    defaults.pop("dtype", None)
    if dtype_name not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64'; got {dtype_name!r}")
    config = FitConfig(**defaults).updated(**overrides)
    if config.batch_size is not None and config.batch_size >= num_train:
        config = replace(config, batch_size=None)
    return config, getattr(torch, dtype_name)
