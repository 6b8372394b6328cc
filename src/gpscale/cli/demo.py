"""``gpscale demo``: what the library is for, in about two minutes on a laptop.

Every run uses the method's defaults and default training (what ``gpscale fit --method KEY``
does), each with :data:`DEMO_BUDGET_S` seconds (it stops earlier once converged):

- 1-D regression (the ``synthetic`` set, a sum of sines with a gap): the exact GP as the
  reference, CaGP-Opt with its computational uncertainty drawn apart from the mathematical one,
  and SoftKI, SOLVE-GP and SVGP side by side;
- GGP on :data:`GRID_POINTS` noisy samples of a smooth 2-D field (the solver's cost per iteration
  does not grow with n), its predictive mean next to the true field;
- IterNCGP binary classification on 2-D data, with its class-probability contours.

It prints the comparison table and writes ``demo.png`` (one panel per run), ``report.md`` and
``results.csv``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from gpscale import run as runner
from gpscale.data import synthetic
from gpscale.kernels import kernel_diag, kernel_matrix
from gpscale.report import write_results
from gpscale.run import RunSpec

__all__ = ["run_demo", "DEMO_BUDGET_S", "REGRESSION_METHODS", "QUICK_METHODS", "GRID_POINTS"]

REGRESSION_METHODS = ("exact", "cagp-opt", "softki", "solvegp", "svgp")
"""The 1-D runs: the reference first, then the paper methods and the SVGP baseline."""
QUICK_METHODS = ("exact", "cagp-opt", "svgp")
"""The smoke test's 1-D subset (``--quick``); GGP and IterNCGP run small."""
DEMO_NUM_TRAIN = 1500
GRID_POINTS = 1_000_000
"""Training points of the 2-D GGP run."""
CLASSIFICATION_POINTS = 1000
DEMO_BUDGET_S = 15.0
"""Training budget of each demo run (seconds; 2 with ``--quick``)."""
COLUMNS = ("method", "data", "n_train", "epochs", "stopped", "train_time_s", "test_rmse",
           "test_nll", "test_coverage_error", "test_accuracy")


def _plan(quick: bool) -> list[tuple[str, RunSpec]]:
    """(data label, run) for every demo run."""
    budget = 2.0 if quick else DEMO_BUDGET_S
    one_d = {"n": 600 if quick else DEMO_NUM_TRAIN}
    runs = [("1-D", RunSpec(method=m, dataset="synthetic", dataset_options=one_d,
                            max_time=budget, progress=False))
            for m in (QUICK_METHODS if quick else REGRESSION_METHODS)]
    field = {"n": 20_000 if quick else GRID_POINTS, "num_test": 10_000, "num_dims": 2}
    runs.append(("2-D field", RunSpec(method="ggp", dataset="field3d", dataset_options=field,
                                      max_time=budget, progress=False)))
    clf = {"n": 200 if quick else CLASSIFICATION_POINTS, "num_test": 1000}
    runs.append(("2-D binary", RunSpec(method="iterncgp", dataset="binary2d",
                                       dataset_options=clf, max_time=budget, progress=False)))
    return runs


def run_demo(out_dir: str | Path, *, quick: bool = False) -> Path:
    """Fit the demo runs; write ``report.md``, ``results.csv`` and ``demo.png``."""
    out = Path(out_dir)
    results: list[tuple[str, runner.RunResult]] = [(label, runner.run(spec))
                                                   for label, spec in _plan(quick)]
    rows = [{**{k: r.metrics.get(k) for k in COLUMNS}, "data": label} for label, r in results]
    notes = ("Each method with its defaults. 1-D and 2-D field: RMSE / NLL of y on its natural "
             "scale; 2-D binary: accuracy. Plots: demo.png")
    report = write_results(out, "demo", rows, columns=COLUMNS, notes=notes)
    plot_demo([r for _, r in results], out / "demo.png")
    return report


def plot_demo(results: list[runner.RunResult], path: Path) -> None:
    """One panel per 1-D method, two for GGP (its mean, the true field), one for IterNCGP."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    one_d = [r for r in results if r.data.num_dims == 1]
    ggp = next(r for r in results if r.metrics["method"] == "ggp")
    clf = next(r for r in results if r.data.task == "classification")
    panels = len(one_d) + 3
    cols = 4
    rows = -(-panels // cols)
    fig = Figure(figsize=(4.3 * cols, 3.5 * rows), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax in axes[panels:]:
        ax.set_axis_off()
    for ax, res in zip(axes, one_d, strict=False):
        _plot_1d(ax, res)
    _plot_field(axes[len(one_d)], axes[len(one_d) + 1], ggp)
    _plot_classifier(axes[len(one_d) + 2], clf)
    fig.savefig(path, dpi=100)


def _plot_1d(ax: Any, res: runner.RunResult) -> None:
    """Training and test data, the predictive mean and the 95% band of y; for CaGP the band
    of the exact posterior with the same hyperparameters inside it (the rest is computational
    uncertainty)."""
    data = res.data
    lo = float(torch.cat([data.x_train, data.x_test]).min())
    hi = float(torch.cat([data.x_train, data.x_test]).max())
    dtype = next(res.model.parameters()).dtype
    grid = torch.linspace(lo, hi, 400, dtype=dtype).unsqueeze(-1)
    x, y = data.x_train.to(dtype), data.y_train.to(dtype)
    pred = runner.predict_test(res.model, x, y, grid)
    mean, noise = pred.mean.double(), pred.noise.double()
    g = grid[:, 0].double()
    ax.scatter(data.x_train[:, 0], data.y_train, s=2, c="0.6", label="train")
    ax.scatter(data.x_test[:, 0], data.y_test, s=3, c="tab:orange", label="test")
    band = 1.96 * (pred.variance.double() + noise).sqrt()
    if res.metrics["method"].startswith("cagp"):
        # The exact posterior's band inside CaGP's: what lies between the two is the
        # computational uncertainty (the posterior mass CaGP's actions did not resolve).
        exact = _exact_variance(res.model, x, grid, noise)
        inner = 1.96 * (exact + noise).sqrt()
        ax.fill_between(g, mean - band, mean + band, alpha=0.45, color="tab:red",
                        label="+ computational uncertainty")
        ax.fill_between(g, mean - inner, mean + inner, alpha=0.35, color="tab:blue",
                        label="95% band of y, exact posterior")
    else:
        ax.fill_between(g, mean - band, mean + band, alpha=0.3, color="tab:blue",
                        label="95% band of y")
    ax.plot(g, mean, color="tab:blue", lw=1.5, label="mean")
    m = res.metrics
    ax.set_title(f"{m['method']}: RMSE {m['test_rmse']:.3f}, NLL {m['test_nll']:.3f}",
                 fontsize=9)
    ax.set_xlabel("x")
    ax.legend(fontsize=6, loc="lower left")


def _exact_variance(model: Any, x: torch.Tensor, grid: torch.Tensor,
                    noise: torch.Tensor) -> torch.Tensor:
    """Latent variance of the exact GP posterior with ``model``'s kernel and noise at ``grid``
    (dense, float64: the demo's n is small)."""
    with torch.no_grad():
        xd, gd = x.double(), grid.double()
        kernel = copy.deepcopy(model.kernel).double()
        K = kernel_matrix(kernel, xd, xd)
        K.diagonal().add_(noise.double().mean())
        L = torch.linalg.cholesky(K)
        W = torch.linalg.solve_triangular(L, kernel_matrix(kernel, xd, gd), upper=False)
        variance = kernel_diag(kernel, gd) - W.square().sum(0)
    return variance.clamp_min(0.0)


def _plot_field(ax_mean: Any, ax_true: Any, res: runner.RunResult) -> None:
    """GGP's predictive mean on a 150 × 150 grid of [0, 1]², and the field it learned from."""
    dtype = next(res.model.parameters()).dtype
    s = torch.linspace(0, 1, 150, dtype=torch.float64)
    grid = torch.cartesian_prod(s, s)
    x, y = res.data.x_train.to(dtype), res.data.y_train.to(dtype)
    mean = runner.predict_test(res.model, x, y, grid.to(dtype)).mean.double()
    truth = synthetic.stream_field(1, num_dims=2).latent(grid)
    lim = float(truth.abs().max())
    for ax, image, title in (
            (ax_mean, mean, f"ggp on {res.data.num_train:,} points: RMSE "
                            f"{res.metrics['test_rmse']:.3f}, {res.metrics['train_time_s']:.0f} s"),
            (ax_true, truth, "the true field")):
        ax.imshow(image.reshape(150, 150).T, origin="lower", extent=(0, 1, 0, 1),
                  cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("x₁")
    ax_mean.set_ylabel("x₂")


def _plot_classifier(ax: Any, res: runner.RunResult) -> None:
    """IterNCGP's P(y = 1 | x) as filled contours, with the training points."""
    data = res.data
    dtype = next(res.model.parameters()).dtype
    x_all = torch.cat([data.x_train, data.x_test])
    lo, hi = x_all.min(0).values, x_all.max(0).values
    s1 = torch.linspace(float(lo[0]), float(hi[0]), 120, dtype=torch.float64)
    s2 = torch.linspace(float(lo[1]), float(hi[1]), 120, dtype=torch.float64)
    grid = torch.cartesian_prod(s1, s2)
    pred = runner.predict_test(res.model, data.x_train.to(dtype), data.y_train,
                               grid.to(dtype))
    p1 = pred.probs[:, 1].double().reshape(120, 120).T
    filled = ax.contourf(s1, s2, p1, levels=[0, 0.1, 0.3, 0.5, 0.7, 0.9, 1], cmap="RdBu_r",
                         alpha=0.7)
    ax.contour(s1, s2, p1, levels=[0.5], colors="k", linewidths=1)
    ax.scatter(data.x_train[:, 0], data.x_train[:, 1], c=data.y_train, cmap="RdBu_r", s=7,
               vmin=0, vmax=1, edgecolors="w", linewidths=0.3)
    ax.figure.colorbar(filled, ax=ax, label="P(y = 1)")
    m = res.metrics
    ax.set_title(f"iterncgp: accuracy {m['test_accuracy']:.3f}, NLL {m['test_nll']:.3f}",
                 fontsize=9)
    ax.set_xlabel("x₁")
    ax.set_ylabel("x₂")
