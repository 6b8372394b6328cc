"""Registry of method keys: ``METHODS[key]`` describes and builds each inference family.

Each key declares its options once (:class:`~gpscale.methods.options.Option`: name, kind,
default, help); :func:`build` validates what it is given against that declaration — an unknown
key or an ill-typed value is a ``ValueError`` listing the valid options — and passes the factory
every declared option, defaults filled in. Everything else the pipeline needs to know about a
key is declared on its :class:`MethodSpec` too, in the family's package, with a documented
default: training defaults per preset (read by :mod:`gpscale.training.config`, which turns them
into ``FitConfig`` objects), GPU inducing sets and dense-memory copies (:mod:`gpscale.devices`),
a hyperparameter pre-fit (:class:`Prefit`, :mod:`gpscale.training.prefit`) and small options for
tests (:data:`gpscale.testing.SMALL_OPTIONS`). The shared pieces of the training defaults
(:data:`CONVERGE`, :data:`MINIBATCH`, :func:`training_presets`) are here.

A factory has the signature ``factory(num_dims, *, task, num_classes, init, **options) ->
Method``. ``init`` is ``(x, y)`` training data used for data-dependent initialisation (k-means
inducing points, noise) or ``None`` when a saved model is being rebuilt (its parameters then come
from the state dict). The factory stores the resolved options on the module (``model.options``)
so that ``build(key, num_dims, init=None, **model.options)`` rebuilds the same architecture.

A method of the user's own registers itself with :func:`register` from any module. So that
the command line, ``gpscale predict`` and the ranks of a data-parallel run (fresh processes)
know it too, ``GPSCALE_PLUGINS`` names the modules to import, comma-separated, each as
``module`` or ``module:function`` (the function is then called with no arguments);
:func:`load_plugins` imports them the first time a key is not found (and ``gpscale methods``
before it lists the keys).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from gpscale.methods.base import Method
from gpscale.methods.options import Option, describe_options, resolve_options

__all__ = ["MethodSpec", "METHODS", "register", "build", "get_spec", "Prefit", "PRESETS",
           "DEFAULT_BUDGET_S", "FULL_BATCH", "MINIBATCH", "CONVERGE", "training_presets",
           "DeclaredTable", "PLUGINS_VARIABLE", "load_plugins"]

PRESETS = ("default", "paper")
"""The training presets (``--preset``): ``default`` stops on convergence within
:data:`DEFAULT_BUDGET_S`; ``paper`` runs the fixed epochs and learning rates of the benchmark
suites."""

INPUTS = ("vectors", "images")
"""What a row of x can be to a method (``MethodSpec.inputs``)."""

DEFAULT_BUDGET_S = 300.0
"""Wall-clock training budget of every method's defaults (seconds); ``--max-time`` overrides."""

FULL_BATCH: dict[str, Any] = {"optimizer": "adam", "batch_size": None, "dtype": "float64"}
"""Training settings (``FitConfig`` fields) of a full-batch method: Adam on all the data in
float64."""

MINIBATCH: dict[str, Any] = {"optimizer": "adam", "lr": 0.01, "epochs": 50, "batch_size": 1024,
                             "dtype": "float32"}
"""Training settings of a minibatch method: Adam, lr 0.01, batches of 1,024 in float32 (GPyTorch's
SVGP examples and the papers' minibatch runs)."""

# Every trainable method's default preset: Adam from a method-specific learning rate, lowered by
# 0.3 whenever the loss has not improved by 0.1% for 50 optimiser steps, until it reaches 1% of
# its start (then the run has converged), within 1000 epochs and the time budget. A full-batch run
# also stops at a plateau its loss reached in a steady descent, and an improvement below the
# loss's standard error (0.71/√n per datum) counts as none (``noise_plateau``; BENCHMARKS
# "Stopping on the loss's noise"). A minibatch run whose plateaus come late is annealed on the
# budget's clock (``budget_anneal``: lr × 0.3 at 50, 75 and 90 % of it), so a run its budget ends
# does not end at the starting rate's gradient noise.
CONVERGE: dict[str, Any] = dict(
    epochs=1000, max_time=DEFAULT_BUDGET_S, scheduler="plateau", patience=50, lr_end_factor=0.01,
    plateau_factor=0.3, min_delta=1e-3, noise_plateau=True, budget_anneal=True)
"""The settings that make a ``default`` preset stop on convergence (comment above)."""


def training_presets(paper: Mapping[str, Any], **default: Any) -> dict[str, dict[str, Any]]:
    """``MethodSpec.training_defaults`` whose ``paper`` preset is ``paper`` and whose ``default``
    preset stops on convergence (:data:`CONVERGE`) from ``paper``'s settings with the changes
    ``default`` (its learning rate, ...)."""
    return {"paper": dict(paper), "default": {**paper, **CONVERGE, **default}}


@dataclass(frozen=True)
class Prefit:
    """The hyperparameter pre-fit a method asks the training harness for, before the build
    (:func:`gpscale.training.prefit.fill_prefit_options`).

    Attributes:
        kind: ``"subset"``: where the method's ``prefit`` option asks for it
            (:data:`~gpscale.methods.options.PREFIT_OPTIONS`; regression only), ``model`` fitted
            to ``prefit_size`` random training points with that key's default training settings
            (its noise then chosen on other training points) supplies the lengthscale(s),
            outputscale and noise not given, and training starts from them at a learning rate
            of at most ``prefit_max_lr``. ``"kernel"``: the kernel stays fixed, and a short
            minibatch fit of ``model`` supplies the lengthscale and outputscale not given.
        model: the registered key of the model the pre-fit trains.
        arguments: ``"kernel"``: ``(resolved options, x) -> dict``, the keyword arguments of
            :func:`~gpscale.training.prefit.prefit_hyperparameters` besides the data, the task,
            the classes and ``method`` (the family resolves its own options there).
        learned_start: ``"kernel"``: ``(resolved options, task) -> bool``, whether the method
            learns its kernel from a start that needs no pre-fit instead (the median distance
            between training inputs and outputscale 1); ``None``: never.
        check: ``"subset"``: ``(pre-fitted values, resolved options, n) -> None``, raising
            :class:`~gpscale.errors.NumericalError` where the method cannot start from those
            values (then training starts from the defaults); ``None``: no check.
    """

    kind: str
    model: str
    arguments: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
    learned_start: Callable[[dict[str, Any], str], bool] | None = None
    check: Callable[[dict[str, Any], dict[str, Any], int], None] | None = None

    KINDS = ("subset", "kernel")

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise ValueError(f"pre-fit kind must be one of {self.KINDS}; got {self.kind!r}")
        if self.kind == "kernel" and self.arguments is None:
            raise ValueError("a 'kernel' pre-fit needs its arguments(options, x)")


@dataclass(frozen=True)
class MethodSpec:
    """What the CLI, estimators and benchmarks need to know about a method key.

    Attributes:
        key: the name users type (``--method KEY``).
        factory: builds the module, see the module docstring.
        tasks: the tasks it supports.
        summary: one line for listings.
        status: ``"ready"``, ``"experimental"`` or ``"planned"``.
        options: the declared method options (what ``-o KEY=VALUE`` and the estimators'
            keywords accept).
        prefit: the hyperparameter pre-fit the training harness runs before the build
            (:class:`Prefit`); ``None`` (the default): none.
        saved_defaults: option values a model saved before the option existed was built with
            (``gpscale.load`` fills them in, so a changed default does not change an old file's
            predictions).
        training_defaults: per preset (:data:`PRESETS`), the ``FitConfig`` fields that differ
            from ``FitConfig()`` (``gpscale.training.default_fit_config`` builds the config); a
            preset not declared trains with ``FitConfig()``. Build them from :data:`FULL_BATCH`,
            :data:`MINIBATCH` and :func:`training_presets`.
        gpu_inducing: inducing-set options sized for a GPU where the method trains one latent
            function (regression) and the user gave no size: option → ``(cap, divisor)``, i.e.
            ``min(cap, n // divisor)`` (:func:`gpscale.devices.inducing_options`); ``{}``: none.
        row_sized: options whose default follows the number of training rows: option →
            ``n ↦ value``. ``auto``'s race builds each candidate with them fixed at the whole
            data's n (where the user gave none), so that the model it trains on part of the
            rows has the shape of the winner's final model, which starts from it
            (:mod:`gpscale.training.race`); ``{}``: none.
        dense_copies: the n × n matrices of the training dtype the method holds at its peak,
            for the check before training that they fit the device
            (:func:`gpscale.devices.check_dense_fits`); ``None`` (the default): it forms none.
        plan: for a method that does not train by gradient epochs, the line ``gpscale fit``
            logs about how it will train: ``plan(resolved options, max_time, training rows or
            None, latent functions) -> str`` (after ``"KEY: "``); ``None`` (the default): the
            pipeline describes the epochs, schedule and budget of its training defaults.
        test_options: options small enough that the method builds and trains on a few dozen
            points in well under a second (:data:`gpscale.testing.SMALL_OPTIONS`); a method
            with a ``"kernel"`` pre-fit gets a fixed kernel there so that none runs.
        inputs: what a row of x is to the method: ``"vectors"`` (the default: any table of
            numbers) or ``"images"`` (flattened images, cut into patches: the convolutional
            keys); ``auto`` and the tabular suites consider only ``"vectors"`` methods.
    """

    key: str
    factory: Callable[..., Method]
    tasks: tuple[str, ...]
    summary: str
    status: str = "ready"
    options: tuple[Option, ...] = ()
    prefit: Prefit | None = None
    saved_defaults: dict[str, Any] = field(default_factory=dict)
    training_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    gpu_inducing: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    row_sized: Mapping[str, Callable[[int], Any]] = field(default_factory=dict)
    dense_copies: float | None = None
    plan: Callable[[dict[str, Any], float | None, int | None, int], str] | None = None
    test_options: Mapping[str, Any] = field(default_factory=dict)
    inputs: str = "vectors"

    def __post_init__(self):
        if self.inputs not in INPUTS:
            raise ValueError(f"method {self.key!r}: inputs must be one of {', '.join(INPUTS)}; "
                             f"got {self.inputs!r}")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"method {self.key!r} declares an option twice: {names}")
        unknown = set(self.training_defaults) - set(PRESETS)
        if unknown:
            raise ValueError(f"method {self.key!r} declares training defaults of unknown "
                             f"presets {sorted(unknown)}; presets: {', '.join(PRESETS)}")
        for what, sized in (("for a GPU", self.gpu_inducing), ("by rows", self.row_sized)):
            undeclared = sorted(set(sized) - set(names))
            if undeclared:
                raise ValueError(f"method {self.key!r} sizes undeclared options {what}: "
                                 f"{undeclared}")

    def resolve(self, options: dict[str, Any], *, fill_defaults: bool = True) -> dict[str, Any]:
        """``options`` checked against the declaration and typed (``OptionError`` if not)."""
        return resolve_options(self.key, self.options, options, fill_defaults=fill_defaults)

    def sized_for_rows(self, options: Mapping[str, Any], num_rows: int) -> dict[str, Any]:
        """``options`` with each :attr:`row_sized` option not in them set to its default on
        ``num_rows`` training rows."""
        sized = dict(options)
        for name, rule in self.row_sized.items():
            if sized.get(name) is None:
                sized[name] = rule(num_rows)
        return sized

    def describe(self) -> str:
        """The options table that ``gpscale methods KEY`` prints."""
        return describe_options(self.options)


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    if spec.key in METHODS:
        raise ValueError(f"method key {spec.key!r} is already registered")
    METHODS[spec.key] = spec
    return spec


PLUGINS_VARIABLE = "GPSCALE_PLUGINS"
"""The environment variable that names the modules registering methods of the user's own."""

_LOADED: set[str] = set()


def load_plugins() -> None:
    """Import each module ``$GPSCALE_PLUGINS`` names (and call its function where an entry is
    ``module:function``), once per entry; ``ValueError`` naming the variable and the entry when
    one cannot be imported or has no such function."""
    for entry in (e.strip() for e in os.environ.get(PLUGINS_VARIABLE, "").split(",")):
        if not entry or entry in _LOADED:
            continue
        _LOADED.add(entry)  # before the import: a module that looks a key up loads nothing twice
        name, _, function = entry.partition(":")
        try:
            module = importlib.import_module(name)
            hook = getattr(module, function, None) if function else None
            if function and not callable(hook):
                raise ValueError(f"{PLUGINS_VARIABLE}: module {name!r} has no function "
                                 f"{function!r}")
        except ImportError as err:
            _LOADED.discard(entry)
            raise ValueError(f"{PLUGINS_VARIABLE}: cannot import {name!r}: {err}") from err
        except ValueError:
            _LOADED.discard(entry)
            raise
        if hook is not None:
            hook()


def get_spec(key: str) -> MethodSpec:
    if key not in METHODS:
        load_plugins()
    if key not in METHODS:
        raise ValueError(f"unknown method {key!r}; valid methods: {', '.join(sorted(METHODS))}")
    return METHODS[key]


def build(key: str, num_dims: int, *, task: str = "regression", num_classes: int | None = None,
          init: tuple[Tensor, Tensor] | None = None, **options: Any) -> Method:
    """Build method ``key`` for ``num_dims`` inputs; see the module docstring."""
    spec = get_spec(key)
    if task not in spec.tasks:
        raise ValueError(f"method {key!r} does not support task {task!r}; it supports "
                         f"{', '.join(spec.tasks)}")
    resolved = spec.resolve(options)
    model = spec.factory(num_dims, task=task, num_classes=num_classes, init=init, **resolved)
    model.method_key = key
    model.num_dims = num_dims
    return model


class DeclaredTable(Mapping[str, Any]):
    """A read-only view ``{key: spec.<name>}`` of one :class:`MethodSpec` field over the
    registered keys (with ``every=False`` only those that declare a value other than ``None`` or
    empty): the tables these declarations replaced keep their names this way
    (``gpscale.devices.DENSE_COPIES``, ``gpscale.testing.SMALL_OPTIONS``). A mapping value
    comes as a copy."""

    def __init__(self, name: str, *, every: bool = False):
        self.name, self.every = name, every

    def _declares(self, spec: MethodSpec) -> bool:
        value = getattr(spec, self.name)
        return self.every or (value is not None and value != {})

    def __getitem__(self, key: str) -> Any:
        spec = METHODS[key]
        if not self._declares(spec):
            raise KeyError(key)
        value = getattr(spec, self.name)
        return dict(value) if isinstance(value, Mapping) else value  # a copy: the spec stays

    def __iter__(self) -> Iterator[str]:
        return (key for key, spec in list(METHODS.items()) if self._declares(spec))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"
