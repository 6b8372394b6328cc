"""Suite ``calibration``: the 95 % intervals of every regression key with its defaults.

Each key runs as ``gpscale fit`` runs it (no options; the default preset, or ``max_time``
seconds of training), on generated sets of known noise and on UCI sets. The generated sets are
y = f(x) + 0.1·ε on uniform inputs in [−2, 2]^d, f(x) = sin 3x₁ + Σ_{j>1} cos 2x_j / (d − 1),
with n training rows and 2,000 fresh test rows (``gen-d{d}-n{n}``: d = 1, 5 and n = 1,500,
2,250). The report gives each run's share of test rows inside its central 95 % interval
(``test_coverage``), its mean predictive standard deviation against the noise's (both on the
standardised target scale), RMSE and NLL, its epochs and why training stopped. SKI and GGP
run where d ≤ 3, the exact GP and CG-GP on up to 20,000 training rows.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from gpscale import run as runner
from gpscale.data.datasets import get_entry
from gpscale.methods import METHODS
from gpscale.methods.auto import GRID_MAX_DIMS
from gpscale.report import write_results
from gpscale.run import RunSpec

__all__ = ["run", "GENERATED", "UCI_SETS", "write_generated"]

log = logging.getLogger("gpscale.benchmarks")

GENERATED = ("gen-d1-n1500", "gen-d1-n2250", "gen-d5-n1500", "gen-d5-n2250")
UCI_SETS = ("airfoil", "concrete", "skillcraft", "parkinsons", "elevators", "protein")
"""Small sets first: there every key stops on its own convergence within its default budget."""
NOISE_STD = 0.1
TEST_ROWS = 2_000
DENSE_MAX_ROWS = 20_000
QUICK_MAX_TIME = 10.0
COLUMNS = ("dataset", "method", "n_train", "num_dims", "epochs", "stopped", "train_time_s",
           "test_coverage", "test_mean_std", "noise_std", "test_rmse", "test_nll")


def write_generated(name: str, folder: Path) -> tuple[Path, int, int]:
    """Write the generated set ``name`` as a CSV into ``folder``; (path, d, training rows)."""
    d, n = (int(part[1:]) for part in name.split("-")[1:])
    rng = np.random.default_rng(1_000 * d + n)
    x = rng.uniform(-2, 2, size=(n + TEST_ROWS, d))
    f = np.sin(3 * x[:, 0]) + (np.cos(2 * x[:, 1:]).sum(1) / (d - 1) if d > 1 else 0.0)
    y = f + NOISE_STD * rng.standard_normal(n + TEST_ROWS)
    path = folder / f"{name}.csv"
    header = ",".join([f"x{j}" for j in range(d)] + ["y"])
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=header, comments="")
    return path, d, n


def _keys(dims: int, rows: int) -> list[str]:
    keys = sorted(k for k, spec in METHODS.items()  # tables: no image methods
                  if "regression" in spec.tasks and spec.inputs == "vectors")
    return [k for k in keys if not (k in ("ski", "ggp") and dims > GRID_MAX_DIMS)
            and not (k in ("exact", "cggp") and rows > DENSE_MAX_ROWS)]


def _spec(dataset: str, folder: Path, key: str, max_time: float | None
          ) -> tuple[RunSpec, float | None]:
    """The run of ``key`` on ``dataset`` and the noise's standard deviation in y's units
    (``None`` for a UCI set)."""
    if dataset.startswith("gen-"):
        path, _, n = write_generated(dataset, folder)
        fraction = TEST_ROWS / (n + TEST_ROWS)
        return RunSpec(method=key, csv=str(path), target="y", progress=False,
                       max_time=max_time, dataset_options={"test_fraction": fraction}), NOISE_STD
    return RunSpec(method=key, dataset=dataset, progress=False, max_time=max_time), None


def _plan(datasets: tuple[str, ...] | None, runs: tuple[str, ...] | None = None):
    chosen = datasets or GENERATED + UCI_SETS
    unknown = set(chosen) - set(GENERATED + UCI_SETS)
    if unknown:
        raise ValueError(f"calibration runs on {', '.join(GENERATED + UCI_SETS)}; got "
                         f"{sorted(unknown)}")
    for dataset in chosen:
        if dataset.startswith("gen-"):
            d, n = (int(part[1:]) for part in dataset.split("-")[1:])
        else:
            entry = get_entry(dataset)
            d, n = entry.d, entry.n
        for key in _keys(d, n):
            if not runs or key in runs:
                yield dataset, key


def run(out_dir: Path, *, quick: bool = False, datasets: tuple[str, ...] | None = None,
        max_time: float | None = None, runs: tuple[str, ...] | None = None
        ) -> list[dict[str, Any]]:
    """Every regression key (or those of ``runs``) with its defaults on each set; report into
    ``out_dir``."""
    unknown = set(runs or ()) - set(METHODS)
    if unknown:
        raise ValueError(f"calibration runs method keys; unknown: {sorted(unknown)}")
    out_dir = Path(out_dir)
    folder = out_dir / "data"
    folder.mkdir(parents=True, exist_ok=True)
    if quick:
        datasets, max_time = datasets or ("gen-d1-n1500",), max_time or QUICK_MAX_TIME
    notes = ("Every regression key with no options (default preset"
             + (f", {max_time:g} s of training" if max_time else "") + "). Coverage: share of "
             "test rows inside the central 95 % interval; mean std and noise std on the "
             "standardised target scale.")
    rows = []
    for dataset, key in _plan(datasets, runs):
        spec, noise = _spec(dataset, folder, key, max_time)
        log.info("calibration: %s on %s", key, dataset)
        result = runner.run(spec)
        m, data = result.metrics, result.data
        scale = getattr(data.transform, "y_std", 1.0) if data.transform is not None else 1.0
        rows.append({**{k: m.get(k) for k in COLUMNS}, "dataset": dataset,
                     "noise_std": None if noise is None else noise / scale})
        log.info("calibration: %s on %s: coverage %.3f, mean std %.4f", key, dataset,
                 m.get("test_coverage", math.nan), m.get("test_mean_std", math.nan))
        write_results(out_dir, "calibration", rows, columns=COLUMNS, notes=notes)
    return rows
