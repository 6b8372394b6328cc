"""Suite ``iterncgp``: plan, metric curves per Newton step, budget stop, report and plots."""

from __future__ import annotations

import csv

import pytest

from gpscale.benchmarks import iterncgp
from gpscale.benchmarks.registry import SUITES
from gpscale.data import load_dataset


def test_gmm_plan_matches_the_paper_grid():
    plan = iterncgp.gmm_plan()
    settings = {(m, s) for m, s, _ in plan}
    assert ("iterncgp", "R=10") in settings and ("iterncgp", "R=inf") in settings
    assert {s for m, s, _ in plan if m == "sod-laplace"} == {
        f"N_sub={n}" for n in (250, 500, 1000, 2000)}
    svgp = {s: o for m, s, o in plan if m == "svgp"}
    assert svgp == {"U=500": {"num_inducing": 50}, "U=1000": {"num_inducing": 100}}
    assert SUITES["iterncgp"].runner() is iterncgp.run


def test_curve_has_one_row_per_newton_step_and_counts_iterations():
    data = load_dataset("poisson1d", split=0)
    options = {**iterncgp.POISSON_HYPERS, "max_iterations": 2, "max_newton_steps": 6,
               "outer_rtol": 0.0, "atol": 0.0, "rtol": 0.0}
    out = iterncgp._iterncgp_curve(data, options, None)
    assert [r["epoch"] for r in out["curve"]] == list(range(1, 7))
    assert [r["solver_iterations"] for r in out["curve"]] == [2, 4, 6, 8, 10, 12]
    times = [r["time_s"] for r in out["curve"]]
    assert times == sorted(times) and out["train_time_s"] == times[-1]
    assert out["stopped"] == "max_newton_steps" and out["newton_steps"] == 6
    assert out["test_nll"] == out["curve"][-1]["test_nll"] < out["curve"][0]["test_nll"]


def test_budget_stops_after_the_step_that_exceeds_it():
    data = load_dataset("poisson1d", split=0)
    out = iterncgp._iterncgp_curve(data, {**iterncgp.POISSON_HYPERS, "max_iterations": 1},
                                   budget=0.0)
    assert out["stopped"] == "time" and out["newton_steps"] == 1 and len(out["curve"]) == 1


def test_poisson_part_writes_report_curves_and_plot(tmp_path):
    rows = iterncgp.run(tmp_path, datasets=("poisson",))
    assert [r["setting"] for r in rows] == ["j<=1", "j<=5", "j<=10", "j<=20"]
    assert all(r["solver_iterations"] <= iterncgp.POISSON_TOTAL_ITERATIONS for r in rows)
    # j <= 20: all 5 Newton steps run (no early outer stop); an inner solve may end a few
    # iterations early at its residual tolerance (95 or 100 depending on the data's rounding)
    assert rows[-1]["newton_steps"] == 5 and rows[-1]["stopped"] == "max_newton_steps"
    assert 80 < rows[-1]["solver_iterations"] <= 100
    curves = list(csv.DictReader(open(tmp_path / "curves.csv")))
    assert {c["method"] for c in curves} == {"j<=1", "j<=5", "j<=10", "j<=20"}
    assert (tmp_path / "poisson_curves.png").stat().st_size > 1000
    assert "j<=20" in (tmp_path / "report.md").read_text()
    with pytest.raises(ValueError, match="mixture"):
        iterncgp.run(tmp_path, datasets=("bike",))


def test_mnist_runs_have_comma_free_unique_labels_and_unknown_ones_raise(tmp_path):
    labels = [label for label, _ in iterncgp.MNIST_RUNS]
    assert len(set(labels)) == len(labels) and not any("," in label for label in labels)
    assert {o.get("policy", "cg") for _, o in iterncgp.MNIST_RUNS} == {"cg", "pcg"}
    with pytest.raises(ValueError, match="unknown iterncgp runs"):
        iterncgp.run(tmp_path, quick=True, datasets=("poisson",), runs=("cg, j<=1",))


def test_curve_reports_the_kernel_it_used():
    data = load_dataset("poisson1d", split=0)
    out = iterncgp._iterncgp_curve(data, {**iterncgp.POISSON_HYPERS, "max_iterations": 1,
                                          "max_newton_steps": 1}, None)
    assert out["kernel"]["kernel"] == "rbf"
    assert out["kernel"]["lengthscale"] == pytest.approx(0.1)
    assert out["kernel"]["outputscale"] == pytest.approx(5.0)


def test_mnist_svgp_runs_learned_and_frozen_at_the_prefit_kernel(monkeypatch, tmp_path):
    prefit = {"kernel": "matern32", "lengthscale": 23.2, "outputscale": 3.36}
    specs = []

    def fake_curve(data, options, budget):
        return {"curve": [{"time_s": 7.0, "epoch": 1}], "setup_s": 3.0, "train_time_s": 7.0,
                "kernel": prefit, "newton_steps": 1, "stopped": "converged"}

    def fake_svgp(spec):
        specs.append(spec)
        return {"curve": [{"time_s": 1.0, "epoch": 1}], "train_time_s": 1.0}

    monkeypatch.setattr(iterncgp, "_iterncgp_curve", fake_curve)
    monkeypatch.setattr(iterncgp, "_svgp", fake_svgp)
    rows = iterncgp._part_mnist(False, [], runs=("pcg-j5-prefit",))
    assert [r["setting"] for r in rows] == [
        "pcg-j5-prefit", "100/class, learned", "100/class, pre-fit kernel frozen"]
    assert [s.max_time for s in specs] == [10.0, 10.0]  # the pre-fit counts in the budget
    assert "learn_kernel" not in specs[0].options
    frozen = specs[1].options
    assert frozen["learn_kernel"] is False and frozen["mean_constant"] == 0.0
    assert {k: frozen[k] for k in prefit} == prefit
