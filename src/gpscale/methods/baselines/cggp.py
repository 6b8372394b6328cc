r"""``cggp``: GPyTorch's ``ExactGP`` through its CG/Lanczos (BBMM) path.

Gardner, Pleiss, Bindel, Weinberger & Wilson (2018), "GPyTorch: Blackbox Matrix-Matrix Gaussian
Process Inference with GPU Acceleration", arXiv:1809.11165; settings as in Wang et al. (2019),
"Exact Gaussian Processes on a Million Data Points", arXiv:1903.08114 (CG tolerance 1 for
training, pivoted-Cholesky preconditioner). Prediction solves to 10⁻⁴, not their 0.01 (see
below).

The model is :class:`~gpscale.methods.baselines.exact.ExactGPyTorch` (same notation, loss and
predictive) configured with :class:`CGSettings` instead of Cholesky settings; only the linear
algebra differs:

- solves (K + σ²I)⁻¹v by preconditioned CG to relative residual ``cg_tolerance`` (training) or
  ``eval_cg_tolerance`` (prediction), at most ``max_cg_iterations`` iterations;
- log|K + σ²I| by stochastic Lanczos quadrature with ``num_trace_samples`` random probes and at
  most ``max_lanczos_quadrature_iterations`` Lanczos steps, so the loss is a stochastic estimate
  (probes come from torch's global generator; GPyTorch takes no generator);
- a rank-``max_preconditioner_size`` pivoted-Cholesky preconditioner, used when
  n ≥ ``min_preconditioning_size``.

Why prediction solves tighter than training. The predictive variance is
k(x*, x*) − k*ᵀ(K + σ²I)⁻¹k* (R&W Eq. 2.26). CG stopped at residual r leaves the quadratic form
short by rᵀ(K + σ²I)⁻¹r ≤ ‖r‖²/σ², so a relative residual that serves the mean (0.01) leaves
the variance too large wherever σ² is small against ‖k*‖: the 95 % intervals then cover far
more than 95 % of new points. At 10⁻⁴ the variances agree with a Cholesky's to a fraction of a
percent on the project's UCI sets, at a few times the prediction's cost (docs/notes).

Cost: O(n² · iterations) time per loss (the kernel matrix is formed densely by GPyTorch's
lazy kernel tensor), O(n²) memory.

GPyTorch settings fixed inside every call (:meth:`CGSettings.context`): ``max_cholesky_size`` 0
(never Cholesky), ``fast_computations`` on, the options above, ``fast_pred_var`` off,
``skip_posterior_variances`` off, ``detach_test_caches`` off, ``deterministic_probes`` off,
``terminate_cg_by_size`` off, ``debug`` off. All are recorded in ``model.options``.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any

import gpytorch
from torch import Tensor

from gpscale.methods._common import (
    check_task_and_init,
    follow_init,
    gaussian_likelihood,
    prior_modules,
    prior_options,
    translate_cholesky_errors,
)
from gpscale.methods.baselines.exact import ExactGPyTorch
from gpscale.methods.baselines.pipeline import PIPELINE
from gpscale.methods.options import PRIOR_OPTIONS, Option
from gpscale.methods.registry import MethodSpec, register

__all__ = ["CGSettings", "build_cggp"]


@dataclass(frozen=True)
class CGSettings:
    """GPyTorch settings of the CG/Lanczos path (defaults: GPyTorch's own, as in Wang et al.,
    but ``eval_cg_tolerance``: see the module docstring).

    Attributes:
        cg_tolerance: relative residual at which training-time CG stops.
        eval_cg_tolerance: the same for prediction.
        max_cg_iterations: CG iteration cap.
        num_trace_samples: random probes of the stochastic log-determinant estimate.
        max_lanczos_quadrature_iterations: Lanczos steps of the log-determinant quadrature.
        max_preconditioner_size: rank of the pivoted-Cholesky preconditioner (0: none).
        min_preconditioning_size: smallest n at which the preconditioner is used.
    """

    cg_tolerance: float = 1.0
    eval_cg_tolerance: float = 1e-4
    max_cg_iterations: int = 1000
    num_trace_samples: int = 10
    max_lanczos_quadrature_iterations: int = 20
    max_preconditioner_size: int = 15
    min_preconditioning_size: int = 2000

    def __post_init__(self):
        for name in ("cg_tolerance", "eval_cg_tolerance"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive; got {getattr(self, name)}")
        for name in ("max_cg_iterations", "num_trace_samples",
                     "max_lanczos_quadrature_iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")
        if self.max_preconditioner_size < 0 or self.min_preconditioning_size < 0:
            raise ValueError("max_preconditioner_size and min_preconditioning_size must be ≥ 0")

    def context(self) -> contextlib.ExitStack:
        """Enter every GPyTorch setting this baseline depends on (see the module docstring)."""
        s = gpytorch.settings
        stack = contextlib.ExitStack()
        for manager in (
            s.max_cholesky_size(0),
            s.fast_computations(covar_root_decomposition=True, log_prob=True, solves=True),
            s.cg_tolerance(self.cg_tolerance),
            s.eval_cg_tolerance(self.eval_cg_tolerance),
            s.max_cg_iterations(self.max_cg_iterations),
            s.num_trace_samples(self.num_trace_samples),
            s.max_lanczos_quadrature_iterations(self.max_lanczos_quadrature_iterations),
            s.max_preconditioner_size(self.max_preconditioner_size),
            s.min_preconditioning_size(self.min_preconditioning_size),
            s.fast_pred_var(False),
            s.skip_posterior_variances(False),
            s.detach_test_caches(False),
            s.deterministic_probes(False),
            s.terminate_cg_by_size(False),
            s.debug(False),
            translate_cholesky_errors(
                "preconditioner", "Lower max_preconditioner_size or start from a larger noise."),
        ):
            stack.enter_context(manager)
        return stack


def build_cggp(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
               init: tuple[Tensor, Tensor] | None = None, cg_tolerance: float = 1.0,
               eval_cg_tolerance: float = 1e-4, max_cg_iterations: int = 1000,
               num_trace_samples: int = 10, max_lanczos_quadrature_iterations: int = 20,
               max_preconditioner_size: int = 15, min_preconditioning_size: int = 2000,
               **prior: Any) -> ExactGPyTorch:
    """Factory of ``cggp`` (see :mod:`gpscale.methods.registry`).

    Args:
        num_dims: input dimension d.
        task: must be ``"regression"``.
        num_classes: unused (regression).
        init: ``(x, y)`` for data-dependent initial hyperparameters, or ``None`` to rebuild.
        cg_tolerance: with ``eval_cg_tolerance``, ``max_cg_iterations``, ``num_trace_samples``,
            ``max_lanczos_quadrature_iterations``, ``max_preconditioner_size`` and
            ``min_preconditioning_size``, the fields of :class:`CGSettings`.
        **prior: ``kernel``, ``ard``, ``lengthscale``, ``outputscale``, ``noise``,
            ``mean_constant`` (see :func:`~gpscale.methods._common.prior_options`).

    Raises:
        ValueError: for a task other than regression, invalid settings or ``init`` data.
    """
    check_task_and_init("cggp", task, ("regression",), num_dims, init)
    settings = CGSettings(cg_tolerance, eval_cg_tolerance, max_cg_iterations, num_trace_samples,
                          max_lanczos_quadrature_iterations, max_preconditioner_size,
                          min_preconditioning_size)
    opts = prior_options(init, task, num_dims, **prior)
    mean, kernel = prior_modules(num_dims, opts)
    model = ExactGPyTorch(mean, kernel, gaussian_likelihood(opts["noise"]), settings,
                          num_dims=num_dims, options={**opts, **asdict(settings)})
    return follow_init(model, init)


register(MethodSpec(
    key="cggp",
    **PIPELINE["cggp"],
    factory=build_cggp,
    tasks=("regression",),
    summary="GPyTorch ExactGP through CG/Lanczos (BBMM), pivoted-Cholesky preconditioner",
    options=PRIOR_OPTIONS + (
        Option("cg_tolerance", "float", 1.0, "CG residual tolerance in training", minimum=0,
               exclusive=True),
        Option("eval_cg_tolerance", "float", 1e-4, "CG residual tolerance at prediction "
               "(the variances need a tight one)",
               minimum=0, exclusive=True),
        Option("max_cg_iterations", "int", 1000, "most CG iterations per solve", minimum=1),
        Option("num_trace_samples", "int", 10, "probe vectors of the stochastic trace",
               minimum=1),
        Option("max_lanczos_quadrature_iterations", "int", 20,
               "Lanczos iterations of the log-determinant estimate", minimum=1),
        Option("max_preconditioner_size", "int", 15, "rank of the pivoted-Cholesky "
               "preconditioner", minimum=0),
        Option("min_preconditioning_size", "int", 2000, "precondition only from this n on",
               minimum=0),
    ),
))
