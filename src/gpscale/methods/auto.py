"""``method="auto"``: pick a method key from the task, the data's size and the machine's memory.

For regression beyond the exact GP's rule, ``auto`` races the keys :func:`race_candidates`
lists on held-out rows of the user's data (:mod:`gpscale.training.race`, the default mode);
the rules below decide the rest — small data, classification, counts — and everything under
``-o auto=rules`` (:data:`AUTO_MODES`), in seconds.

The rules are the README's "which method when" table, and each comes from a measurement in
BENCHMARKS.md (all with each method's defaults, on a CPU; the figures are in
docs/notes/benchmarks-2026-12.md, "Evidence moved out of the code"):

=====================  ===============================  ==========================================
task                   data                             method and why
=====================  ===============================  ==========================================
regression             n ≤ 2,000 (n×n fits in memory)   ``exact``: the reference, seconds at this n
regression             d ≤ 3, or a kernel expression    ``ggp``: grid interpolation, each solver
                       summing kernels on groups of     iteration O(m log m) whatever n is; as
                       ≤ 3 inputs                       accurate as the exact GP on
                                                        low-dimensional fields (additive: one
                                                        grid per group)
regression             n ≤ 50,000, probe ratio          ``svgp``: a probe (an exact GP on 1,000
                       ρ < 1.6                          points, seconds; :class:`Probe`) finds
                                                        that 512 inducing points miss little
                                                        beside the error that GP makes; there
                                                        CaGP-Opt is at most a few percent more
                                                        accurate for several times the time,
                                                        and SVGP converges in minutes
regression             n ≤ 50,000, otherwise            ``cagp-opt``: best or near-best test NLL
                                                        and RMSE on targets a small exact GP
                                                        predicts closely (ρ ≥ 1.6), where the
                                                        inducing points' error would dominate
                                                        SVGP's; above 10,000 points it starts
                                                        from an exact-GP pre-fit
regression             larger n                         ``solvegp``: minibatch, two inducing sets;
                                                        SVGP-512's NLL at a lower step time;
                                                        learns which inputs matter
classification         n·C ≤ 200,000                    ``iterncgp``: computation-aware Laplace,
                                                        minutes at this size
classification         larger                           ``svgp``: minibatch, O(M³) per step
counts                 any n                            ``iterncgp`` (Poisson): the only key
=====================  ===============================  ==========================================

:func:`choose_method` returns the key and a one-line reason that ``gpscale fit`` and the
estimators print (logger ``gpscale.fit``).
"""

from __future__ import annotations

import difflib
import logging
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpscale.kernels import is_expression
from gpscale.kernels.algebra import parse_kernel
from gpscale.limits import available_memory, device_memory
from gpscale.methods.options import AUTO_PREFIT_MIN_POINTS, OptionError
from gpscale.methods.registry import get_spec

__all__ = ["AUTO", "AUTO_MODES", "split_mode", "race_candidates", "RACE_EXACT_MAX_N", "RULES",
           "Choice", "Probe", "choose_method", "needs_probe", "candidates",
           "check_options", "resolve_options", "pick", "PROBE_RATIO_MIN", "PROBE_METHOD",
           "LINEAR_MEMORY", "available_memory", "device_memory", "EXACT_MAX_N",
           "GRID_MAX_DIMS", "CAGP_MAX_N", "CAGP_MAX_N_GPU", "ITERNCGP_MAX_NC"]

log = logging.getLogger("gpscale.fit")

AUTO = "auto"
EXACT_MAX_N = 2_000
"""Largest n for the exact GP (its Cholesky is O(n³) every epoch)."""
GRID_MAX_DIMS = 3
"""Largest input dimension for grid interpolation (m grows as grid_size^d)."""
CAGP_MAX_N = 50_000
"""Largest n for CaGP-Opt (an epoch is O(n²·i)), where the probe (:data:`PROBE_RATIO_MIN`) finds
a target a small exact GP predicts closely. Starting from the exact-GP pre-fit
(:data:`~gpscale.methods.options.AUTO_PREFIT_MIN_POINTS`), its defaults beat SOLVE-GP's in the
default time budget up to here. Beyond it the budget holds too few of its epochs: the two tie,
and SOLVE-GP, whose cost per step does not grow with n, gets there sooner."""
ITERNCGP_MAX_NC = 200_000
"""Largest n·C (latent function values) for IterNCGP; SVGP beyond."""
EXACT_MEMORY_COPIES = 4
"""Dense n×n float64 arrays the exact GP holds at once (K, its factor, gradients)."""
GPU_EXACT_MEMORY_FRACTION = 0.8
"""On a GPU ``auto`` takes the exact GP while its matrices need at most this fraction of the
free memory (the rest for the caching allocator's fragments and the kernel's row blocks)."""
CAGP_MAX_N_GPU = 200_000
"""Largest n for CaGP-Opt on a GPU. Its epoch costs O(n²·i) kernel entries, and a GPU computes
an epoch more than 16× faster than a CPU: at 4× the CPU's :data:`CAGP_MAX_N` an epoch costs 16×
the work, so the GPU fits at least as many epochs in the budget as the CPU does at its boundary.
An extrapolation from the epoch's cost, not a boundary found on a card."""

PROBE_RATIO_MIN = 1.6
"""Least probe ratio ρ — the mean Nyström residual of SVGP's 512 inducing points over the
held-out squared error of an exact GP on 1,000 points, both at that GP's hyperparameters
(:class:`Probe`) — for which ``auto`` takes CaGP-Opt over SVGP between the exact GP's and
SOLVE-GP's ranges, set from both keys' defaults (evidence: BENCHMARKS "auto on the clock"). Where
the inducing points miss little (small ρ) CaGP-Opt is about as accurate as SVGP for more time,
so SVGP, the faster key, serves; where they miss more than the exact GP's own error, CaGP-Opt is
clearly more accurate at a few times SVGP's time. The boundary sits in the gap between the
sets measured on either side; more sets would place it better."""
PROBE_METHOD = "exact"
"""The key of the probe's GP (:func:`gpscale.training.probe.inducing_probe`) and of the race's
shared start (:func:`gpscale.training.race.shared_start`)."""
LINEAR_MEMORY = ("cagp-opt", "svgp", "solvegp", "softki")
"""The keys ``auto`` picks for regression beyond the exact GP whose memory is linear in n: the
advice where a dense method's matrices do not fit (:mod:`gpscale.devices`)."""

RULES: tuple[tuple[str, str, str], ...] = (
    ("regression", f"n ≤ {EXACT_MAX_N:,} and n×n fits in memory (on a GPU: any n whose "
                   "matrices fit in its free memory)", "exact"),
    ("regression", f"d ≤ {GRID_MAX_DIMS}", "ggp"),
    ("regression", f"d > {GRID_MAX_DIMS}, n ≤ {CAGP_MAX_N:,} ({CAGP_MAX_N_GPU:,} on a GPU), "
                   f"probe ratio ρ < {PROBE_RATIO_MIN:g}", "svgp"),
    ("regression", f"d > {GRID_MAX_DIMS}, n ≤ {CAGP_MAX_N:,} ({CAGP_MAX_N_GPU:,} on a GPU), "
                   f"probe ratio ρ ≥ {PROBE_RATIO_MIN:g} or no probe", "cagp-opt"),
    ("regression", f"d > {GRID_MAX_DIMS}, n > {CAGP_MAX_N:,} ({CAGP_MAX_N_GPU:,} on a GPU)",
     "solvegp"),
    ("classification", f"n·C ≤ {ITERNCGP_MAX_NC:,} (C = 1 when binary)", "iterncgp"),
    ("classification", f"n·C > {ITERNCGP_MAX_NC:,}", "svgp"),
    ("counts", "any", "iterncgp"),
)
"""Rows of (task, condition, method), first match wins; ``gpscale methods auto`` prints them."""


@dataclass(frozen=True)
class Choice:
    """A method key and why it was chosen (one line)."""

    method: str
    reason: str


@dataclass(frozen=True)
class Probe:
    """What :func:`gpscale.training.probe.inducing_probe` measured on the training data.

    Attributes:
        noise: the probe's exact GP's noise variance (standardised target).
        outputscale: its outputscale.
        residual: mean Nyström residual k(x, x) − k_xZ K_ZZ⁻¹ k_Zx of ``num_inducing``
            k-means inducing points Z at its hyperparameters.
        num_inducing: the inducing points.
        points: the exact GP's training points.
        seconds: the probe's time.
        error: the exact GP's mean squared error on up to 500 other training points.
    """

    noise: float
    outputscale: float
    residual: float
    num_inducing: int
    points: int
    seconds: float
    error: float = math.nan

    @property
    def ratio(self) -> float:
        """ρ = residual / error (the noise where no held-out error was measured): how far what
        the inducing points miss exceeds what a small exact GP already gets wrong."""
        scale = self.error if math.isfinite(self.error) else self.noise
        return self.residual / scale

    @property
    def gain(self) -> float:
        """√(1 + ρ) − 1: a rough scale of the relative RMSE a closer-to-exact method could gain
        over the inducing points (their error ≈ the exact GP's plus the residual)."""
        return math.sqrt(1.0 + self.ratio) - 1.0

    def describe(self) -> str:
        """One line: ``an exact GP on 1,000 points (3 s): held-out error 0.15 (noise 0.136),
        residual of 512 inducing points 0.0077, ρ = 0.051``."""
        return (f"an exact GP on {self.points:,} points ({self.seconds:.0f} s): held-out "
                f"error {self.error:.3g} (noise {self.noise:.3g}), residual of "
                f"{self.num_inducing} inducing points {self.residual:.3g}, ρ = {self.ratio:.3g}")


def choose_method(task: str, n: int, d: int, *, num_classes: int | None = None,
                  memory: int | None = None, device: Any = None,
                  probe: Probe | None = None) -> Choice:
    """The method ``"auto"`` stands for on ``n`` points with ``d`` inputs (module table).

    On a GPU (``device`` a CUDA ``torch.device``) regression takes the exact GP as far as its
    n × n matrices fit in the card's free memory (its Cholesky is seconds there, whatever n
    fits), and CaGP-Opt up to :data:`CAGP_MAX_N_GPU` points.

    Args:
        task: ``"regression"``, ``"classification"`` or ``"counts"``.
        n, d: training points and input dimensions.
        num_classes: classes of a classification task (2 when not given).
        memory: bytes available; ``None`` reads the device's (the GPU's free memory, else
            :func:`available_memory`).
        device: where the method will train (``None``: the CPU).
        probe: the data's :class:`Probe`, used where the size rules give CaGP-Opt
            (:func:`needs_probe`): below :data:`PROBE_RATIO_MIN` SVGP instead. Without one
            the size rules alone decide.
    """
    if n < 1 or d < 1:
        raise ValueError(f"method 'auto' needs data: got n={n}, d={d}")
    if task == "counts":
        return Choice("iterncgp", "counts: iterncgp (Poisson likelihood, computation-aware "
                                  "Laplace) is the method for count data")
    if task == "classification":
        c = max(int(num_classes or 2), 2)
        latent = n * (c if c > 2 else 1)
        size = f"classification, n = {n:,}, {c} classes: n·C = {latent:,}"
        if latent <= ITERNCGP_MAX_NC:
            return Choice("iterncgp", f"{size} ≤ {ITERNCGP_MAX_NC:,}: iterncgp "
                                      "(computation-aware Laplace)")
        return Choice("svgp", f"{size} > {ITERNCGP_MAX_NC:,}: svgp (minibatch variational "
                              "inference)")
    if task != "regression":
        raise ValueError(f"unknown task {task!r}; expected regression, classification or counts")
    gpu = device is not None and getattr(device, "type", None) == "cuda"
    if gpu:
        return _choose_on_gpu(n, d, memory, device, probe)
    memory = available_memory() if memory is None else memory
    dense_bytes = EXACT_MEMORY_COPIES * 8 * n * n
    fits = memory is None or dense_bytes <= memory // 2
    if n <= EXACT_MAX_N and fits:
        return Choice("exact", f"n = {n:,} ≤ {EXACT_MAX_N:,}: the exact GP is affordable")
    if n <= EXACT_MAX_N:
        why = f"n = {n:,} but {dense_bytes / 2**30:.1f} GiB of dense matrices do not fit; "
    else:
        why = f"n = {n:,} > {EXACT_MAX_N:,} (exact is O(n³)); "
    return _beyond_exact(why, n, d, CAGP_MAX_N, probe)


def _choose_on_gpu(n: int, d: int, memory: int | None, device: Any,
                   probe: Probe | None) -> Choice:
    """Regression on a GPU: exact while its float64 matrices fit, then as on the CPU with
    CaGP-Opt's bound :data:`CAGP_MAX_N_GPU`."""
    if memory is None:
        free = device_memory(device)
        memory = None if free is None else free[0]
    dense_bytes = get_spec("exact").dense_copies * 8 * n * n
    if memory is None or dense_bytes <= GPU_EXACT_MEMORY_FRACTION * memory:
        return Choice("exact", f"n = {n:,} on {device}: the exact GP's {dense_bytes / 2**30:.1f} "
                               "GiB of float64 matrices fit in the GPU's free memory")
    why = (f"n = {n:,} on {device}: the exact GP's {dense_bytes / 2**30:.1f} GiB of matrices "
           f"exceed the GPU's {memory / 2**30:.1f} GiB free; ")
    return _beyond_exact(why, n, d, CAGP_MAX_N_GPU, probe)


def _beyond_exact(why: str, n: int, d: int, cagp_max_n: int, probe: Probe | None) -> Choice:
    """Regression where the exact GP does not fit: grid, SVGP, CaGP-Opt or SOLVE-GP."""
    if d <= GRID_MAX_DIMS:
        return Choice("ggp", why + f"d = {d} ≤ {GRID_MAX_DIMS}: ggp (grid interpolation, "
                                   "solver cost independent of n)")
    if n <= cagp_max_n:
        band = f"d = {d} > {GRID_MAX_DIMS} and n ≤ {cagp_max_n:,}"
        if probe is not None and probe.ratio < PROBE_RATIO_MIN:
            return Choice("svgp", why + f"{band}; probe: {probe.describe()} < "
                                        f"{PROBE_RATIO_MIN:g}: svgp (minibatch, it converged in "
                                        "1–2.5 minutes at 5,000–41,000 points); cagp-opt would "
                                        "take up to its whole time budget for a few percent "
                                        "lower RMSE where the inducing points miss little "
                                        "beside the error a small exact GP makes (scale: "
                                        f"~{probe.gain:.0%})")
        seen = "" if probe is None else (f"; probe: {probe.describe()} ≥ {PROBE_RATIO_MIN:g}: "
                                         "the inducing points' error would dominate")
        slower = ("" if n <= AUTO_PREFIT_MIN_POINTS else "; it may use its whole time budget "
                  "after an exact-GP pre-fit, --method svgp converges sooner")
        return Choice("cagp-opt", why + f"{band}{seen}: cagp-opt (computation-aware, most "
                                        f"accurate at this size{slower})")
    # Not softki yet: with held-out rows its defaults match or beat SOLVE-GP's on the large sets
    # measured, but SOLVE-GP learns which inputs matter better, and too few sets have been
    # measured to decide a default (evidence: docs/notes/benchmarks-2026-12.md).
    return Choice("solvegp", why + f"d = {d} > {GRID_MAX_DIMS} and n > {cagp_max_n:,}: solvegp "
                                   "(minibatch, two inducing sets)")


def candidates(task: str) -> list[str]:
    """The keys ``auto`` can pick for ``task``, in the order of :data:`RULES`."""
    keys = [key for rule_task, _, key in RULES if rule_task == task]
    if not keys:
        raise ValueError(f"unknown task {task!r}; expected regression, classification or counts")
    return list(dict.fromkeys(keys))


def check_options(task: str, options: Mapping[str, Any]) -> None:
    """Options given with ``method="auto"``, checked before the choice is made: each must be
    declared by a method ``auto`` can pick for ``task``, with a value that fits it.

    Raises:
        OptionError: naming the option, the methods it was checked against and the close
            matches, or the value's problem.
    """
    keys = candidates(task)
    _, options = split_mode(options)  # auto's own option
    for name, value in options.items():
        declaring = [k for k in keys if any(o.name == name for o in get_spec(k).options)]
        if not declaring:
            names = sorted({o.name for k in keys for o in get_spec(k).options if not o.hidden})
            close = difflib.get_close_matches(str(name), names, 1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise OptionError(f"unknown option {name!r} for method 'auto' (none of "
                              f"{', '.join(keys)} declares it){hint}; their options: "
                              f"{', '.join(names)}")
        errors = []
        for key in declaring:  # the value must fit one of them (a kernel expression: not all)
            try:
                get_spec(key).resolve({name: value}, fill_defaults=False)
                break
            except OptionError as err:
                errors.append(err)
        else:
            raise errors[0]


def resolve_options(choice: Choice, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` typed for the chosen method; an option it does not take is an
    :class:`OptionError` that says ``auto`` chose it and why."""
    try:
        return get_spec(choice.method).resolve(dict(options), fill_defaults=False)
    except OptionError as err:
        raise OptionError(f"method 'auto' chose {choice.method!r} ({choice.reason}): {err}; "
                          "name a method to use these options") from None


AUTO_MODES = ("race", "rules")
"""Values of ``auto``'s own option ``-o auto=MODE``: ``race`` (the default) fits the candidate
methods on held-out rows and keeps the best (:mod:`gpscale.training.race`); ``rules`` chooses by
this module's table alone, in seconds."""
RACE_EXACT_MAX_N = 5_000
"""Largest n at which the exact GP races beyond :data:`EXACT_MAX_N`: its Cholesky takes about a
second here, so a race slice holds several of its epochs."""
RACE_ALWAYS = ("svgp", "solvegp", "softki")
"""The minibatch keys that race at any n."""


def split_mode(options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(``auto``'s mode, the other options): the mode is the option ``auto``
    (:data:`AUTO_MODES`, default ``race``), which no method declares."""
    rest = dict(options)
    mode = str(rest.pop("auto", "race")).strip().lower()
    if mode not in AUTO_MODES:
        raise OptionError(f"option auto={mode!r} of method 'auto': expected one of "
                          f"{', '.join(AUTO_MODES)}")
    return mode, rest


def race_candidates(task: str, n: int, d: int, options: Mapping[str, Any], *,
                    memory: int | None = None, device: Any = None,
                    parallel: bool = False) -> list[str]:
    """The keys that race for ``auto`` on this data, in the order that breaks a tie; an empty
    list where the rules decide alone: a task other than regression (IterNCGP or SVGP by
    size), data the exact GP fits within :data:`EXACT_MAX_N` points (the reference, seconds),
    or fewer than two keys that take ``options``.

    Beyond the exact GP's rule: the exact GP up to :data:`RACE_EXACT_MAX_N` points where its
    matrices fit (not with several processes: it has no data-parallel path), GGP for
    d ≤ :data:`GRID_MAX_DIMS` or an additive kernel expression it takes, CaGP-Opt up to its size
    bound, and :data:`RACE_ALWAYS`; each only where it takes every option given."""
    if task != "regression":
        return []
    rules = choose_method(task, n, d, memory=memory, device=device)
    if rules.method == "exact":
        return []
    gpu = device is not None and getattr(device, "type", None) == "cuda"
    keys = []
    if not parallel and n <= RACE_EXACT_MAX_N and (
            gpu or 8 * EXACT_MEMORY_COPIES * n * n <= (memory or available_memory() or 0) // 2):
        keys.append("exact")
    if n <= (CAGP_MAX_N_GPU if gpu else CAGP_MAX_N):
        keys.append("cagp-opt")
    keys += [*RACE_ALWAYS]
    if d <= GRID_MAX_DIMS or _grids_take(options.get("kernel"), d):
        keys.insert(0, "ggp")
    return [key for key in keys if _takes(key, options)]


def _takes(key: str, options: Mapping[str, Any]) -> bool:
    """Whether method ``key`` declares every option in ``options`` and takes its value."""
    spec = get_spec(key)
    declared = {o.name for o in spec.options}
    if any(name not in declared for name in options):
        return False
    try:
        spec.resolve(dict(options), fill_defaults=False)
    except OptionError:
        return False
    option = next((o for o in spec.options if o.name == "kernel"), None)
    return option is None or option.refusal(options.get("kernel")) is None


COMPOSED_FALLBACK = "svgp"
"""What ``auto`` takes instead of a choice that cannot take the user's kernel expression."""


def _taking_the_kernel(task: str, choice: Choice, options: Mapping[str, Any]) -> Choice:
    """``choice``, or :data:`COMPOSED_FALLBACK` where the user gave a kernel expression that
    the chosen method does not take (its ``kernel`` option takes names only)."""
    kernel = options.get("kernel")
    if not isinstance(kernel, str) or not is_expression(kernel.strip()):
        return choice
    declared = {o.name: o for o in get_spec(choice.method).options}
    option = declared.get("kernel")
    if option is not None and option.kind == "kernel" and option.refusal(kernel) is None:
        return choice
    if task not in get_spec(COMPOSED_FALLBACK).tasks:
        raise OptionError(f"method 'auto' chose {choice.method!r} ({choice.reason}), which "
                          "does not take this kernel expression; name a method that takes "
                          "it (guide: kernels)")
    return Choice(COMPOSED_FALLBACK, f"{choice.reason}; but {choice.method} does not take this "
                                     f"kernel expression, and {COMPOSED_FALLBACK} does")


def _grids_take(kernel: Any, d: int) -> bool:
    """Whether ``kernel`` is an expression ``ggp`` builds on ``d`` inputs: one it takes
    (its option's refusal) whose terms each read at most :data:`GRID_MAX_DIMS` inputs, one
    grid each."""
    if not isinstance(kernel, str) or not is_expression(kernel.strip()):
        return False
    option = next(o for o in get_spec("ggp").options if o.name == "kernel")
    if option.refusal(kernel) is not None:
        return False
    try:
        groups = parse_kernel(kernel.strip()).resolve(d)
    except ValueError:  # a syntax error, or a column beyond d: the option's check names it
        return False
    return all(len({j for cols in term for j in cols}) <= GRID_MAX_DIMS for term in groups)


def _additive_grids(task: str, choice: Choice, options: Mapping[str, Any], d: int) -> Choice:
    """``ggp`` where the exact GP does not fit and the user's kernel is a sum of kernels on
    groups of at most 3 inputs that ggp takes (one grid per group, whatever d is); else
    ``choice``."""
    kernel = options.get("kernel")
    if (task != "regression" or choice.method in ("exact", "ggp")
            or not isinstance(kernel, str) or not is_expression(kernel.strip())):
        return choice
    if not _grids_take(kernel, d):
        return choice
    return Choice("ggp", f"{choice.reason}; but the kernel is a sum of kernels on groups of at "
                         "most 3 inputs: ggp (one grid per group, solver cost independent of n)")


def needs_probe(task: str, n: int, d: int, *, num_classes: int | None = None,
                memory: int | None = None, device: Any = None) -> bool:
    """Whether a :class:`Probe` of the data can change the choice: where the size rules alone
    give CaGP-Opt."""
    return choose_method(task, n, d, num_classes=num_classes, memory=memory,
                         device=device).method == "cagp-opt"


def pick(task: str, n: int, d: int, *, num_classes: int | None,
         options: Mapping[str, Any], device: Any = None,
         probe: Callable[[], Probe] | None = None) -> tuple[Choice, dict[str, Any]]:
    """What ``gpscale fit`` and the estimators do for ``"auto"``: check ``options``, run
    ``probe`` where it can change the choice (:func:`needs_probe`), choose the method for
    ``device`` (``None``: the CPU), log its reason on ``gpscale.fit`` and type the options for
    it. A probe that fails warns, naming the error, and the size rules decide."""
    check_options(task, options)
    measured = None
    if probe is not None and needs_probe(task, n, d, num_classes=num_classes, device=device):
        try:
            measured = probe()
        except (RuntimeError, ValueError) as err:  # a hint only: recover
            warnings.warn(f"method auto: the probe of the data failed ({err}); choosing by "
                          "n and d alone", stacklevel=2)
    choice = choose_method(task, n, d, num_classes=num_classes, device=device, probe=measured)
    choice = _taking_the_kernel(task, _additive_grids(task, choice, options, d), options)
    log.info("method auto: %s", choice.reason)
    return choice, resolve_options(choice, options)
