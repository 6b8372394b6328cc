"""Typed declarations of method options, validated once at the boundary.

Every registered method declares its options as a tuple of :class:`Option` (name, kind, default,
one line of help). :func:`resolve_options` checks what a user passed — from the CLI's ``-o
KEY=VALUE`` (strings), from an estimator's keywords or from ``build(**options)`` — against that
declaration: an unknown key, a value that does not parse as the option's kind, or one outside its
range or choices is a ``ValueError`` that names the option and lists the valid ones with their
kinds and defaults. ``gpscale methods KEY`` prints the declaration (:func:`describe_options`).

Kinds:

==========  ============================================================================
``int``     an integer (``"32"``; not ``32.5`` nor ``"32.5"``; a bool is not an int)
``float``   a real number (ints accepted)
``bool``    ``True``/``False``; from text ``true/false/yes/no/on/off/1/0`` (any case)
``str``     text, usually one of ``choices``
``kernel``  a kernel name (:data:`~gpscale.kernels.KERNELS`) or a kernel expression
            (:mod:`gpscale.kernels.algebra`), kept in its canonical text
``floats``  a number or a (nested) list of numbers (e.g. one lengthscale per input dimension)
``ints``    an integer or a list of integers (e.g. a grid size per dimension)
``bounds``  a box ``(lower, upper)``, each a list of numbers; text ``[[0, 0], [1, 1]]``
==========  ============================================================================

An option whose default is ``None`` (``nullable``) also takes ``None`` (text ``none``/``null``),
meaning "choose from the data"; one with ``allow_none`` takes it to switch a bound off.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import gpytorch
import numpy as np

from gpscale.kernels import BACKENDS, KERNELS, KernelSyntaxError, parse_kernel
from gpscale.kernels.compose import standardised

__all__ = ["Option", "OptionError", "resolve_options", "coerce", "describe_options",
           "kernel_in_model_units", "composed_dtype",
           "GPYTORCH_NOISE_FLOOR", "PRIOR_OPTIONS", "PREFIT_OPTIONS", "AUTO_PREFIT_MIN_POINTS",
           "PREFIT_AUTO", "PREFIT_EXACT", "PREFIT_OFF",
           "INDUCING_OPTIONS", "KERNEL_PRODUCT_OPTIONS", "prior_options_with"]

KINDS = ("int", "float", "bool", "str", "kernel", "floats", "ints", "bounds")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NONE = ("none", "null")


class OptionError(ValueError):
    """A method option that is unknown or whose value does not fit its declaration."""


@dataclass(frozen=True)
class Option:
    """One method option.

    Attributes:
        name: the keyword (``num_inducing``).
        kind: one of ``int float bool str floats ints`` (see the module table).
        default: the value used when the option is not given; ``None`` means "from the data".
        help: one line for ``gpscale methods KEY``.
        choices: the valid values of a ``str`` option (``None``: any text).
        minimum: the smallest valid number (``int``/``float``/``floats``/``ints``).
        exclusive: the minimum itself is invalid (``rtol > 0``).
        hidden: set when a saved model is rebuilt (e.g. the number of training points), not
            listed for users.
        allow_none: ``none`` is valid although the default is not (it switches a bound off).
        minimum_why: where the minimum comes from, for the error (``"GPyTorch's noise
            floor"``).
        choices_why: why only ``choices`` are valid, for the error.
        refuse: for a ``kernel`` option, a function naming why the method cannot take an
            expression (``None``: it can); the error gives that reason.
        objects: a ``kernel`` option that also takes a GPyTorch kernel object of the user's.
    """

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    exclusive: bool = False
    hidden: bool = False
    allow_none: bool = False
    minimum_why: str = ""
    choices_why: str = ""
    refuse: Callable[[str], str | None] | None = None
    objects: bool = False

    def refusal(self, value: Any) -> str | None:
        """Why this ``kernel`` option refuses ``value`` (``None``: it takes it)."""
        if self.kind != "kernel" or self.refuse is None or not isinstance(value, str):
            return None
        return self.refuse(value.strip())

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"option {self.name!r}: unknown kind {self.kind!r}; valid: {KINDS}")

    @property
    def nullable(self) -> bool:
        return self.default is None or self.allow_none

    def type_text(self) -> str:
        text = self.kind if self.choices is None else "{" + ",".join(self.choices) + "}"
        if self.minimum is not None:
            text += f" {'>' if self.exclusive else '≥'} {_num_text(self.minimum)}"
        return text + (" or none" if self.nullable else "")


def _num_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def coerce(option: Option, value: Any) -> Any:
    """``value`` converted to ``option``'s kind and checked (``OptionError`` if it does not fit)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        if option.nullable:
            return None
        raise _bad(option, value, "it cannot be none")
    kind = option.kind
    if kind == "bool":
        out = _to_bool(option, value)
    elif kind == "int":
        out = _to_int(option, value)
    elif kind == "float":
        out = _to_float(option, value)
    elif kind == "str":
        if isinstance(value, gpytorch.kernels.Kernel):  # named by its type: its repr is long
            raise _bad(option, type(value).__name__, "this method takes a kernel by name, not "
                       "a kernel object")
        if not isinstance(value, str):
            raise _bad(option, value, "expected text")
        out = value
    elif kind == "kernel":
        out = _to_kernel(option, value)
    elif kind == "bounds":
        out = _to_bounds(option, value)
    else:  # floats / ints: a scalar or a list of scalars
        scalar = _to_int if kind == "ints" else _to_float
        if isinstance(value, str):
            value = _parse_list_text(option, value)
        out = _nested(option, value, scalar)
    _check_range(option, out)
    return out


def _to_kernel(option: Option, value: Any) -> Any:
    if isinstance(value, gpytorch.kernels.Kernel):
        if not option.objects:
            raise _bad(option, type(value).__name__, "this method builds its kernel from a name "
                       "or an expression (text), not from a kernel object")
        return value
    if not isinstance(value, str):
        raise _bad(option, value, "expected a kernel name or expression (text), or a GPyTorch "
                   "kernel object")
    text = value.strip()
    if text in KERNELS:
        return text
    try:
        canonical = parse_kernel(text).text
    except KernelSyntaxError as err:
        raise _bad(option, value, str(err)) from None
    why = option.refusal(canonical)
    if why is not None:
        raise _bad(option, value, why)
    return canonical


def _to_bool(option: Option, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    elif isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise _bad(option, value, "expected true or false")


def _to_int(option: Option, value: Any) -> int:
    if isinstance(value, bool):
        raise _bad(option, value, "expected an integer")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _bad(option, value, "expected an integer")


def _to_float(option: Option, value: Any) -> float:
    if isinstance(value, bool):
        raise _bad(option, value, "expected a number")
    if isinstance(value, numbers.Real):
        out = float(value)
    elif isinstance(value, str):
        try:
            out = float(value.strip())
        except ValueError:
            raise _bad(option, value, "expected a number") from None
    else:
        raise _bad(option, value, "expected a number")
    if not math.isfinite(out):
        raise _bad(option, value, "expected a finite number")
    return out


def _nested(option: Option, value: Any, scalar) -> Any:
    """A scalar, or a (possibly nested, e.g. per class and dimension) list of scalars."""
    if hasattr(value, "tolist") and not isinstance(value, str):  # numpy / torch arrays
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if not value:
            raise _bad(option, value, "the list is empty")
        return [_nested(option, v, scalar) for v in value]
    return scalar(option, value)


def _flat(value: Any) -> list:
    return [w for v in value for w in _flat(v)] if isinstance(value, list) else [value]


def _to_bounds(option: Option, value: Any) -> tuple[list[float], list[float]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(b, (list, tuple)) and len(b) > 0 for b in value)):
        raise _bad(option, value, "expected (lower, upper), e.g. [[0, 0], [1, 1]]")
    lower, upper = ([_to_float(option, v) for v in b] for b in value)
    if len(lower) != len(upper) or any(lo >= up for lo, up in zip(lower, upper, strict=True)):
        raise _bad(option, value, "lower and upper need equal lengths and lower < upper")
    return lower, upper


def _parse_list_text(option: Option, text: str) -> Any:
    """``"0.5"`` → ``"0.5"``; ``"[1, 2]"`` or ``"1,2"`` → ``["1", "2"]``-like values."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise _bad(option, text, "expected a number or a list like [1, 2]") from None
        if not isinstance(value, list):
            raise _bad(option, text, "expected a number or a list like [1, 2]")
        return value
    return [p for p in text.split(",")] if "," in text else text


def _check_range(option: Option, value: Any) -> None:
    if option.choices is not None and value not in option.choices:
        why = f"; {option.choices_why}" if option.choices_why else ""
        raise _bad(option, value, f"valid: {', '.join(option.choices)}{why}")
    if option.minimum is None or option.kind == "bounds":
        return
    for v in _flat(value):
        if v < option.minimum or (option.exclusive and v == option.minimum):
            sign = ">" if option.exclusive else "≥"
            why = f", {option.minimum_why}" if option.minimum_why else ""
            raise _bad(option, value, f"must be {sign} {_num_text(option.minimum)}{why}")


def _bad(option: Option, value: Any, why: str) -> OptionError:
    return OptionError(f"option {option.name}={value!r} is invalid: {why} "
                       f"({option.name}: {option.type_text()}, default {option.default!r})")


def resolve_options(method: str, declared: Iterable[Option], given: Mapping[str, Any],
                    *, fill_defaults: bool = True) -> dict[str, Any]:
    """Check ``given`` against ``declared``; the typed values, with defaults filled in.

    Raises:
        OptionError: an unknown key (the message lists the valid options with their kinds and
            defaults) or a value that does not fit its option.
    """
    table = {o.name: o for o in declared}
    unknown = [k for k in given if k not in table]
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        close = [m for k in unknown for m in difflib.get_close_matches(str(k), list(table), 1)]
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise OptionError(f"unknown option{'s' if len(unknown) > 1 else ''} {names} for method "
                          f"{method!r}{hint}; valid options: {_listing(table.values())}")
    out = {o.name: o.default for o in table.values()} if fill_defaults else {}
    for key, value in given.items():
        out[key] = coerce(table[key], value)
    return out


def _listing(options: Iterable[Option]) -> str:
    return "; ".join(f"{o.name} ({o.type_text()}, default {o.default!r})"
                     for o in options if not o.hidden)


def describe_options(declared: Iterable[Option]) -> str:
    """A table of the options (name, kind, default, help) for ``gpscale methods KEY``."""
    rows = [(o.name, o.type_text(), repr(o.default), o.help) for o in declared if not o.hidden]
    if not rows:
        return "(no options)"
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{a:{widths[0]}s}  {b:{widths[1]}s}  {c:{widths[2]}s}  {d}"
                     for a, b, c, d in rows)


GPYTORCH_NOISE_FLOOR = 1e-4
"""The smallest noise variance GPyTorch's ``GaussianLikelihood`` takes: its default
``noise_constraint`` is ``GreaterThan(1e-4)``, whose ``initialize`` refuses a smaller value (and
training never goes below it). The ``noise`` option of every method whose noise is such a
likelihood declares it as its minimum, so ``noise=1e-5`` is refused up front, naming the floor,
instead of failing inside GPyTorch; SoftKI keeps its own log-parameterised noise and takes any
positive value."""


def kernel_in_model_units(options: dict[str, Any], *, transform: Any,
                          names: list[str] | None, num_dims: int) -> dict[str, Any]:
    """``options`` with a kernel expression written for the data as read rewritten for the
    model's inputs: columns by name or by position among the inputs as read become the model's
    input indices (constant inputs the ``transform`` dropped are skipped), and start values
    move into standardised units (:func:`gpscale.kernels.compose.standardised`).

    Args:
        options: a method's typed options; unchanged without a ``kernel`` expression.
        transform: the :class:`~gpscale.data.transforms.Standardizer` of the data, or ``None``.
        names: the inputs' names as read (a header), or ``None``.
        num_dims: d, the inputs as read (without a transform: the model's).
    """
    text = options.get("kernel")
    if not isinstance(text, str) or text in KERNELS:
        return options
    if transform is None:
        spec = standardised(text, names=names, num_dims=num_dims, x_scale=None)
    else:
        spec = standardised(text, names=names, num_dims=transform.num_input_dims,
                            x_scale=list(transform.x_std), y_var=transform.y_std ** 2,
                            kept=list(transform.kept_columns))
    return {**options, "kernel": spec.text}


def composed_dtype(options: Mapping[str, Any], dtype: str | None) -> str | None:
    """The training dtype: ``dtype`` when given, float64 for a kernel expression (its terms'
    scales differ by orders of magnitude: a smooth trend's K_zz in float32 is singular to
    working precision), else ``None`` (the method's default)."""
    kernel = options.get("kernel")
    if dtype is None and ((isinstance(kernel, str) and kernel not in KERNELS)
                          or isinstance(kernel, gpytorch.kernels.Kernel)):
        return "float64"
    return dtype


def prior_options_with(*, kernel: str = "matern32", ard: bool = True, noise: bool = True,
                       composed: bool = True, names_only_why: str = "",
                       refuse: Callable[[str], str | None] | None = None,
                       objects: bool = False) -> tuple[Option, ...]:
    """The prior options every baseline-style method takes, with that method's defaults; the
    ``noise`` option (a GPyTorch Gaussian likelihood's) is at least
    :data:`GPYTORCH_NOISE_FLOOR`. ``composed``: the method takes kernel expressions (it needs
    only products with K), else only the names of :data:`~gpscale.kernels.KERNELS`, and an
    expression is refused with ``names_only_why``; ``refuse``: the expressions a method that
    takes some refuses, and why (:attr:`Option.refuse`); ``objects``: it also takes a GPyTorch
    kernel object (methods that only evaluate K)."""
    kernel_option = (
        Option("kernel", "kernel", kernel, "covariance function: a name, or an expression "
               "such as 'rbf(0,1) * periodic(2) + matern32(3:)' (guide: kernels)",
               refuse=refuse, objects=objects)
        if composed else Option("kernel", "str", kernel, "covariance function", choices=KERNELS,
                                choices_why=names_only_why))
    opts = (
        kernel_option,
        Option("ard", "bool", ard, "one lengthscale per input dimension"),
        Option("lengthscale", "floats", None, "initial lengthscale(s) of a named kernel; none: "
               "√d", minimum=0, exclusive=True),
        Option("outputscale", "float", None, "initial kernel variance; none: var(y)",
               minimum=0, exclusive=True),
        Option("noise", "float", None, "initial noise variance σ²; none: 0.1 var(y)",
               minimum=GPYTORCH_NOISE_FLOOR,
               minimum_why="the floor of GPyTorch's Gaussian likelihood"),
        Option("mean_constant", "float", None, "initial constant prior mean; none: mean(y)"),
    )
    return opts if noise else tuple(o for o in opts if o.name != "noise")


PRIOR_OPTIONS = prior_options_with(objects=True)

AUTO_PREFIT_MIN_POINTS = 10_000
"""``prefit='auto'`` pre-fits above this many training points. Below it CaGP-Opt's O(n²) epoch is
cheap enough for many hundreds of epochs in the default budget, and its default start, trained
that long, ends better than the pre-fit's; above it the budget holds too few epochs to get far
from the default start, and the pre-fit wins (BENCHMARKS "defaults")."""

PREFIT_AUTO, PREFIT_EXACT, PREFIT_OFF = "auto", "exact", "off"
"""The values of the ``prefit`` option (:data:`PREFIT_OPTIONS`)."""

PREFIT_OPTIONS = (
    Option("prefit", "str", PREFIT_AUTO, "exact: start the lengthscales, outputscale and noise "
           "not given from an exact GP fitted to a random subset (L-BFGS); off: √d, var(y), "
           f"0.1 var(y); auto: exact above {AUTO_PREFIT_MIN_POINTS:,} training points",
           choices=(PREFIT_AUTO, PREFIT_EXACT, PREFIT_OFF)),
    Option("prefit_size", "int", 2000, "points of the pre-fit's subset", minimum=2),
    Option("prefit_max_lr", "float", 0.1, "training's learning rate is at most this from a "
           "pre-fitted start", minimum=0.0, exclusive=True),
)
"""Options of a regression method whose training starts from an exact GP on a subset (run by
the training harness, :func:`gpscale.training.prefit.fill_prefit_options`)."""

INDUCING_OPTIONS = (
    Option("num_inducing", "int", None, "inducing points m (k-means initialised); none: "
           "min(512, n/2)", minimum=1),
    Option("seed", "int", 0, "seeds k-means and other random initialisation"),
    Option("kmeans_max_points", "int", 10_000, "k-means runs on at most this many rows",
           minimum=1),
)

KERNEL_PRODUCT_OPTIONS = (
    Option("chunk_size", "int", None, "rows per block of the matrix-free kernel products; "
           "none: chosen from memory", minimum=1),
    Option("backend", "str", "auto", "kernel-product backend",
           choices=BACKENDS),
)
