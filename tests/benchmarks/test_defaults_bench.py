"""Suite ``defaults``: every key with no options; the plan and a quick run."""

from __future__ import annotations

import math

import pytest

from gpscale.benchmarks import defaults
from gpscale.methods import METHODS


def test_plan_runs_every_key_with_no_options():
    plan = list(defaults._plan(False, None))
    regression = sorted(k for k, s in METHODS.items()  # ski, ggp: d ≤ 3 only; tables only
                        if "regression" in s.tasks and k not in ("ski", "ggp")
                        and s.inputs == "vectors")
    on_parkinsons = sorted(key for dataset, key, _ in plan if dataset == "parkinsons")
    assert on_parkinsons == regression
    on_bike = {key for dataset, key, _ in plan if dataset == "bike"}
    assert on_bike == set(regression) - {"exact", "cggp"}  # O(n³) only on the small set
    on_mnist = {key for dataset, key, _ in plan if dataset == "mnist"}
    assert on_mnist == {"iterncgp", "svgp", "solvegp"}
    assert {d for d, _, _ in plan} == set(defaults.REGRESSION_SETS + defaults.CLASSIFICATION_SETS)
    with pytest.raises(ValueError, match="defaults runs on"):
        list(defaults._plan(False, ("yacht",)))


@pytest.mark.long
def test_quick_run_on_the_mixture(tmp_path):
    rows = defaults.run(tmp_path, quick=True, datasets=("gmm10",))
    assert [r["method"] for r in rows] == ["iterncgp", "solvegp", "svgp"]
    for r in rows:
        assert 0.1 < r["test_accuracy"] <= 1 and math.isfinite(r["test_nll"])
    assert (tmp_path / "report.md").exists()
