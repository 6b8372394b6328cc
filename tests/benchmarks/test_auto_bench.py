"""Suite ``auto``: auto against every key it races; the comparison and a quick run."""

from __future__ import annotations

import math

import pytest

from gpscale.benchmarks import auto as suite


def test_comparison_marks_autos_distance_from_the_best_key():
    rows = [{"method": "auto", "test_rmse": 0.206, "test_nll": -0.50},
            {"method": "svgp", "test_rmse": 0.250, "test_nll": -0.40},
            {"method": "cagp-opt", "test_rmse": 0.200, "test_nll": -0.52},
            {"method": "softki", "test_rmse": None, "test_nll": None}]  # a failed run
    suite._compare(rows)
    assert rows[0]["best_key"] == "cagp-opt"
    assert rows[0]["rmse_over_best"] == pytest.approx(0.03)
    assert rows[0]["nll_over_best"] == pytest.approx(0.02)


def test_unknown_sets_are_named():
    with pytest.raises(ValueError, match="auto runs on .*'yacht'"):
        suite.run(None, datasets=("yacht",))


@pytest.mark.long
def test_quick_run(tmp_path):
    rows = suite.run(tmp_path, quick=True)
    assert rows[0]["method"] == "auto" and rows[0]["chose"] in {r["method"] for r in rows[1:]}
    assert {r["method"] for r in rows[1:]} >= {"svgp", "solvegp", "softki"}
    assert all(math.isfinite(r["test_rmse"]) for r in rows)
    assert math.isfinite(rows[0]["rmse_over_best"]) and (tmp_path / "report.md").exists()
