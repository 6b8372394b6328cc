"""Suite ``peers``: GPyTorch's exact GP, SGPR and SVGP on four UCI sets, split 0.

The harness every later suite reuses: each run goes through ``runner.run`` (same data loading,
standardisation, training loop and metrics), all in one process, so speed can be compared as
ratios. Matérn-3/2 ARD kernel; SGPR and SVGP with m = 512 inducing points (k-means init); SVGP
with batch 1024; the exact GP (Cholesky, float64) only on Parkinsons. Each run trains for a
wall-clock budget of ``MAX_TIME`` seconds (evaluation excluded), like the reference figures' ~3
minutes, with test metrics every ``EVAL_EVERY`` epochs; the report gives the final and the best
test NLL seen during training.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gpscale import run as runner
from gpscale.report import write_results
from gpscale.run import RunSpec

__all__ = ["run", "PLAN", "MAX_TIME"]

log = logging.getLogger("gpscale.benchmarks")

DATASETS = ("parkinsons", "elevators", "bike", "protein")
MAX_TIME = 180.0
EVAL_EVERY = 5
# (method, options, training overrides); exact only on Parkinsons. Epoch caps are generous: the
# wall-clock budget ends each run.
PLAN: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("exact", {}, {"epochs": 200}),
    ("sgpr", {"num_inducing": 512}, {"epochs": 1000}),
    ("svgp", {"num_inducing": 512}, {"epochs": 1000, "batch_size": 1024}),
)
COLUMNS = ("dataset", "method", "n_train", "num_dims", "epochs", "train_time_s",
           "time_per_epoch_s", "test_rmse", "test_nll", "best_test_nll", "test_coverage_error",
           "noise", "stopped")


def _plan(quick: bool, datasets: tuple[str, ...] | None):
    datasets = datasets or (("parkinsons",) if quick else DATASETS)
    unknown = set(datasets) - set(DATASETS)
    if unknown:
        raise ValueError(f"peers runs on {', '.join(DATASETS)}; got {sorted(unknown)}")
    for dataset in datasets:
        for method, options, overrides in PLAN:
            if method == "exact" and dataset != "parkinsons":
                continue
            if quick:
                overrides = {**overrides, "epochs": 3}
            yield dataset, method, options, overrides


def run(out_dir: Path, *, quick: bool = False,
        datasets: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Run every (dataset, method) of the plan (or only ``datasets``); report into ``out_dir``."""
    rows = []
    for dataset, method, options, overrides in _plan(quick, datasets):
        log.info("peers: %s on %s", method, dataset)
        spec = RunSpec(preset="paper", method=method, dataset=dataset, split=0, seed=0,
                       options={"kernel": "matern32", "ard": True, **options},
                       max_time=None if quick else MAX_TIME, eval_every=EVAL_EVERY,
                       progress=False, **overrides)
        rows.append(_run_row(spec))
    notes = ("Metrics on the standardised target scale (training statistics). "
             f"Each run trains for at most {MAX_TIME:.0f} s (evaluation excluded); test NLL "
             f"every {EVAL_EVERY} epochs, best_test_nll is the lowest seen.")
    write_results(out_dir, "peers", rows, columns=COLUMNS, notes=notes)
    return rows


def _run_row(spec: RunSpec) -> dict[str, Any]:
    result = runner.run(spec)
    seen = [v for v in result.history.column("test_nll") if v is not None]
    metrics = {**result.metrics, "best_test_nll": min([*seen, result.metrics["test_nll"]])}
    return {k: metrics.get(k) for k in COLUMNS}
