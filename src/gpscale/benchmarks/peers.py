"""Suite ``peers``: GPyTorch's exact GP, SGPR and SVGP on four UCI sets, split 0.

The harness every later suite reuses: each run goes through ``runner.run`` (same data loading,
standardisation, training loop and metrics), all in one process, so speed can be compared as
ratios. Matérn-3/2 ARD kernel; SGPR and SVGP with m = 512 inducing points (k-means init); SVGP
with batch 1024; the exact GP (Cholesky, float64) only on Parkinsons. Each run has an epoch budget
and a wall-clock budget (``MAX_TIME``), like the reference figures' ~3 minutes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gpscale.benchmarks import runner
from gpscale.benchmarks.report import write_results
from gpscale.benchmarks.runner import RunSpec

__all__ = ["run", "PLAN", "MAX_TIME"]

log = logging.getLogger("gpscale.benchmarks")

DATASETS = ("parkinsons", "elevators", "bike", "protein")
MAX_TIME = 180.0
# (method, options, training overrides); exact only on Parkinsons.
PLAN: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("exact", {}, {"epochs": 50}),
    ("sgpr", {"num_inducing": 512}, {"epochs": 100}),
    ("svgp", {"num_inducing": 512}, {"epochs": 50, "batch_size": 1024}),
)
COLUMNS = ("dataset", "method", "n_train", "num_dims", "epochs", "train_time_s",
           "time_per_epoch_s", "test_rmse", "test_nll", "test_coverage_error", "noise", "stopped")


def _plan(quick: bool):
    datasets = ("parkinsons",) if quick else DATASETS
    for dataset in datasets:
        for method, options, overrides in PLAN:
            if method == "exact" and dataset != "parkinsons":
                continue
            if quick:
                overrides = {**overrides, "epochs": 3}
            yield dataset, method, options, overrides


def run(out_dir: Path, *, quick: bool = False) -> list[dict[str, Any]]:
    """Run every (dataset, method) of the plan; write the report into ``out_dir``."""
    rows = []
    for dataset, method, options, overrides in _plan(quick):
        log.info("peers: %s on %s", method, dataset)
        spec = RunSpec(method=method, dataset=dataset, split=0, seed=0,
                       options={"kernel": "matern32", "ard": True, **options},
                       max_time=None if quick else MAX_TIME, progress=False, **overrides)
        rows.append(_run_row(spec))
    notes = ("Metrics on the standardised target scale (training statistics). "
             f"Budgets: epochs as listed in PLAN, at most {MAX_TIME:.0f} s of training each.")
    write_results(out_dir, "peers", rows, columns=COLUMNS, notes=notes)
    return rows


def _run_row(spec: RunSpec) -> dict[str, Any]:
    metrics = runner.run(spec).metrics
    return {k: metrics.get(k) for k in COLUMNS}
