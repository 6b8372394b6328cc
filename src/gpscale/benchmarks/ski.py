"""Suite ``ski``: per-iteration time and memory of ``ggp`` vs ``ski`` at fixed m (002 Table 1).

For each data set (the 1-D noisy sine, ``gpscale.data.synthetic.noisy_sine``; a 3-D smooth field,
``FieldStream``) and n = 10⁴ … 10⁷ at a fixed grid of m points (cubic interpolation, RBF kernel
with fixed hyperparameters ℓ = 0.2, s = 1, σ² = 0.01 on [0, 1]^d):

- ``ski``: build W (n × 4^d indices/weights), then ``ITERS`` CG iterations on W K_G Wᵀ + σ²I
  (``gpscale.linalg.solvers.cg``, rtol = 0 so every run does the same work);
- ``ggp``: the streaming pass for WᵀW, Wᵀy, yᵀy, n (``preprocess_s``), then ``ITERS`` iterations of
  factorized CG (corrected Alg. 3) from the statistics alone.

``time_per_iter_s`` is the solve's wall time / iterations; ``solver_peak_mb`` the growth of the peak
RSS during the solve (structures W or WᵀW already built; in a spawned process for the full run,
in-process for ``quick``); ``counted_memory`` the paper's count, nnz(W) + m + n (SKI) and
nnz(WᵀW) + 2m (GGP). ggp rows carry ``time_ratio`` and ``memory_ratio`` = ggp/ski (< 1: GGP better),
the form of the paper's Table 1. ``wtw_format`` rows time one WᵀW product as the stencil and as
torch CSR. The full run adds a preprocessing-throughput row for n = 10⁸ on the 3-D field (GGP only).

The GPyTorch KISS-GP peer (``GridInterpolationKernel`` over the same RBF and grid size, n ≤ 10⁶):
``time_per_iter_s`` is one product with its W K_G Wᵀ + σ²I operator (the work of one CG
iteration); ``mean_smae`` is the test mean absolute error over mean |y_test| (notes/002 §8) of
GPyTorch's predictive mean next to ``ggp``'s on the same points (both CG to rtol 1e-3).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from gpscale.benchmarks.memory import current_rss_mb, peak_memory_mb, peak_rss_mb, reset_peak_rss
from gpscale.data.synthetic import FieldStream, noisy_sine
from gpscale.linalg.factorized import factorized_cg
from gpscale.linalg.interpolation import interpolate, make_grid
from gpscale.linalg.solvers.cg import ConjugateGradient
from gpscale.linalg.stencil import pair_offsets
from gpscale.linalg.toeplitz import grid_kernel
from gpscale.linalg.whitened import WhitenedSystem, marginal_grams, whitened_solve
from gpscale.methods.ski import sufficient_statistics
from gpscale.report import write_results

__all__ = ["run"]

log = logging.getLogger("gpscale.benchmarks")

DATASETS = ("sine", "field3d")
ITERS = 20
FULL = {"sine": ((4096,), (10**4, 10**5, 10**6, 10**7)),
        "field3d": ((37, 37, 37), (10**4, 10**5, 10**6, 10**7))}
QUICK = {"sine": ((256,), (10**4, 10**5)), "field3d": ((10, 10, 10), (10**4, 10**5))}
KISS_MAX_N = 10**6
# GPyTorch's predictive mean runs CG over all n with its interpolated operator; on the 3-D field a
# product costs seconds at n = 10⁶, so its SMAE is measured up to 10⁵ there (time up to 10⁶).
KISS_SMAE_MAX_N = {"sine": 10**6, "field3d": 10**5}
NUM_TEST = 1000
HYPERS = {"lengthscale": 0.2, "outputscale": 1.0, "noise": 0.01}
COLUMNS = ("dataset", "method", "n", "d", "m", "preprocess_s", "time_per_iter_s",
           "solver_peak_mb", "counted_memory", "time_ratio", "memory_ratio", "mean_smae",
           "wtw_format")
_F64 = torch.float64


def _data(dataset: str, n: int):
    """(x, y) in memory or a chunk stream, on [0, 1]^d."""
    if dataset == "sine":
        data = noisy_sine(num_train=n, num_test=1, seed=0)
        return data.x_train, data.y_train
    return FieldStream(n=n, num_dims=3, chunk_size=min(n, 10**6), seed=0)


def _in_memory(data):
    if isinstance(data, tuple):
        return data
    chunks = list(data)
    return torch.cat([c[0] for c in chunks]), torch.cat([c[1] for c in chunks])


class _ChunkedRows:
    """W of SKI as row blocks of :func:`interpolate` (at most ``chunk`` rows each).

    The same products as one :class:`~gpscale.linalg.interpolation.Interpolation`, but building
    W and each product hold temporaries for one block only: at n = 10⁷, d = 3 (64 entries per row)
    W alone is 10 GB, and the one-shot build or gather would need twice that.
    """

    def __init__(self, grid, x: torch.Tensor, chunk: int = 10**6):
        self.parts = [interpolate(grid, x[i:i + chunk]) for i in range(0, x.shape[0], chunk)]
        self.num_grid = grid.num_points

    def nonzeros(self) -> int:
        return sum(int((p.weight != 0).sum()) for p in self.parts)

    def matmul(self, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([p.matmul(v) for p in self.parts])

    def rmatmul(self, u: torch.Tensor) -> torch.Tensor:
        out, start = None, 0
        for p in self.parts:
            part = p.rmatmul(u[start:start + p.index.shape[0]])
            out = part if out is None else out + part
            start += p.index.shape[0]
        return out


def measure(method: str, dataset: str, n: int, sizes: tuple[int, ...], iters: int = ITERS
            ) -> dict[str, Any]:
    """One row: build the structures, then time ``iters`` solver iterations and their memory."""
    torch.set_num_threads(1)
    d = len(sizes)
    grid = make_grid([0.0] * d, [1.0] * d, list(sizes))
    K = grid_kernel(grid, "rbf", torch.full((d,), 0.2, dtype=_F64), torch.tensor(1.0, dtype=_F64))
    noise, m = 0.01, grid.num_points
    data = _data(dataset, n)
    tic = time.perf_counter()
    with torch.no_grad():
        if method == "ggp":
            stats = sufficient_statistics(data, grid, num_probes=0)
            prep = time.perf_counter() - tic
            counted = int((stats.gram.coef != 0).sum()) + 2 * m
            h, rho = stats.wt_y[:, None], stats.yty.reshape(1)
            del data

            def solve():
                return factorized_cg(K.matmul, stats.gram.matmul, noise, h, rho, rtol=0.0,
                                     max_iters=iters).iterations
        else:
            x, y = _in_memory(data)
            rows = _ChunkedRows(grid, x)
            prep = time.perf_counter() - tic
            counted = rows.nonzeros() + m + n
            cg = ConjugateGradient(rtol=0.0, max_iters=iters)
            state = cg.init(lambda V: rows.matmul(K.matmul(rows.rmatmul(V))) + noise * V)

            def solve():
                return cg.run(state, y[:, None]).iterations
        reset_peak_rss()
        base = current_rss_mb()
        tic = time.perf_counter()
        done = solve()
        elapsed = time.perf_counter() - tic
        peak = peak_rss_mb() - base
    return {"dataset": dataset, "method": method, "n": n, "d": d, "m": m, "preprocess_s": prep,
            "time_per_iter_s": elapsed / max(done, 1), "solver_peak_mb": peak,
            "counted_memory": counted}


def _test_points(dataset: str) -> tuple[torch.Tensor, torch.Tensor]:
    if dataset == "sine":
        data = noisy_sine(num_train=1, num_test=NUM_TEST, seed=1)
        return data.x_test, data.y_test
    return FieldStream(n=NUM_TEST, num_dims=3, chunk_size=NUM_TEST, seed=1).chunk(0)


def _smae(mean: torch.Tensor, y: torch.Tensor) -> float:
    return float((mean - y).abs().mean() / y.abs().mean())


def kissgp_pair(dataset: str, n: int, sizes: tuple[int, ...], repeats: int = 5
                ) -> list[dict[str, Any]]:
    """GPyTorch KISS-GP's per-iteration (one operator product) time and mean SMAE, and the SMAE
    of ``ggp``'s mean on the same data, grid size and hyperparameters."""
    import gpytorch

    from gpscale.methods.registry import build

    torch.set_num_threads(1)
    d = len(sizes)
    x, y = _in_memory(_data(dataset, n))
    x_test, y_test = _test_points(dataset)

    class KissGP(gpytorch.models.ExactGP):
        def __init__(self, likelihood):
            super().__init__(x, y, likelihood)
            self.mean_module = gpytorch.means.ZeroMean()
            base = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
            self.covar_module = gpytorch.kernels.GridInterpolationKernel(
                base, grid_size=list(sizes), num_dims=d, grid_bounds=[(0.0, 1.0)] * d)

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(z),
                                                             self.covar_module(z))

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = KissGP(likelihood).double()
    likelihood.noise = HYPERS["noise"]
    model.covar_module.base_kernel.outputscale = HYPERS["outputscale"]
    model.covar_module.base_kernel.base_kernel.lengthscale = HYPERS["lengthscale"]
    model.eval()
    with torch.no_grad():
        tic = time.perf_counter()
        op = model.covar_module(x).add_diagonal(torch.tensor(HYPERS["noise"], dtype=_F64))
        v = torch.randn(n, 1, dtype=_F64)
        op.matmul(v)  # builds the interpolation indices and K_G
        prep = time.perf_counter() - tic
        tic = time.perf_counter()
        for _ in range(repeats):
            op.matmul(v)
        per_iter = (time.perf_counter() - tic) / repeats
        if n > KISS_SMAE_MAX_N[dataset]:
            kiss_smae = None
        else:  # no pivoted-Cholesky preconditioner: its column extraction dominated (88 of 130 s)
            with gpytorch.settings.cg_tolerance(1e-3), gpytorch.settings.max_cg_iterations(1000), \
                    gpytorch.settings.max_preconditioner_size(0), \
                    gpytorch.settings.skip_posterior_variances(True), \
                    gpytorch.settings.fast_computations(True, True, True):
                kiss_smae = _smae(likelihood(model(x_test.double())).mean, y_test)
        ggp = build("ggp", d, init=(x, y), grid_size=list(sizes),
                    grid_bounds=([0.0] * d, [1.0] * d), rtol=1e-3, num_probes=0,
                    mean_constant=0.0, **HYPERS)
        ggp_mean = ggp.predict(ggp.condition(x, y), x_test.double()).mean
    m = int(torch.tensor(sizes).prod())
    common = {"dataset": dataset, "n": n, "d": d, "m": m}
    return [{**common, "method": "kissgp (gpytorch)", "preprocess_s": prep,
             "time_per_iter_s": per_iter, "mean_smae": kiss_smae},
            {**common, "method": "ggp", "mean_smae": _smae(ggp_mean, y_test)}]


def wtw_formats(dataset: str, n: int, sizes: tuple[int, ...], repeats: int = 5
                ) -> list[dict[str, Any]]:
    """Time of one WᵀW product (single column) as the stencil and as torch CSR."""
    torch.set_num_threads(1)
    d = len(sizes)
    grid = make_grid([0.0] * d, [1.0] * d, list(sizes))
    stats = sufficient_statistics(_data(dataset, n), grid, num_probes=0)
    v = torch.randn(grid.num_points, 1, dtype=_F64)
    csr = stats.gram.to_csr()
    rows = []
    for fmt, fn in (("stencil", stats.gram.matmul), ("csr", lambda V: csr @ V)):
        fn(v)
        tic = time.perf_counter()
        for _ in range(repeats):
            fn(v)
        rows.append({"dataset": dataset, "method": "ggp", "n": n, "d": d, "m": grid.num_points,
                     "time_per_iter_s": (time.perf_counter() - tic) / repeats, "wtw_format": fmt})
    return rows


def preprocessing_throughput(n: int = 10**8, sizes: tuple[int, ...] = (160, 80, 10),
                             rtol: float = 1e-2) -> dict[str, Any]:
    """The 10⁸-point 3-D run: streaming statistics (points/s) and the mean solve (to ``rtol``).

    The mean weights a = K_G Wᵀ K̃⁻¹ r are solved twice, by the factorized CG on the n-system
    (the paper's method, capped at 1,000 iterations) and by the preconditioned m-dimensional
    solve (:mod:`gpscale.linalg.whitened`); each is compared with a tight (rtol 1e-8)
    preconditioned reference: ``*_mean_rel_err`` = ‖a − a_ref‖ / ‖a_ref‖.
    """
    torch.set_num_threads(1)
    grid = make_grid([0.0] * 3, [1.0] * 3, list(sizes))
    tic = time.perf_counter()
    stats = sufficient_statistics(FieldStream(n=n, num_dims=3), grid, num_probes=0)
    prep = time.perf_counter() - tic
    K = grid_kernel(grid, "rbf", torch.full((3,), 0.2, dtype=_F64), torch.tensor(1.0, dtype=_F64))
    h, rho = stats.wt_y[:, None], stats.yty.reshape(1)
    grams = marginal_grams(stats.gram)

    def whitened(tol: float):
        return whitened_solve(K, stats.gram.matmul, grams, 0.01, n, h, rho,
                              num_logdet_probes=0, rtol=tol, max_iters=1000)

    tic = time.perf_counter()
    res = factorized_cg(K.matmul, stats.gram.matmul, 0.01, h, rho, rtol=rtol, max_iters=1000)
    fcg_s = time.perf_counter() - tic
    tic = time.perf_counter()
    pre = whitened(rtol)
    pre_s = time.perf_counter() - tic
    ref = whitened(1e-8).a[:, 0]

    def err(a: torch.Tensor) -> float:
        return float((a - ref).norm() / ref.norm())

    a_fcg = K.matmul(res.wt_x[:, 0])  # K_G Wᵀ K̃⁻¹ r from the factorized CG
    # Exact latent variances of 64 test points by the Woodbury form (GGP's variance='exact').
    x_test = torch.rand(64, 3, generator=torch.Generator().manual_seed(1), dtype=_F64)
    rows = interpolate(grid, x_test)
    cols = torch.zeros(64, grid.num_points, dtype=_F64).scatter_add_(1, rows.index,
                                                                      rows.weight).T
    tic = time.perf_counter()
    system = WhitenedSystem.build(K, stats.gram.matmul, grams, 0.01, n)
    var = system.posterior_quad(cols, rtol=rtol, max_iters=1000)  # w_*ᵀ Σ_grid w_*
    var_s = time.perf_counter() - tic
    prior = K.interp_quad(rows, pair_offsets(grid.support, 3))
    return {"dataset": "field3d", "method": "ggp", "n": n, "d": 3, "m": grid.num_points,
            "preprocess_s": prep, "points_per_s": n / prep,
            "mean_inference_s": fcg_s, "iterations": res.iterations,
            "mean_rel_err": err(a_fcg), "precond_inference_s": pre_s,
            "precond_iterations": pre.iterations, "precond_mean_rel_err": err(pre.a[:, 0]),
            "variance_64_points_s": var_s, "variance_mean": float(var.mean()),
            "prior_variance_mean": float(prior.mean())}


def run(out_dir: Path, *, quick: bool = False,
        datasets: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Run the Table-1-style comparison (quick: n ≤ 10⁵, small m); report into ``out_dir``."""
    datasets = datasets or DATASETS
    unknown = set(datasets) - set(DATASETS)
    if unknown:
        raise ValueError(f"the ski suite runs on {', '.join(DATASETS)}; got {sorted(unknown)}")
    plan = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []
    for dataset in datasets:
        sizes, ns = plan[dataset]
        for n in ns:
            pair = {}
            for method in ("ski", "ggp"):
                log.info("ski suite: %s on %s, n = %d", method, dataset, n)
                if quick:
                    pair[method] = measure(method, dataset, n, sizes)
                else:
                    _, pair[method] = peak_memory_mb(measure, method, dataset, n, sizes)
            g, s = pair["ggp"], pair["ski"]
            g["time_ratio"] = g["time_per_iter_s"] / s["time_per_iter_s"]
            g["memory_ratio"] = g["counted_memory"] / s["counted_memory"]
            rows += [s, g]
            if n <= KISS_MAX_N and not (quick and (dataset != "sine" or n > 10**4)):
                log.info("ski suite: GPyTorch KISS-GP on %s, n = %d", dataset, n)
                rows += kissgp_pair(dataset, n, sizes)
        rows += wtw_formats(dataset, ns[-1] if quick else 10**6, sizes)
    if not quick and "field3d" in datasets:
        rows.append(preprocessing_throughput())
    notes = (f"{ITERS} CG iterations per row (rtol 0), RBF ℓ = 0.2, s = 1, σ² = 0.01, cubic "
             "interpolation, one thread. time_ratio and memory_ratio are ggp / ski (paper 002 "
             "Table 1 form); memory_ratio uses the paper's counts nnz(WᵀW) + 2m vs "
             "nnz(W) + m + n; solver_peak_mb is the measured RSS growth during the solve.")
    write_results(out_dir, "ski", rows, columns=[*COLUMNS, "points_per_s", "mean_inference_s",
                                                 "iterations", "mean_rel_err",
                                                 "precond_inference_s", "precond_iterations",
                                                 "precond_mean_rel_err",
                                                 "variance_64_points_s", "variance_mean"],
                  notes=notes)
    return rows
