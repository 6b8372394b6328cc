"""Registry of method keys: ``METHODS[key]`` describes and builds each inference family.

Each key declares its options once (:class:`~gpscale.methods.options.Option`: name, kind,
default, help); :func:`build` validates what it is given against that declaration — an unknown
key or an ill-typed value is a ``ValueError`` listing the valid options — and passes the factory
every declared option, defaults filled in. Training defaults are not declared here but beside
``FitConfig`` (:data:`gpscale.training.config.METHOD_DEFAULTS`).

A factory has the signature ``factory(num_dims, *, task, num_classes, init, **options) ->
Method``. ``init`` is ``(x, y)`` training data used for data-dependent initialisation (k-means
inducing points, noise) or ``None`` when a saved model is being rebuilt (its parameters then come
from the state dict). The factory stores the resolved options on the module (``model.options``)
so that ``build(key, num_dims, init=None, **model.options)`` rebuilds the same architecture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from gpscale.methods.base import Method
from gpscale.methods.options import Option, describe_options, resolve_options

__all__ = ["MethodSpec", "METHODS", "register", "build", "get_spec"]


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
        prefit: the kernel is fixed and a missing ``lengthscale`` / ``outputscale`` comes from
            an SVGP pre-fit that the training harness runs before the build
            (:mod:`gpscale.training.prefit`).
        saved_defaults: option values a model saved before the option existed was built with
            (``gpscale.load`` fills them in, so a changed default does not change an old file's
            predictions).
    """

    key: str
    factory: Callable[..., Method]
    tasks: tuple[str, ...]
    summary: str
    status: str = "ready"
    options: tuple[Option, ...] = ()
    prefit: bool = False
    saved_defaults: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"method {self.key!r} declares an option twice: {names}")

    def resolve(self, options: dict[str, Any], *, fill_defaults: bool = True) -> dict[str, Any]:
        """``options`` checked against the declaration and typed (``OptionError`` if not)."""
        return resolve_options(self.key, self.options, options, fill_defaults=fill_defaults)

    def describe(self) -> str:
        """The options table that ``gpscale methods KEY`` prints."""
        return describe_options(self.options)


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    if spec.key in METHODS:
        raise ValueError(f"method key {spec.key!r} is already registered")
    METHODS[spec.key] = spec
    return spec


def get_spec(key: str) -> MethodSpec:
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
