"""Suite ``calibration``: the plan, the generated sets of known noise, and a quick run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpscale.benchmarks import calibration
from gpscale.methods import METHODS


def test_plan_runs_every_regression_key_where_it_applies():
    plan = list(calibration._plan(None))
    regression = {k for k, s in METHODS.items()
                  if "regression" in s.tasks and s.inputs == "vectors"}
    assert {k for d, k in plan if d == "gen-d1-n1500"} == regression
    assert {k for d, k in plan if d == "gen-d5-n2250"} == regression - {"ski", "ggp"}
    assert {k for d, k in plan if d == "protein"} == regression - {"ski", "ggp", "exact",
                                                                   "cggp"}
    assert {d for d, _ in plan} == set(calibration.GENERATED + calibration.UCI_SETS)
    with pytest.raises(ValueError, match="calibration runs on"):
        list(calibration._plan(("yacht",)))


def test_plan_keeps_the_keys_asked_for():
    plan = list(calibration._plan(("gen-d5-n1500", "parkinsons"), ("softki", "sgpr")))
    assert plan == [(d, k) for d in ("gen-d5-n1500", "parkinsons") for k in ("sgpr", "softki")]
    with pytest.raises(ValueError, match="unknown"):
        calibration.run(Path("unused"), runs=("sgpr", "not-a-key"))


@pytest.mark.parametrize("name", calibration.GENERATED)
def test_generated_sets_have_the_stated_size_and_noise(tmp_path, name):
    path, d, n = calibration.write_generated(name, tmp_path)
    table = np.loadtxt(path, delimiter=",", skiprows=1)
    assert table.shape == (n + calibration.TEST_ROWS, d + 1)
    x, y = table[:, :d], table[:, -1]
    f = np.sin(3 * x[:, 0]) + (np.cos(2 * x[:, 1:]).sum(1) / (d - 1) if d > 1 else 0.0)
    assert abs(np.std(y - f) - calibration.NOISE_STD) < 0.01
    (tmp_path / "again").mkdir()
    again, _, _ = calibration.write_generated(name, tmp_path / "again")
    assert np.array_equal(np.loadtxt(again, delimiter=",", skiprows=1), table)


@pytest.mark.long  # the suite's quick run: every key on a generated set
def test_quick_run_covers_about_95_percent(tmp_path):
    rows = calibration.run(tmp_path, quick=True)
    for row in rows:
        assert abs(row["test_coverage"] - 0.95) < 0.05, row
    assert (tmp_path / "report.md").exists()
