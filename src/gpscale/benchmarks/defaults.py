"""Suite ``defaults``: every method with no options, as ``gpscale fit --method KEY`` runs it.

What a new user gets: each regression key on Parkinsons, Elevators, Bike, Protein and Kin40k,
and each classification key on the 10-class mixture (gmm10) and MNIST, with the method's default
options and training settings (the ``default`` preset: stop on convergence within its time
budget). It records test RMSE / NLL (accuracy / NLL / ECE for classification), epochs, why
training stopped and the time. The exact GP runs on Parkinsons only (O(n³)); SKI and GGP
(grid interpolation, d ≤ 3) on none of these sets.
``--quick`` runs every key once on a small set with a 3 s budget (a smoke test).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gpscale import run as runner
from gpscale.data.datasets import get_entry
from gpscale.methods import METHODS
from gpscale.methods.auto import GRID_MAX_DIMS
from gpscale.report import write_results
from gpscale.run import RunSpec

__all__ = ["run", "REGRESSION_SETS", "CLASSIFICATION_SETS"]

log = logging.getLogger("gpscale.benchmarks")

REGRESSION_SETS = ("parkinsons", "elevators", "bike", "protein", "kin40k")
CLASSIFICATION_SETS = ("gmm10", "mnist")
EXACT_ONLY_ON = ("parkinsons",)
GRID_KEYS = ("ski", "ggp")
QUICK_EPOCHS, QUICK_MAX_TIME = 20, 30.0
"""``--quick``: an epoch count, so that a loaded machine does not leave a run untrained (a 3 s
budget once gave SVGP too few epochs beside another test process: accuracy at chance), and a
time cap for the slow full-batch keys."""
COLUMNS = ("dataset", "method", "n_train", "num_dims", "epochs", "stopped", "setup_time_s",
           "train_time_s", "test_rmse", "test_nll", "test_accuracy", "test_ece",
           "test_coverage_error", "noise")


def _keys(task: str) -> list[str]:
    """The tabular keys of ``task`` (image methods have their own rows: suite ``solvegp``)."""
    return sorted(k for k, spec in METHODS.items() if task in spec.tasks
                  and spec.inputs == "vectors"
                  and not (task == "classification" and k == "sod-laplace"))


def _plan(quick: bool, datasets: tuple[str, ...] | None):
    valid = REGRESSION_SETS + CLASSIFICATION_SETS
    chosen = datasets or (("parkinsons", "gmm10") if quick else valid)
    unknown = set(chosen) - set(valid)
    if unknown:
        raise ValueError(f"defaults runs on {', '.join(valid)}; got {sorted(unknown)}")
    for dataset in chosen:
        task = "classification" if dataset in CLASSIFICATION_SETS else "regression"
        for key in _keys(task):
            if key in ("exact", "cggp") and dataset not in EXACT_ONLY_ON:
                continue
            if key in GRID_KEYS and get_entry(dataset).d > GRID_MAX_DIMS:
                continue  # grid interpolation: d ≤ 3 only (the 2-D CSV rows in BENCHMARKS.md)
            data_options: dict[str, Any] = {}
            if quick and dataset == "gmm10":
                data_options = {"num_train_per_class": 50, "num_test_per_class": 20}
            yield dataset, key, data_options


def run(out_dir: Path, *, quick: bool = False,
        datasets: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Every key with no options on each data set (or ``datasets``); report into ``out_dir``."""
    rows = []
    notes = ("Every method with no options and its default training settings (stop on "
             "convergence within the printed budget). Metrics on the standardised target scale. "
             + (f"QUICK: {QUICK_EPOCHS} epochs per run (at most {QUICK_MAX_TIME:.0f} s)."
                if quick else ""))
    for dataset, key, data_options in _plan(quick, datasets):
        log.info("defaults: %s on %s", key, dataset)
        spec = RunSpec(method=key, dataset=dataset, split=0, seed=0, progress=False,
                       dataset_options=data_options,
                       epochs=QUICK_EPOCHS if quick else None,
                       max_time=QUICK_MAX_TIME if quick else None)
        metrics = runner.run_metrics(spec)  # a diverged run is a row, the suite goes on
        rows.append({k: metrics.get(k) for k in COLUMNS})
        log.info("defaults: %s on %s: test RMSE %s, NLL %s", key, dataset,
                 metrics.get("test_rmse"), metrics.get("test_nll"))
        # the report after every run: a suite of hours stopped midway keeps what it measured
        write_results(out_dir, "defaults", rows, columns=COLUMNS, notes=notes)
    return rows
