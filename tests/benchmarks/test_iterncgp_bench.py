"""Suite ``iterncgp``: plan, metric curves per Newton step, budget stop, report and plots."""

from __future__ import annotations

import csv
import math

import pytest
import torch

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


def _fake_mnist_runs(monkeypatch, time_s: float, setup_s: float, kernel=None) -> list:
    """Replace the IterNCGP and SVGP runs of the MNIST part by instant fakes; returns the list
    the SVGP specs are appended to. ``kernel`` is what the fake IterNCGP reports (default: the
    run's own options)."""
    specs = []

    def fake_curve(data, options, budget):
        used = kernel or {k: options[k] for k in iterncgp.MNIST_PAPER}
        return {"curve": [{"time_s": time_s, "epoch": 1}], "setup_s": setup_s,
                "train_time_s": time_s, "kernel": used, "newton_steps": 1, "stopped": "converged"}

    def fake_svgp(spec):
        specs.append(spec)
        return {"curve": [{"time_s": 1.0, "epoch": 1}], "train_time_s": 1.0}

    monkeypatch.setattr(iterncgp, "_iterncgp_curve", fake_curve)
    monkeypatch.setattr(iterncgp, "_svgp", fake_svgp)
    return specs


def test_mnist_svgp_runs_learned_and_frozen_at_the_prefit_kernel(monkeypatch):
    prefit = {"kernel": "matern32", "lengthscale": 23.2, "outputscale": 3.36}
    specs = _fake_mnist_runs(monkeypatch, 7.0, 3.0, kernel=prefit)
    rows = iterncgp._part_mnist(False, [], runs=("pcg-j5-prefit",))
    assert [r["setting"] for r in rows] == [
        "pcg-j5-prefit", "100/class, learned", "100/class, pre-fit kernel frozen"]
    assert [s.max_time for s in specs] == [10.0, 10.0]  # the pre-fit counts in the budget
    assert "learn_kernel" not in specs[0].options
    frozen = specs[1].options
    assert frozen["learn_kernel"] is False and frozen["mean_constant"] == 0.0
    assert {k: frozen[k] for k in prefit} == prefit


@pytest.mark.parametrize("time_s, budget", [(30.0, iterncgp.MNIST_PAPER_SVGP_BUDGET_S),
                                            (300.0, 300.5)])
def test_mnist_paper_runs_compare_with_svgp_frozen_at_the_paper_kernel(monkeypatch, time_s,
                                                                       budget):
    specs = _fake_mnist_runs(monkeypatch, time_s, 0.5)
    rows = iterncgp._part_mnist(False, [], runs=("cg-j1-paper", "cg-j5-paper"))
    assert [r["setting"] for r in rows] == [
        "cg-j1-paper", "cg-j5-paper", "100/class, paper kernel frozen"]
    (spec,) = specs  # no pre-fit run, so no learned or pre-fit-frozen SVGP
    assert spec.max_time == pytest.approx(budget)  # the paper's 200 s, or IterNCGP's if longer
    assert spec.options["learn_kernel"] is False and spec.options["mean_constant"] == 0.0
    assert {k: spec.options[k] for k in iterncgp.MNIST_PAPER} == iterncgp.MNIST_PAPER


@pytest.mark.slow
def test_poisson_learning_part_lands_near_the_dense_laplace_maximiser(tmp_path):
    """Two draws with the defaults: the learned ℓ within 10 % and s within 25 % of the dense
    Laplace-evidence maximiser on the same counts (the defaults maximise the variational
    bound, not the Laplace evidence, so the two need not coincide), one row per draw."""
    rows = iterncgp.run(tmp_path, quick=True, datasets=("poisson-learning",))
    assert [r["setting"] for r in rows] == ["draw 0", "draw 1"]
    for r in rows:
        assert r["lengthscale"] == pytest.approx(r["dense_lengthscale"], rel=0.10)
        assert r["outputscale"] == pytest.approx(r["dense_outputscale"], rel=0.25)
        assert r["mean_f2"] > 0
    assert "dense_lengthscale" in (tmp_path / "report.md").read_text()


def test_dense_laplace_evidence_of_one_large_count_matches_quadrature():
    """One datum y = 30 under f ~ N(0, s): the evidence is a 1-D integral, and at a count this
    large the posterior of f is nearly Gaussian, so the Laplace value is within 0.01 of it."""
    x = torch.zeros(1, 1, dtype=torch.float64)
    y = torch.tensor([30.0], dtype=torch.float64)
    s = 4.0
    f = torch.linspace(-12, 12, 200_001, dtype=torch.float64)
    log_joint = (y * f - f.exp() - torch.lgamma(y + 1) - 0.5 * f**2 / s
                 - 0.5 * math.log(2 * math.pi * s))
    exact = float(torch.logsumexp(log_joint, 0) + math.log(float(f[1] - f[0])))
    laplace = iterncgp.laplace_log_evidence(x, y, 1.0, s)
    assert laplace == pytest.approx(exact, abs=0.01)  # large counts: the posterior is ~Gaussian
