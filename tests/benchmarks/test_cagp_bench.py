"""Suite ``cagp``: its plan follows Table 1, and a tiny run writes the report, curves and plot."""

from __future__ import annotations

import csv

import pytest

from gpscale.benchmarks import cagp
from gpscale.benchmarks.registry import SUITES


def test_plan_uses_table1_settings():
    entries = cagp.plan()
    keys = {(e.dataset, e.method, e.optimizer) for e in entries}
    assert len(entries) == len(keys) == 4 * 3 + 2  # L-BFGS rows on Parkinsons and Bike only
    assert ("bike", "cagp-opt", "lbfgs") in keys and ("protein", "cagp-opt", "lbfgs") not in keys
    by_key = {(e.dataset, e.method, e.optimizer): e for e in entries}
    protein = by_key["protein", "cagp-opt", "adam"]
    assert (protein.lr, protein.epochs, protein.options["num_actions"]) == (0.1, 941, 512)
    assert by_key["bike", "cagp-opt", "lbfgs"].overrides["dtype"] == "float64"
    assert by_key["keggundirected", "svgp", "adam"].options["num_inducing"] == 1024
    assert by_key["keggundirected", "svgp", "adam"].overrides["batch_size"] == 1024
    assert all(e.dataset in cagp.BUDGET_S for e in entries)
    # the paper's method: its code's random blocks, not the library's default local cells
    assert all(e.options["blocks"] == "random" for e in entries if e.method == "cagp-opt")


def test_quick_plan_is_small_and_datasets_are_checked():
    entries = cagp.plan(quick=True)
    assert {e.dataset for e in entries} == {"parkinsons"}
    assert all(e.epochs == 2 and max(v for v in e.options.values() if isinstance(v, int)) == 64
               for e in entries)
    assert {e.dataset for e in cagp.plan(datasets=("bike",))} == {"bike"}
    with pytest.raises(ValueError, match="elevators"):
        cagp.plan(datasets=("elevators",))
    assert SUITES["cagp"].runner() is cagp.run


def test_tiny_run_writes_report_curves_and_memory(tmp_path, monkeypatch):
    tiny = [cagp.Entry("housing", "cagp-opt", "adam", 0.1, 2, 1, {"num_actions": 16}),
            cagp.Entry("housing", "sgpr", "adam", 0.1, 2, 1, {"num_inducing": 16})]
    monkeypatch.setattr(cagp, "plan", lambda quick, datasets: tiny)
    monkeypatch.setitem(cagp.PAPER_NLL, "housing", -1.0)
    monkeypatch.setattr(cagp, "memory_rows", lambda ns, i: [{"n": 10, "peak_mb": 1.0}])
    rows = cagp.run(tmp_path, quick=True)
    assert [r["method"] for r in rows] == ["cagp-opt", "sgpr"]
    assert rows[0]["paper_nll"] == -1.0 and rows[1]["paper_nll"] is None
    assert all(r["epochs"] == 2 and r["best_test_nll"] <= r["test_nll"] for r in rows)
    curves = list(csv.DictReader(open(tmp_path / "curves.csv")))
    assert len(curves) == 4 and {c["method"] for c in curves} == {"cagp-opt (adam)", "sgpr (adam)"}
    assert (tmp_path / "curves_housing.png").stat().st_size > 1000
    assert "Peak memory of one CaGP-Opt step" in (tmp_path / "report.md").read_text()


@pytest.mark.slow  # two fresh processes that each compile the kernel product: ~1 min
def test_memory_sweep_grows_with_n_and_stays_below_dense():
    """Two sizes in fresh processes: the step's memory is far below the n×n kernel matrix."""
    rows = cagp.memory_rows((3_000, 6_000), num_actions=32)
    assert [r["n"] for r in rows] == [3_000, 6_000]
    assert rows[0]["mb_per_1k_points"] is None and rows[1]["mb_per_1k_points"] is not None
    assert rows[1]["peak_mb"] < rows[1]["dense_kernel_mb"] / 2


def test_a_failing_run_is_recorded_and_the_suite_goes_on(tmp_path, monkeypatch):
    """lr = 1e6 makes the first run fail; its row says so and the next run still happens."""
    tiny = [cagp.Entry("housing", "svgp", "adam", 1e6, 3, 1, {"num_inducing": 8}),
            cagp.Entry("housing", "sgpr", "adam", 0.1, 1, 1, {"num_inducing": 8})]
    monkeypatch.setattr(cagp, "plan", lambda quick, datasets: tiny)
    monkeypatch.setattr(cagp, "memory_rows", lambda ns, i: [])

    def boom(spec):
        if spec.lr == 1e6:
            raise cagp.NonFiniteLossError("loss became nan", epoch=2, history=None)
        return real_run(spec)

    real_run = cagp.runner.run
    monkeypatch.setattr(cagp.runner, "run", boom)
    rows = cagp.run(tmp_path, quick=True)
    assert rows[0]["stopped"] == "failed in epoch 2" and rows[0]["epochs"] == 1
    assert rows[1]["method"] == "sgpr" and rows[1]["test_nll"] is not None
    assert "failed in epoch 2" in (tmp_path / "report.md").read_text()


def test_datasets_pick_the_parts_to_run(tmp_path, monkeypatch):
    """``--datasets parkinsons`` skips the memory sweep; ``--datasets memory`` runs only it."""
    calls = []
    monkeypatch.setattr(cagp, "memory_rows", lambda ns, i: calls.append("memory") or [])
    monkeypatch.setattr(cagp, "plan", lambda quick, datasets: calls.append(datasets) or [])
    cagp.run(tmp_path, quick=True, datasets=("parkinsons",))
    assert calls == [("parkinsons",)]
    calls.clear()
    cagp.run(tmp_path, quick=True, datasets=("memory",))
    assert calls == ["memory"]
    assert "Peak memory" not in (tmp_path / "report.md").read_text()  # the sweep returned []
