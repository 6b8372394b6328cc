"""Registry of method keys: ``METHODS[key]`` describes and builds each inference family.

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
        fit_defaults: default ``FitConfig`` fields (optimizer, lr, epochs, batch_size, ...).
    """

    key: str
    factory: Callable[..., Method]
    tasks: tuple[str, ...]
    summary: str
    status: str = "ready"
    fit_defaults: dict[str, Any] = field(default_factory=dict)


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    if spec.key in METHODS:
        raise ValueError(f"method key {spec.key!r} is already registered")
    METHODS[spec.key] = spec
    return spec


def get_spec(key: str) -> MethodSpec:
    _load_builtin()
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
    model = spec.factory(num_dims, task=task, num_classes=num_classes, init=init, **options)
    model.method_key = key
    model.num_dims = num_dims
    return model


def _load_builtin() -> None:
    """Import the built-in method modules, each of which registers its keys."""
    import gpscale.methods.baselines  # noqa: F401
    import gpscale.methods.cagp  # noqa: F401
    import gpscale.methods.iterncgp  # noqa: F401  (registers iterncgp and sod-laplace)
    import gpscale.methods.ski  # noqa: F401  (registers ski and ggp)
    import gpscale.methods.softki  # noqa: F401
    import gpscale.methods.solvegp  # noqa: F401
