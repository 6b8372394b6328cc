"""``gpscale demo``: the main job on an embedded default, in about two minutes on a laptop.

It generates the 1-D ``synthetic`` regression set and fits, each with its default options and
training settings (what ``gpscale fit --method KEY`` does), the paper methods — CaGP-Opt, GGP,
SoftKI, SOLVE-GP — and the GPyTorch baselines SVGP, SGPR and the exact GP (the reference). Each
run gets :data:`DEMO_BUDGET_S` seconds (it stops earlier once converged). It prints a comparison
table and writes ``demo.png`` with each method's predictive mean and 95% band of y.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpscale.benchmarks import runner
from gpscale.benchmarks.report import write_results
from gpscale.benchmarks.runner import RunSpec

__all__ = ["run_demo", "DEMO_METHODS", "QUICK_METHODS"]

# (method, options, training overrides): the paper methods first, then the references; all
# with their defaults, so the demo shows what a user gets without options.
DEMO_METHODS: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("cagp-opt", {}, {}),
    ("ggp", {}, {}),
    ("softki", {}, {}),
    ("solvegp", {}, {}),
    ("svgp", {}, {}),
    ("sgpr", {}, {}),
    ("exact", {}, {}),
)
DEMO_NUM_TRAIN = 1500
DEMO_BUDGET_S = 15.0
"""Training budget of each demo run (seconds; 2 with ``--quick``)."""
QUICK_METHODS = ("cagp-opt", "softki", "svgp", "exact")
"""The smoke test's subset: a paper method of each kind and the references."""
COLUMNS = ("method", "n_train", "epochs", "stopped", "train_time_s", "test_rmse", "test_nll",
           "test_coverage_error", "noise")


def run_demo(out_dir: str | Path, *, quick: bool = False) -> Path:
    """Fit the demo methods, write ``report.md``, ``results.csv`` and ``demo.png``."""
    out = Path(out_dir)
    data_options = {"n": 600} if quick else {"n": DEMO_NUM_TRAIN}
    results = []
    for method, options, overrides in DEMO_METHODS:
        if quick and method not in QUICK_METHODS:
            continue
        overrides = {"max_time": 2.0 if quick else DEMO_BUDGET_S, **overrides}
        spec = RunSpec(method=method, dataset="synthetic", options=options,
                       dataset_options=data_options, progress=False, **overrides)
        results.append(runner.run(spec))
    rows = [{k: r.metrics.get(k) for k in COLUMNS} for r in results]
    notes = "Predictive means and 95% bands of y: demo.png"
    report = write_results(out, "demo", rows, columns=COLUMNS, notes=notes)
    plot_bands(results, out / "demo.png")
    return report


def plot_bands(results: list[runner.RunResult], path: Path) -> None:
    """One panel per method: training data, test data, predictive mean and 95% band of y."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = results[0].data
    lo = float(torch.cat([data.x_train, data.x_test]).min())
    hi = float(torch.cat([data.x_train, data.x_test]).max())
    grid = torch.linspace(lo, hi, 400, dtype=torch.float64).unsqueeze(-1)
    cols = min(4, len(results))
    rows = -(-len(results) // cols)
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, sharey=True, squeeze=False).ravel()
    for ax in axes[len(results):]:
        ax.set_axis_off()
    for ax, res in zip(axes, results, strict=False):
        dtype = next(res.model.parameters()).dtype
        x, y = res.data.x_train.to(dtype), res.data.y_train.to(dtype)
        pred = runner.predict_test(res.model, x, y, grid.to(dtype))
        mean = pred.mean.double()
        band = 1.96 * pred.stddev.double()
        g = grid[:, 0]
        ax.scatter(res.data.x_train[:, 0], res.data.y_train, s=2, c="0.6", label="train")
        ax.scatter(res.data.x_test[:, 0], res.data.y_test, s=3, c="tab:orange", label="test")
        ax.fill_between(g, mean - band, mean + band, alpha=0.3, color="tab:blue",
                        label="95% band of y")
        ax.plot(g, mean, color="tab:blue", lw=1.5, label="mean")
        m = res.metrics
        ax.set_title(f"{m['method']}: RMSE {m['test_rmse']:.3f}, NLL {m['test_nll']:.3f}",
                     fontsize=9)
        ax.set_xlabel("x")
    axes[0].set_ylabel("y")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.savefig(path, dpi=110)
