"""Training configuration: a frozen dataclass validated on construction, and each method's
defaults as one (:data:`METHOD_DEFAULTS`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

__all__ = ["FitConfig", "OPTIMIZERS", "SCHEDULERS", "DTYPES", "METHOD_DEFAULTS",
           "default_fit_config", "resolve_fit_config"]

OPTIMIZERS = ("adam", "lbfgs")
SCHEDULERS = ("linear", "none")
DTYPES = ("float32", "float64")


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
        dtype: ``"float32"`` or ``"float64"``, the precision the harness trains the model and
            its data in (``training.fit`` itself follows the model's).
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

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}; got {self.dtype!r}")
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

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

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


_FULL_BATCH_ADAM = FitConfig(optimizer="adam", batch_size=None)
_MINIBATCH = FitConfig(optimizer="adam", lr=0.01, epochs=50, batch_size=1024, dtype="float32")

METHOD_DEFAULTS: dict[str, FitConfig] = {
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
    # (CaGP-CG) epochs on a GPU; on a 2-core CPU one CaGP-Opt epoch at n = 15k, i = 512 takes
    # ~2–4 s and one CaGP-CG epoch minutes, hence 200 and 50.
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
"""Each method key's default training settings; a key not listed trains with ``FitConfig()``."""


def default_fit_config(method: str) -> FitConfig:
    """The training defaults of method key ``method``."""
    return METHOD_DEFAULTS.get(method, FitConfig())


def resolve_fit_config(method: str | FitConfig, num_train: int, **overrides: Any) -> FitConfig:
    """A method's default training settings (or ``FitConfig`` ``method``) with overrides.

    ``None``-valued overrides keep the default; an unknown key is a ``ValueError`` listing the
    valid ones. A batch size at least ``num_train`` becomes full-batch training.
    """
    base = method if isinstance(method, FitConfig) else default_fit_config(method)
    config = base.updated(**overrides)
    if config.batch_size is not None and config.batch_size >= num_train:
        config = replace(config, batch_size=None)
    return config
