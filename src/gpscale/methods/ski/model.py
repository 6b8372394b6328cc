r"""``ski`` and ``ggp``: structured kernel interpolation, and the same model from sufficient stats.

Wilson & Nickisch (2015), KISS-GP / SKI; Yadav, Sheldon & Musco (2021), "Faster Kernel
Interpolation for Gaussian Processes", AISTATS, arXiv:2101.11751 (notes/002_fki.md).

=========  ======================  ==========================================================
symbol     variable                meaning
=========  ======================  ==========================================================
G, m       ``grid``                regular grid (:mod:`gpscale.linalg.interpolation`), m nodes
W          ``rows``                (n, m) interpolation, s^d entries per row (cubic s = 4)
K_G        ``GK``                  kernel on the grid (Kronecker/multilevel Toeplitz, FFT)
K̃          —                       W K_G Wᵀ + σ²I, the SKI covariance of y (Def. 1)
r          —                       y − μ (constant prior mean μ)
WᵀW, Wᵀr   ``stats.gram``, ``h``   sufficient statistics (§4.5), stencil of 7^d offsets
z̃          —                       K̃⁻¹ r;  ẑ = Wᵀz̃ (m);  z̄ = K_G ẑ (Theorem 1: E[θ | y])
a          ``mean_weights``        K_G Wᵀ z̃: the predictive mean is μ + w_*ᵀ a
=========  ======================  ==========================================================

``ski`` runs CG on the n × n operator K̃ (O(n s^d + m log m) per iteration, the paper's
baseline). ``ggp`` (the paper's GSGP) accumulates WᵀW, Wᵀr-parts, yᵀy, n in one streaming pass
(:func:`sufficient_statistics`, from tensors, NumPy memmaps or any iterable of chunks) and then
runs the *same* CG iterations in factorized form (Prop. 1; corrected Alg. 3,
:func:`gpscale.linalg.factorized.factorized_cg`): one K_G and one WᵀW product per iteration,
O(m 7^d + m log m), independent of n.

Log marginal likelihood (Fact 2, Def. 1), per datum as the loss:
−log p(y)/n = [rᵀK̃⁻¹r + log det K̃ + n log 2π] / (2n), with (eq. 9)
log det K̃ = log det(K_G WᵀW + σ²I) + (n − m) log σ².

* ``solver='auto'`` (default): ``'preconditioned'`` when K_G is a Kronecker product (RBF, or any
  kernel in 1-D) with per-dimension sizes ≤ 4,096, else ``'iterative'``.
* ``solver='preconditioned'`` (beyond the paper): the same terms from the m-dimensional SPD
  system σ²I + L WᵀW L (K_G = L²) by CG preconditioned with the Kronecker-diagonalisable
  σ²I + L B̄ L, B̄ the product of WᵀW's per-dimension marginals (:mod:`gpscale.linalg.whitened`):
  a handful of iterations where the factorized CG needs hundreds to thousands (its count grows
  with the points per grid node). rᵀK̃⁻¹r, Wᵀz̃ and the probes' Wᵀx_l, z_lᵀx_l follow from
  a = K_G Wᵀ K̃⁻¹ b by Woodbury; log det K̃ by SLQ on the preconditioned m × m system with m-dim
  probes drawn from N(0, P) (``seed``); gradients by the same surrogates as below.
* ``solver='iterative'``: rᵀK̃⁻¹r from the factorized CG solve with b = r; log det K̃
  by stochastic Lanczos quadrature with p Rademacher probes z_l ∈ ℝⁿ whose Wᵀz_l are accumulated
  in the same streaming pass (notes §5.9: probes are fixed per data set, so the objective is
  deterministic across epochs); T_l from the CG coefficients (mBCG, §5.9). All columns [r, z_1..z_p]
  are one batched solve.
* ``solver='dense'`` (small m only, a reference): dense m × m K_G WᵀW + σ²I, exact and
  differentiable by autograd.

Hyperparameter learning (beyond the paper, which fixes them, §9.4): the gradients
d(rᵀK̃⁻¹r) = 2z̃ᵀdr − ẑᵀ dK_G ẑ − ‖z̃‖² dσ² and d log det K̃ = tr(WᵀK̃⁻¹W dK_G) + tr(K̃⁻¹) dσ²,
with the traces estimated by Hutchinson on the same probes: tr(WᵀK̃⁻¹W dK_G) ≈ mean_l
(Wᵀx_l)ᵀ dK_G (Wᵀz_l), tr(K̃⁻¹) ≈ mean_l z_lᵀx_l, x_l = K̃⁻¹z_l. They enter autograd through
surrogates ``value + S − S.detach()`` whose S is linear in K_G(θ), σ², μ. All is m-dimensional
(Wᵀx_l and z_lᵀx_l come out of the factorized CG). W, WᵀW and the statistics do not depend on
the hyperparameters, only on the grid, so ``condition`` caches them for the data it last saw.

Predictive (Theorem 1): mean μ + w_*ᵀ K_G ẑ. Latent variance w_*ᵀK_Gw_* − (K_Gw_*)ᵀ M (K_Gw_*),
M = Wᵀ K̃⁻¹ W: ``variance='exact'`` solves for M K_G w_* per test point (Alg. 4 with
r̂_0 = K_G w_*); ``variance='lanczos'`` (LOVE) uses k factorized Lanczos steps from
b = W K_G 1/m (ref-code's start), M ≈ P̂ T⁻¹ P̂ᵀ, P̂ = WᵀW Q̂. The prior term w_*ᵀK_Gw_* uses the
7^d local kernel values (all s^d nodes of a point are within ±3 grid steps).

Layout: statistics and grid options in :mod:`gpscale.methods.ski.statistics`, GGP's solves and
:class:`GridState` in :mod:`gpscale.methods.ski.solve`; here the methods and their factories.

Deviations / choices: the grid is padded (no truncated rows, §3.2); the output scale multiplies
K_G once (§11.16); stopping is ‖r_k‖ ≤ rtol ‖b‖ (ref-code, §6.2); probes are Rademacher (the
ref-code uses Gaussian; Rademacher has lower variance, §11.5); the prior mean is a learned
constant (the paper: zero).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from gpscale.distributions import Predictive
from gpscale.kernels import is_expression, kernel_diag, kernel_hyperparameters
from gpscale.linalg.factorized import span_cg, span_lanczos
from gpscale.linalg.interpolation import Grid, Interpolation, interpolate, make_grid
from gpscale.linalg.reach import beyond_box
from gpscale.linalg.stencil import GramStencil, pair_offsets
from gpscale.linalg.toeplitz import GridKernel, grid_kernel
from gpscale.methods._common import (
    HeldOutNoise,
    check_task_and_init,
    follow_init,
    gaussian_likelihood,
    prior_modules,
    prior_options,
)
from gpscale.methods.base import Method, ShardPlan, predict_in_chunks
from gpscale.methods.options import Option, prior_options_with
from gpscale.methods.registry import MethodSpec, register
from gpscale.methods.ski.additive import AdditiveGGP
from gpscale.methods.ski.additive_ski import AdditiveSKI
from gpscale.methods.ski.groups import additive_groups, additive_refusal, resolve_additive_grids
from gpscale.methods.ski.pipeline import PIPELINE
from gpscale.methods.ski.rows_solve import RowsSolved, variance_reduction
from gpscale.methods.ski.sharded import sharded_plan
from gpscale.methods.ski.solve import (
    GridState,
    condition_statistics,
    love_term,
    operators,
    sparse_columns,
    use_preconditioned,
    whitened_system,
)
from gpscale.methods.ski.statistics import (
    StatisticsMemo,
    SufficientStatistics,
    grid_options,
    sufficient_statistics,
)
from gpscale.validation import check_x, check_xy

__all__ = ["GGP", "SKI", "GridState", "SufficientStatistics", "build_ggp", "build_ski",
           "sufficient_statistics"]

SOLVERS = ("auto", "preconditioned", "iterative", "dense")
VARIANCES = ("auto", "lanczos", "exact")
_F64 = torch.float64


def _grid_from_options(opts: dict[str, Any]) -> Grid:
    return make_grid(opts["grid_lower"], opts["grid_upper"], opts["grid_size"],
                     opts["interpolation"])


def _kernel_on_grid(kernel, grid: Grid) -> GridKernel:
    hp = kernel_hyperparameters(kernel)
    if hp is None:
        raise ValueError("ski/ggp need a [Scale](RBF | Matérn) GPyTorch kernel without "
                         f"active_dims; got {type(kernel).__name__}")
    return grid_kernel(grid, hp.profile, hp.lengthscale, hp.outputscale)


def _loss(state: GridState) -> Tensor:
    if not torch.isfinite(state.logdet.detach()):
        raise ValueError("the log-likelihood needs probes: build the model with num_probes >= 1")
    return 0.5 * (state.quad + state.logdet) / state.n + 0.5 * math.log(2 * math.pi)


def _predict(model, state: GridState, x_test: Tensor, var_term, chunk_size: int) -> Predictive:
    """Mean μ + w_*ᵀa and variance w_*ᵀK_Gw_* − var_term(rows, GK) (clamped at 0); a point
    beyond the kernel's reach of the grid (:func:`~gpscale.linalg.reach.beyond_box`: its kernel
    values with every datum are 0) gets the prior μ, k(x, x) and stays out of the others' solves;
    other points outside the grid remain an error."""
    check_x(x_test, num_dims=model.num_dims, name="x_test")
    grid = model.grid
    with torch.no_grad():
        GK = _kernel_on_grid(model.kernel, grid)
        pairs = pair_offsets(grid.support, grid.num_dims)
        term = var_term(GK)
        lower, upper = (torch.tensor(b, dtype=_F64, device=x_test.device) for b in grid.bounds())
        lengthscale = kernel_hyperparameters(model.kernel).lengthscale.to(_F64)

        def moments(xc: Tensor) -> tuple[Tensor, Tensor]:
            rows = interpolate(grid, xc)
            mean = state.mean_constant.to(_F64) + rows.matmul(state.mean_weights)
            return mean, (GK.interp_quad(rows, pairs) - term(rows)).clamp_min(0.0)

        def chunk(xc: Tensor) -> Predictive:
            near = ~beyond_box(xc.to(_F64), lower, upper, lengthscale)  # (t,)
            if bool(near.all()):
                mean, var = moments(xc)
            else:  # the prior, and the moments of the rest from them alone
                mean = state.mean_constant.to(_F64).expand(xc.shape[0]).clone()
                var = kernel_diag(model.kernel, xc).to(_F64)
                if bool(near.any()):
                    mean[near], var[near] = moments(xc[near])
            return Predictive(mean.to(xc.dtype), var.to(xc.dtype), noise=state.noise)

        return predict_in_chunks(chunk, x_test, chunk_size)


class GGP(HeldOutNoise, Method):
    """Grid-structured GP (GSGP) regression from sufficient statistics; see the module docstring.

    Args:
        mean, kernel, likelihood: GPyTorch constant mean, [Scale](RBF | Matérn) kernel, Gaussian
            likelihood.
        options: resolved factory options (grid, solver, probes, tolerances).
    """

    key = "ggp"
    needs_data_for_prediction = True
    summary_types = (SufficientStatistics, Grid, GramStencil)

    def __init__(self, mean, kernel, likelihood, *, num_dims: int, options: dict[str, Any]):
        super().__init__(task="regression", options=options)
        self.mean, self.kernel, self.likelihood = mean, kernel, likelihood
        self.num_dims = num_dims
        self._memo = StatisticsMemo()

    @property
    def grid(self) -> Grid:
        return _grid_from_options(self.options)

    def statistics(self, data, chunk_size: int = 100_000) -> SufficientStatistics:
        """One streaming pass over ``data`` (see :func:`sufficient_statistics`); the same
        ``(x, y)`` tensors again reuse the last pass (:class:`StatisticsMemo`)."""
        o = self.options
        settings = (self.grid, o["num_probes"], o["seed"], o["wtw_format"], self.noise.device)
        stats = self._memo.get(data, settings)
        if stats is not None:
            return stats
        stats = sufficient_statistics(data, self.grid, num_probes=o["num_probes"],
                                      seed=o["seed"], chunk_size=chunk_size,
                                      device=self.noise.device)
        if o["wtw_format"] == "csr":
            stats = dataclasses.replace(stats, gram_csr=stats.gram.to_csr())
        self._memo.put(data, settings, stats)
        return stats

    def condition(self, x: Tensor, y: Tensor) -> GridState:
        """Statistics of (x, y) (one O(n) pass, or the memo of the last pass over the same
        tensors) then :meth:`condition_stats`; no parameter or buffer of the module changes."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        return self.condition_stats(self.statistics((x, y)))

    def shard_plan(self, x: Tensor, y: Tensor, *, start: int,
                   num_points: int) -> ShardPlan | None:
        """Data-parallel GGP: statistics per rank, summed once
        (:mod:`~gpscale.methods.ski.sharded`)."""
        return sharded_plan(self, x, y, start, num_points)

    def training_loss(self, x: Tensor, y: Tensor):
        """The loss ``training.fit`` minimises on the full data (x, y): the statistics are
        computed here once and held by the returned function, so every step costs O(m log m)
        whatever n."""
        check_x(x, num_dims=self.num_dims)
        check_xy(x, y)
        stats = self.statistics((x, y))

        def loss(model: GGP, xb: Tensor, yb: Tensor) -> Tensor:
            if xb is not x:  # a minibatch: its own statistics (GGP trains full batch)
                return model.loss(model.condition(xb, yb))
            return model.loss(model.condition_stats(stats))
        return loss

    def condition_stats(self, stats: SufficientStatistics) -> GridState:
        """Solve and assemble the likelihood terms from the statistics alone; differentiable."""
        if stats.grid != self.grid:
            raise ValueError("the statistics were computed on a different grid than the model's")
        GK = _kernel_on_grid(self.kernel, stats.grid)
        return condition_statistics(self.options, stats, GK, self.noise,
                                    self.mean.constant.reshape(()))

    def loss(self, state: GridState) -> Tensor:
        """−log p(y)/n (module docstring); gradients w.r.t. ℓ, s, σ², μ."""
        return _loss(state).to(self.noise.dtype)

    def summary(self, state: GridState) -> SufficientStatistics:
        """A saved model keeps the sufficient statistics (O(7^d m + p m), not the data)."""
        return dataclasses.replace(state.data, gram_csr=None)

    def from_summary(self, summary: SufficientStatistics) -> GridState:
        """The state from saved statistics: one solve, as :meth:`condition_stats`."""
        if self.options["wtw_format"] == "csr":
            summary = dataclasses.replace(summary, gram_csr=summary.gram.to_csr())
        with torch.no_grad():
            return self.condition_stats(summary)

    def predict(self, state: GridState, x_test: Tensor, chunk_size: int = 4096) -> Predictive:
        """Mean and latent variance (``variance`` option: exact per point or LOVE)."""
        stats = state.data

        def term(GK: GridKernel):
            K, B, s2 = operators(self.options, GK, stats, self.noise)
            if self.options["variance"] == "exact" and use_preconditioned(self.options, GK):
                system = whitened_system(GK, B, stats, s2)
                pairs = pair_offsets(stats.grid.support, stats.grid.num_dims)

                def exact_whitened(rows):  # prior − posterior = w_*ᵀK_Gw_* − σ² uᵀÂ⁻¹u
                    post = system.posterior_quad(sparse_columns(rows), rtol=self.options["rtol"],
                                                 max_iters=self.options["max_iters"])
                    return GK.interp_quad(rows, pairs) - post
                return exact_whitened
            if self.options["variance"] == "exact":
                def exact(rows):
                    Kw = K(sparse_columns(rows))  # r̂_0 = K_G w_* (Alg. 4)
                    xd, _ = span_cg(K, B, s2, Kw, rtol=self.options["rtol"],
                                    max_iters=self.options["max_iters"])
                    return (Kw * xd).sum(0)
                return exact
            b0 = K(torch.full((stats.grid.num_points,), 1.0 / stats.grid.num_points,
                              dtype=_F64, device=stats.wt_y.device))
            _, P, T = span_lanczos(K, B, s2, b0, self.options["variance_rank"])
            return love_term(GK, P, T)

        size = chunk_size if self.options["variance"] != "exact" else min(chunk_size, 256)
        return _predict(self, state, x_test, term, size)


class SKI(RowsSolved, HeldOutNoise, Method):
    """Standard SKI / KISS-GP regression: CG on the n × n W K_G Wᵀ + σ²I (the paper's baseline).

    Same model, options and loss as :class:`GGP`; every iteration touches n-vectors.
    """

    key = "ski"
    needs_data_for_prediction = True

    def __init__(self, mean, kernel, likelihood, *, num_dims: int, options: dict[str, Any]):
        super().__init__(task="regression", options=options)
        self.mean, self.kernel, self.likelihood = mean, kernel, likelihood
        self.num_dims = num_dims

    grid = GGP.grid

    def _interpolate(self, x: Tensor) -> Interpolation:
        return interpolate(self.grid, x)

    def _solve_kernel(self) -> GridKernel:
        return _kernel_on_grid(self.kernel, self.grid)

    def loss(self, state: GridState) -> Tensor:
        """−log p(y)/n, as :meth:`GGP.loss`."""
        return _loss(state).to(self.noise.dtype)

    def predict(self, state: GridState, x_test: Tensor, chunk_size: int = 4096) -> Predictive:
        """Mean and latent variance by n-dimensional CG (exact) or Lanczos (LOVE)."""
        def term(GK: GridKernel):
            return variance_reduction(self.options, GK, state.data, float(self.noise.detach()),
                                      exact=self.options["variance"] == "exact",
                                      device=self.noise.device)

        size = chunk_size if self.options["variance"] != "exact" else min(chunk_size, 256)
        return _predict(self, state, x_test, term, size)


def _build(cls, key: str, num_dims: int, *, task: str, init, grid_size=None, grid_bounds=None,
           grid_margin: float = 0.1, interpolation: str = "cubic", num_probes: int = 16,
           rtol: float = 1e-3, max_iters: int = 1000, solver: str = "auto",
           variance: str = "auto", variance_rank: int = 128, seed: int = 0,
           wtw_format: str = "csr", kernel: str = "rbf", grid_lower=None, grid_upper=None,
           **prior: Any):
    check_task_and_init(key, task, ("regression",), num_dims, init)
    if grid_lower is not None and grid_upper is not None:  # a rebuild from model.options
        grid_bounds = (grid_lower, grid_upper)
    for name, value, valid in (("solver", solver, SOLVERS), ("variance", variance, VARIANCES),
                               ("wtw_format", wtw_format, ("stencil", "csr"))):
        if value not in valid:
            raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")
    if num_probes < 0 or rtol <= 0 or max_iters < 1 or variance_rank < 1:
        raise ValueError("need num_probes >= 0, rtol > 0, max_iters >= 1, variance_rank >= 1")
    if key == "ski" and solver in ("dense", "preconditioned"):
        raise ValueError(f"solver={solver!r} is a ggp option (ski runs CG on the n × n system)")
    if is_expression(kernel):  # one grid per group of inputs (methods.ski.additive)
        _, groups = additive_groups(kernel, num_dims)
        columns = [list(group.columns) for group in groups]
        grids = resolve_additive_grids(columns, init, grid_size, grid_bounds, grid_margin,
                                       interpolation, dense_gram=key == "ggp")
        cls = AdditiveGGP if key == "ggp" else AdditiveSKI
    else:
        grids = grid_options(num_dims, init, grid_size, grid_bounds, grid_margin, interpolation)
    opts = {**grids,
            "num_probes": int(num_probes), "rtol": float(rtol), "max_iters": int(max_iters),
            "solver": solver, "variance": variance, "variance_rank": int(variance_rank),
            "seed": int(seed), "wtw_format": wtw_format}
    popts = prior_options(init, task, num_dims, kernel=kernel, **prior)
    mean, kern = prior_modules(num_dims, popts)
    model = cls(mean, kern, gaussian_likelihood(popts["noise"]), num_dims=num_dims,
                options={**opts, **popts})
    return follow_init(model, init)


def build_ggp(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
              init: tuple[Tensor, Tensor] | None = None, **options: Any) -> GGP:
    """Factory of ``ggp`` (see :mod:`gpscale.methods.registry`); its options, with types and
    defaults, are :func:`_grid_options` (``gpscale methods ggp`` prints them).

    Raises:
        ValueError: d > 3 (grid size exponential in d), bad options or ``init`` data.
    """
    return _build(GGP, "ggp", num_dims, task=task, init=init, **options)


def build_ski(num_dims: int, *, task: str = "regression", num_classes: int | None = None,
              init: tuple[Tensor, Tensor] | None = None, **options: Any) -> SKI:
    """Factory of ``ski``: options as :func:`build_ggp` (no ``solver``/``wtw_format`` choice)."""
    return _build(SKI, "ski", num_dims, task=task, init=init, **options)


def _grid_options(key: str) -> tuple[Option, ...]:
    kernel = prior_options_with(kernel="rbf", refuse=additive_refusal)
    return (
        Option("grid_size", "ints", None, "grid points per dimension (one or a list); none: "
               "1024 / 100² / 32³ for d = 1 / 2 / 3 (an additive kernel's groups of 1 / 2 / 3 "
               "inputs: 128 / 32² / 12³, or these where there is one group)", minimum=2),
        Option("grid_bounds", "bounds", None, "(lower, upper) box of the grid; none: the data's "
               "box widened by grid_margin"),
        Option("grid_margin", "float", 0.1, "fraction of the data range added each side",
               minimum=0),
        Option("interpolation", "str", "cubic", "interpolation weights",
               choices=("cubic", "linear")),
        Option("solver", "str", "auto", "mean solve (auto: preconditioned for a Kronecker K_G; "
               "ski: auto or iterative)", choices=SOLVERS),
        Option("rtol", "float", 1e-3, "relative residual tolerance of the solves", minimum=0,
               exclusive=True),
        Option("max_iters", "int", 1000, "most iterations per solve", minimum=1),
        Option("num_probes", "int", 16, "probe vectors of the log-determinant estimate",
               minimum=0),
        Option("variance", "str", "auto", "predictive variance: low-rank Lanczos, or exact "
               "(solves; an additive kernel's by a dense factor); auto: lanczos, for an "
               "additive kernel exact up to 8,192 grid points", choices=VARIANCES),
        Option("variance_rank", "int", 128, "rank of the Lanczos variance", minimum=1),
        Option("seed", "int", 0, "seeds the probe vectors"),
        Option("wtw_format", "str", "csr", "storage of WᵀW", choices=("csr", "stencil")),
        *kernel,
        Option("grid_lower", "floats", None, "lower grid corner", hidden=True),
        Option("grid_upper", "floats", None, "upper grid corner", hidden=True),
    )


register(MethodSpec(
    key="ggp", factory=build_ggp, tasks=("regression",), **PIPELINE["ggp"],
    summary="GGP/GSGP: SKI from sufficient statistics WᵀW, Wᵀy; O(m log m) per iteration, "
            "independent of n (d ≤ 3, or a sum of kernels on groups of ≤ 3 inputs)",
    options=_grid_options("ggp"),
))

register(MethodSpec(
    key="ski", factory=build_ski, tasks=("regression",), **PIPELINE["ski"],
    summary="SKI / KISS-GP: CG on W K_G Wᵀ + σ²I, O(n + m log m) per iteration (d ≤ 3, or "
            "a sum of kernels on groups of ≤ 3 inputs)",
    options=_grid_options("ski"),
))
