"""Suite ``auto``: ``method="auto"`` against every key it races, each with its defaults, on the
same split, one after another in one run.

For each set, ``auto`` runs as ``gpscale fit`` runs it (the race on held-out rows, then its
winner on every row), then every key of :func:`gpscale.methods.auto.race_candidates` for that
set as ``gpscale fit --method KEY`` runs it. The report gives each run's test RMSE, NLL,
coverage and seconds (``auto``'s include its race), and per set the best single key by test
RMSE with ``auto``'s distance from it: RMSE ratio − 1 and NLL difference. The sets: the UCI sets
on which the race runs (n > 2,000), and three generated ones — 12 inputs of which 5 matter,
128 inputs on 2,250 rows (``projections128``), a 3-input field. ``--quick`` runs one small
generated set with epoch-bound runs (a smoke test).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from gpscale import run as runner
from gpscale.data import load_dataset
from gpscale.methods.auto import race_candidates
from gpscale.report import write_results
from gpscale.run import RunSpec

__all__ = ["run", "SETS"]

log = logging.getLogger("gpscale.benchmarks")

SETS: dict[str, tuple[str, dict[str, Any]]] = {
    "skillcraft": ("skillcraft", {}),
    "parkinsons": ("parkinsons", {}),
    "elevators": ("elevators", {}),
    "bike": ("bike", {}),
    "kin40k": ("kin40k", {}),
    "protein": ("protein", {}),
    "keggundirected": ("keggundirected", {}),
    "relevant12": ("relevant32", {"num_dims": 12, "num_relevant": 5, "num_train": 8_000}),
    "projections128": ("projections128", {}),
    "field3d": ("field3d", {"num_train": 20_000, "num_test": 5_000}),
}
"""Suite set name → (dataset, data options)."""
QUICK = ("projections-quick", ("projections128", {"num_train": 2_100, "num_test": 200,
                                                  "num_dims": 16}))
QUICK_EPOCHS = 6
COLUMNS = ("dataset", "method", "chose", "n_train", "num_dims", "epochs", "stopped",
           "seconds", "test_rmse", "test_nll", "test_coverage", "best_key", "rmse_over_best",
           "nll_over_best")
RMSE_WITHIN, NLL_WITHIN = 0.03, 0.03
"""What ``auto`` is to reach: within 3 % of the best single key's test RMSE and 0.03 of its
test NLL."""


def _row(name: str, key: str, metrics: dict[str, Any]) -> dict[str, Any]:
    seconds = sum(float(metrics.get(k) or 0.0) for k in ("auto_time_s", "setup_time_s",
                                                          "train_time_s"))
    return {"dataset": name, "method": "auto" if key == "auto" else key,
            "chose": metrics.get("method") if key == "auto" else None,
            "n_train": metrics.get("n_train"), "num_dims": metrics.get("num_dims"),
            "epochs": metrics.get("epochs"), "stopped": metrics.get("stopped"),
            "seconds": round(seconds, 1), "test_rmse": metrics.get("test_rmse"),
            "test_nll": metrics.get("test_nll"), "test_coverage": metrics.get("test_coverage"),
            "reason": metrics.get("method_reason")}  # the race's figures, in results.jsonl


def _compare(rows: list[dict[str, Any]]) -> None:
    """Mark ``auto``'s row with the best single key and its distance from it."""
    singles = [r for r in rows[1:] if isinstance(r.get("test_rmse"), float)
               and math.isfinite(r["test_rmse"])]
    if not singles or not isinstance(rows[0].get("test_rmse"), float):
        return
    best = min(singles, key=lambda r: r["test_rmse"])
    rows[0]["best_key"] = best["method"]
    rows[0]["rmse_over_best"] = rows[0]["test_rmse"] / best["test_rmse"] - 1.0
    rows[0]["nll_over_best"] = rows[0]["test_nll"] - best["test_nll"]


def run(out_dir: Path, *, quick: bool = False,
        datasets: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """``auto`` and every key it races, with defaults, on each set (or ``datasets``)."""
    if quick:
        plan = dict([QUICK])
    else:
        unknown = set(datasets or ()) - set(SETS)
        if unknown:
            raise ValueError(f"auto runs on {', '.join(SETS)}; got {sorted(unknown)}")
        plan = {name: SETS[name] for name in (datasets or tuple(SETS))}
    notes = ("auto (race, then its winner on every row) against each key it races, every run "
             "with its defaults on split 0; seconds include auto's race. Within: RMSE "
             f"{RMSE_WITHIN:.0%} over the best key's, NLL {NLL_WITHIN} above it."
             + (f" QUICK: {QUICK_EPOCHS} epochs per run." if quick else ""))
    rows: list[dict[str, Any]] = []
    for name, (dataset, options) in plan.items():
        data = load_dataset(dataset, split=0, seed=0, **options)
        keys = race_candidates(data.task, data.num_train, data.num_dims, {})
        these: list[dict[str, Any]] = []
        for key in ["auto", *keys]:
            log.info("auto suite: %s on %s", key, name)
            spec = RunSpec(method=key, dataset=dataset, split=0, seed=0, progress=False,
                           dataset_options=options, epochs=QUICK_EPOCHS if quick else None)
            these.append(_row(name, key, runner.run_metrics(spec)))
            _compare(these)
            write_results(out_dir, "auto", rows + these, columns=COLUMNS, notes=notes)
        rows += these
    return rows
