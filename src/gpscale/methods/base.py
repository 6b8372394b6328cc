"""The Method contract every inference family implements.

A method is a ``torch.nn.Module`` holding learnable parameters only. Everything computed from data
is returned by :meth:`Method.condition` as a frozen dataclass (the *state*), which the loss and
the predictive consume::

    state = model.condition(x, y)      # differentiable, never mutates the model
    loss = model.loss(state)           # scalar to minimise, per datum
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x_test)   # a Predictive

Class attributes describe the method to the training loop, estimators and CLI:

- ``task``: ``"regression"``, ``"classification"`` or ``"counts"`` (set per instance when a method
  supports several, e.g. SVGP).
- ``minibatch``: the loss on a minibatch is an unbiased estimate of the full loss, so the training
  loop may iterate over batches; otherwise every step sees all the data.
- ``needs_data_for_prediction``: prediction conditions on the training data (exact, SGPR, CaGP),
  so a saved model must carry it — unless the method *summarises* its data: :meth:`Method.summary`
  turns a state into an object whose size does not grow with n (SoftKI: its m-sized posterior;
  GGP: its sufficient statistics) and :meth:`Method.from_summary` turns it back into a state
  that predicts identically, so ``model.pt`` holds the summary instead of the data.
- ``heldout_noise``: the harness holds rows out and calibrates σ² on them after training.
- ``trainable``: the method has parameters to optimise. ``False`` (IterNCGP, SoD-Laplace: fixed
  hyperparameters) means ``condition`` is the whole fit; the runner and the estimators then call
  :func:`gpscale.training.condition_only` instead of ``training.fit``.

The training harness (:mod:`gpscale.training.harness`) and ``training.fit`` use these methods
and attributes, each with a default here that changes nothing, so a method overrides only what
it needs: :meth:`Method.training_loss`, :attr:`Method.learns_kernel`, :meth:`Method.finalize`,
:meth:`Method.holdout_rows` with :meth:`Method.validation_score`, :meth:`Method.resolves` and
:attr:`Method.max_start_lr`; a data-parallel run (``gpscale fit --nproc``) asks
:meth:`Method.shard_plan` how the method trains on a shard of the rows. What the pipeline
needs to know about a method key before a module exists (training defaults, device sizing,
pre-fit, test options) is declared on its :class:`~gpscale.methods.registry.MethodSpec`.

``options`` holds the resolved constructor options (JSON-like) from which the registry can build
an identical, untrained module; ``gpscale.save``/``gpscale.load`` store it with the state dict.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from gpscale.distributed.reduce import predict_in_shards
from gpscale.distributions import Predictive, concat

__all__ = ["Method", "ShardPlan", "module_device", "predict_in_chunks", "parameter_digest"]


@dataclass(frozen=True)
class ShardPlan:
    """How a method trains and predicts when each rank of a data-parallel run holds a shard of
    the training rows (:meth:`Method.shard_plan`).

    Attributes:
        kind: ``'local'`` — the loss on a rank's batch is the per-datum loss of those rows, and
            the ranks average it weighted by rows (minibatch methods); ``'global'`` — every
            rank computes the same full-data loss through reductions (the loss kinds of
            :class:`gpscale.training.parallel.DataParallel`).
        predict: ``predict(x_test) -> Predictive`` at all of ``x_test``, conditioned on the
            model's current parameters; a collective (every rank calls it with the same points).
        loss_fn: the loss ``(model, x, y) -> Tensor`` that ``training.fit`` minimises on the
            shard, or ``None``: the method's own.
        full_batch: the loss needs the whole shard at every step (no ``--batch-size``).
        inputs: the inputs of every rank, where the plan gathered them (a saved model that
            keeps its training data takes them from here).
    """

    kind: str
    predict: Callable[[Tensor], Predictive]
    loss_fn: Callable[..., Tensor] | None = None
    full_batch: bool = False
    inputs: Tensor | None = None


class Method(nn.Module, ABC):
    """Base class of every inference family (one level under ``nn.Module``)."""

    key: ClassVar[str] = ""
    minibatch: ClassVar[bool] = False
    """The loss on a minibatch is an unbiased estimate of the full loss: ``training.fit`` may
    iterate over batches, and the ranks of a data-parallel run may each train on their shard
    (an instance may set it, e.g. SOLVE-GP's collapsed bound is not a sum over points)."""
    needs_data_for_prediction: ClassVar[bool] = True
    trainable: ClassVar[bool] = True
    heldout_noise: ClassVar[bool] = False
    """Regression whose Gaussian noise σ² the harness calibrates on held-out rows after
    training (:mod:`gpscale.training.calibration`); such a method has a ``noise`` tensor and
    implements :meth:`set_noise`."""
    rows_in_parameters: ClassVar[bool] = False
    """Some trained parameters belong to individual training rows (CaGP-Opt's learned
    actions): a model built on more rows starts from them only as :meth:`warm_for_rows`
    carries them over."""
    finalize_reads_posterior: ClassVar[bool] = False
    """:meth:`finalize` reads the posterior on the training rows and leaves it valid (it changes
    only how the model predicts from it): the harness conditions first, hands that state over
    as ``finalize(..., state=...)`` and keeps it instead of conditioning again."""
    max_start_lr: float | None = None
    """The largest learning rate training may start at, or ``None`` (the default): no cap. The
    harness sets it on a model built from pre-fitted start values (the ``prefit_max_lr``
    option) and ``train_built`` lowers a larger rate to it."""
    prefit_lr_scales: ClassVar[dict[str, float]] = {}
    """Factors on the training rate by parameter-name prefix, from a pre-fitted start
    (:attr:`max_start_lr` set): parameters initialised from the pre-fitted hyperparameters
    (CaGP-Opt's actions) keep to that start as the hyperparameters do."""

    @property
    def lr_scales(self) -> dict[str, float]:
        """Adam's rate factors by parameter-name prefix (:func:`gpscale.training.fit`'s
        parameter groups; the rest at the schedule's rate)."""
        return dict(self.prefit_lr_scales) if self.max_start_lr is not None else {}

    def __init__(self, *, task: str = "regression", num_classes: int | None = None,
                 options: dict[str, Any] | None = None):
        super().__init__()
        self.task = task
        self.num_classes = num_classes
        self.options: dict[str, Any] = dict(options or {})

    @abstractmethod
    def condition(self, x: Tensor, y: Tensor) -> Any:
        """Everything computed from data, as a frozen dataclass; differentiable."""

    @abstractmethod
    def loss(self, state: Any) -> Tensor:
        """The training objective for ``state``: a scalar to minimise, per datum."""

    @abstractmethod
    def predict(self, state: Any, x_test: Tensor) -> Predictive:
        """Marginal predictive at ``x_test`` (t, d)."""

    def posterior(self, x: Tensor, y: Tensor) -> Any:
        """The state :meth:`predict` needs, from all training data and without gradients.

        Default :meth:`condition`; a method whose training state holds n-sized parts that
        prediction does not use (SoftKI's weights and probe solves) returns a smaller one.
        """
        with torch.no_grad():
            return self.condition(x, y)

    def set_noise(self, value: float) -> None:
        """Set the Gaussian noise variance σ² to ``value`` (methods with ``heldout_noise``)."""
        raise NotImplementedError(f"{type(self).__name__} has no noise to calibrate")

    # -- hooks of the training harness (gpscale.training.harness, training.fit) ---------------
    def training_loss(self, x: Tensor, y: Tensor) -> Callable[..., Tensor] | None:
        """The loss ``(model, x_batch, y_batch) -> Tensor`` that ``training.fit`` minimises on
        ``(x, y)`` when it is given none: one that prepares per-data work once (GGP's sufficient
        statistics, CaGP-CG's recycled actions). ``None`` (the default): fit's
        ``default_loss``, ``loss(condition(x_batch, y_batch))``."""
        return None

    @property
    def learns_kernel(self) -> bool:
        """A method that is not ``trainable`` learns its kernel hyperparameters by rounds of
        :func:`gpscale.training.laplace.learn_kernel` (IterNCGP) instead of only conditioning;
        ``False`` (the default): conditioning is the whole fit."""
        return False

    def finalize(self, x: Tensor, y: Tensor, reduce: Callable[[Tensor], Tensor] | None = None,
                 held: Any = None) -> dict[str, Any] | None:
        """A closed-form step after training, run by the harness without gradients (SVGP,
        SOLVE-GP and SGPR set q and σ² to their bound's optimum; SoftKI calibrates its noise):
        returns what it changed for the last history row (e.g. ``{"noise_calibrated": 0.012}``),
        after which the harness conditions anew, or ``None`` (the default): nothing changed.
        ``reduce`` sums a tensor over the ranks of a data-parallel run (``None`` in one
        process); ``held`` is ``((x, y) trained on, (x, y) held out)`` where rows were held out
        (:meth:`holdout_rows`, ``heldout_noise``)."""
        return None

    def holdout_rows(self, n: int) -> int:
        """How many of ``n`` training rows to hold out: the harness trains on the others, keeps
        the epoch that scores best on them (:meth:`validation_score`) and hands both to
        :meth:`finalize` (SoftKI). ``0`` (the default): none. (A method with ``heldout_noise``
        holds rows out by :func:`gpscale.training.calibration.heldout_rows` instead.)"""
        return 0

    def validation_score(self, fit: tuple[Tensor, Tensor], held: tuple[Tensor, Tensor],
                         seed: int = 0) -> Callable[[nn.Module], dict[str, float]]:
        """The score of the held-out rows ``held`` after each epoch of training on ``fit``
        (:mod:`gpscale.training.validation`); needed where :meth:`holdout_rows` holds rows out."""
        raise NotImplementedError(f"{type(self).__name__} holds no rows out to score")

    def resolves(self, x: Tensor, y: Tensor) -> bool:
        """Whether the model, built from pre-fitted start values, computes its training
        quantities in ``x``'s dtype (CaGP: a positive definite SᵀK̂S); where not, the harness
        builds it again from the default start. ``True`` (the default): no check."""
        return True

    def warm_for_rows(self, trained: dict[str, Tensor], x: Tensor, kept: Tensor, added: Tensor,
                      options: dict[str, Any]) -> dict[str, Tensor] | None:
        """Parameters (and row buffers) by name to start a model with ``options`` on every
        row of ``x`` from this one, trained on the rows ``x[kept]`` to ``trained``; ``added``
        are the other rows. ``auto``'s race winner starts its final run from them. ``None``:
        no such start (then it trains from its own). The default hands ``trained`` on as it
        is, or ``None`` where :attr:`rows_in_parameters`."""
        return None if self.rows_in_parameters else dict(trained)

    def shard_plan(self, x: Tensor, y: Tensor, *, start: int,
                   num_points: int) -> ShardPlan | None:
        """How to train on this rank's shard ``x, y`` (rows ``start`` … of ``num_points``) in a
        data-parallel run, or ``None``: the method has no data-parallel path. The default serves
        every trainable ``minibatch`` method: each rank's loss is the per-datum loss on its
        rows, and prediction conditions on the shard (which such a method reads only for its
        size) and predicts a shard of the test points on each rank."""
        if not (self.minibatch and self.trainable):
            return None

        def predict(x_test: Tensor) -> Predictive:
            with torch.no_grad():
                state = self.condition(x, y)
                return predict_in_shards(lambda part: self.predict(state, part), x_test)

        return ShardPlan("local", predict)

    summary_types: tuple[type, ...] = ()
    """The dataclasses a :meth:`summary` is made of: a saved file holds them as plain records,
    and loading rebuilds only these types (``gpscale.files.rebuild``)."""

    def summary(self, state: Any) -> Any | None:
        """What of ``state`` a saved model keeps instead of its training data, or ``None``
        when the method must keep the data (the default). Its size must not grow with n."""
        return None

    def from_summary(self, summary: Any) -> Any:
        """The prediction state rebuilt from :meth:`summary`'s output."""
        raise NotImplementedError(f"{type(self).__name__} keeps its training data, no summary")

    def extra_repr(self) -> str:
        return f"task={self.task!r}, options={self.options}"


def parameter_digest(module: nn.Module) -> str:
    """SHA-256 of a module's state dict (names, dtypes, shapes, values): a summary computed
    with one set of parameters is refused by a model holding others."""
    h = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        t = value.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()


_PER_POINT = ("mean", "variance", "noise", "probs", "rate")


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (the CPU when it has none)."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def predict_in_chunks(predict_chunk, x_test: Tensor, chunk_size: int = 4096) -> Predictive:
    """Apply ``predict_chunk(x_chunk) -> Predictive`` over row chunks of ``x_test`` and join.

    The outputs are allocated once, after the first chunk, and each chunk is copied into them:
    keeping every chunk's small outputs alive between the freed temporaries of the next ones
    fragments glibc's heap, so that RSS grew by ~3 kB per test point (2.5 GB for SVGP at 10⁶
    points) although nothing was referenced; with the outputs preallocated the peak memory of
    prediction does not grow with the number of test points beyond the outputs themselves.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")
    t = x_test.shape[0]
    first = predict_chunk(x_test[:chunk_size])
    if t <= chunk_size:
        return first
    if first.covariance is not None:  # a joint covariance is not chunked: join as before
        rest = [predict_chunk(x_test[i:i + chunk_size]) for i in range(chunk_size, t, chunk_size)]
        return concat([first, *rest])
    out = {}
    for name in _PER_POINT:
        value = getattr(first, name)
        if value is None or (name == "noise" and value.dim() == 0):
            out[name] = value
        else:
            out[name] = value.new_empty((t, *value.shape[1:]))
            out[name][:chunk_size] = value
    del first
    for i in range(chunk_size, t, chunk_size):
        part = predict_chunk(x_test[i:i + chunk_size])
        for name, buf in out.items():
            if buf is not None and buf.dim() > 0 and buf.shape[0] == t:
                buf[i:i + chunk_size] = getattr(part, name)
        del part
    return Predictive(**out)


def as_dtype(x: Tensor, ref: Tensor) -> Tensor:
    """``x`` on the device and dtype of ``ref``."""
    return x.to(device=ref.device, dtype=ref.dtype)


def probit_binary_probs(mean: Tensor, variance: Tensor) -> Tensor:
    """Bernoulli-logit class probabilities by the probit approximation (MacKay 1992).

    p(y=1) ≈ sigmoid(mean / sqrt(1 + pi * variance / 8)); returns (t, 2).
    """
    p1 = torch.sigmoid(mean / torch.sqrt(1 + torch.pi * variance / 8))
    return torch.stack([1 - p1, p1], -1)
