"""What the pipeline needs to know about ``iterncgp`` and ``sod-laplace`` beside their options:
training defaults per preset, the SVGP pre-fit of a fixed kernel, IterNCGP's plan line and
small test options (:class:`~gpscale.methods.registry.MethodSpec` fields, spread by each key's
``register`` call).

Neither trains by gradient steps (``trainable`` is False; float64 as the paper). IterNCGP learns
its kernel by default, in rounds of L-BFGS and warm-started refinements, not epochs: the default
budget bounds the rounds (the final conditioning runs after it). A kernel neither given nor
learned comes from a short SVGP fit (paper 000, §C.4; the ``prefit_*`` options); IterNCGP's
classification that learns its kernel starts from the median distance instead, which reaches the
same θ without the pre-fit's time. A kernel expression is never pre-fitted, since the pre-fit
reads back one named kernel's values: it starts from the median distance too, beside its own
start values (:mod:`gpscale.methods.iterncgp.composed`). The test options fix the kernel, so
that no pre-fit runs.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from gpscale.kernels import is_expression
from gpscale.methods.iterncgp.evidence import learning_points
from gpscale.methods.iterncgp.latent import resolve_ard
from gpscale.methods.registry import DEFAULT_BUDGET_S, FULL_BATCH, Prefit

__all__ = ["PIPELINE", "prefit_arguments", "learns_from_median", "plan_text"]

_OBJECTIVE_TEXT = {"variational": "the evidence lower bound of the variational posterior",
                   "elbo": "the computation-aware Laplace evidence",
                   "projected": "the projected pseudo-target likelihood"}


def plan_text(opts: dict[str, Any], max_time: float | None, num_train: int | None,
              num_latents: int) -> str:
    """How the run will go, for ``gpscale fit``'s plan line: no gradient training; kernel
    rounds (on how many of the ``num_train`` points, for ``num_latents`` latent functions,
    within ``max_time``) or conditioning once with a fixed kernel."""
    variational = opts.get("inference", "laplace") == "variational"
    posterior = "variational" if variational else "Laplace"
    fixed = ("its start values" if is_expression(opts["kernel"])
             else "given or SVGP pre-fitted")
    if not opts["learn_kernel"]:
        return (f"conditioning once with a fixed kernel, {posterior} posterior (nothing to "
                "train; -o learn_kernel=true learns the kernel)")
    objective = opts.get("kernel_objective", "elbo")
    if objective == "auto":
        objective = "variational" if variational else "elbo"
    limit = "" if max_time is None else f" or {max_time:g} s"
    points = (None if num_train is None
              else learning_points(opts.get("learn_points"), num_train, num_latents))
    subset = ("" if points is None or points >= num_train else
              f" on {points:,} random points of {num_train:,}, then conditioning on all "
              "(-o learn_points=0: rounds on all; ")
    return (f"learning the kernel on {_OBJECTIVE_TEXT[objective]}, at most "
            f"{opts['kernel_rounds']} rounds{limit} of L-BFGS steps and Newton restarts"
            f"{subset or ' ('}-o learn_kernel=false keeps a fixed kernel: {fixed})")


def prefit_arguments(opts: dict[str, Any], x: Tensor) -> dict[str, Any]:
    """The SVGP pre-fit's settings from resolved options ``opts``
    (:func:`gpscale.training.prefit.prefit_hyperparameters`)."""
    return dict(kernel=opts["kernel"], ard=resolve_ard(opts["ard"], x.shape[1]),
                per_latent=not opts["shared_kernel"], num_inducing=opts["prefit_num_inducing"],
                steps=opts["prefit_steps"], lr=opts["prefit_lr"],
                batch_size=opts["prefit_batch_size"], seed=opts["seed"])


def learns_from_median(opts: dict[str, Any], task: str) -> bool:
    """Classification that learns its kernel starts from the median distance, not a pre-fit;
    so does a kernel expression (either key, any task), which the pre-fit cannot read back."""
    return (is_expression(opts["kernel"])
            or (bool(opts.get("learn_kernel")) and task == "classification"))


_ONCE = {**FULL_BATCH, "epochs": 1}

PIPELINE: dict[str, dict[str, Any]] = {
    "iterncgp": dict(
        training_defaults={"paper": _ONCE, "default": {**_ONCE, "max_time": DEFAULT_BUDGET_S}},
        prefit=Prefit("kernel", model="svgp", arguments=prefit_arguments,
                      learned_start=learns_from_median),
        plan=plan_text,
        test_options={"lengthscale": 0.8, "outputscale": 2.0}),
    "sod-laplace": dict(
        training_defaults={"paper": _ONCE, "default": _ONCE},
        prefit=Prefit("kernel", model="svgp", arguments=prefit_arguments,
                      learned_start=learns_from_median),
        test_options={"lengthscale": 0.8, "outputscale": 2.0, "num_subset": 30}),
}
"""The declarations of ``iterncgp`` and ``sod-laplace`` (module docstring)."""
