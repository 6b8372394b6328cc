"""Suite ``softki`` (notes/003 §3.4–3.5): the quick smoke run and the plan's validation."""

from __future__ import annotations

import csv
import math

import pytest

from gpscale.benchmarks import softki


@pytest.mark.slow
def test_quick_run_writes_one_row_per_method(data_root, tmp_path, monkeypatch):
    """quick=True: Elevators, 1 epoch, m = 32; six finite rows, SVGP-512's speed ratio is 1."""
    monkeypatch.setenv("GPSCALE_DATA", str(data_root))
    rows = softki.run(tmp_path, quick=True)
    assert [r["label"] for r in rows] == [
        "SoftKI-512", "SGPR-512", "SVGP-1024", "SVGP-512", "SoftKI-512-fixed", "SoftKI-512-ard"]
    for r in rows:
        assert r["dataset"] == "elevators" and r["epochs"] == 1 and r["num_inducing"] == 32
        assert math.isfinite(r["test_rmse"]) and 0 < r["test_rmse"] < 2
        assert r["time_per_epoch_s"] > 0
    assert rows[3]["time_vs_svgp512"] == pytest.approx(1.0)
    assert rows[4]["noise"] == pytest.approx(1e-3, rel=1e-4)  # the paper's fixed noise
    assert rows[0]["noise"] != pytest.approx(1e-3, rel=1e-2)  # calibrated after training
    assert rows[0]["paper_rmse"] == 0.389 and rows[3]["paper_time_per_epoch_s"] == 1.11
    with open(tmp_path / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 6
    assert "QUICK" in (tmp_path / "report.md").read_text()


def test_full_plan_follows_the_paper():
    """50 epochs, batch 1024, lr 0.01 (SGPR: full batch, lr 0.1), RBF with one lengthscale."""
    plan = list(softki._plan(False, ("bike",)))
    assert [label for _, label, _ in plan] == [
        "SoftKI-512", "SGPR-512", "SVGP-1024", "SVGP-512", "SoftKI-512-fixed", "SoftKI-512-ard"]
    for _, label, spec in plan:
        assert spec.epochs == 50 and spec.split == 0 and spec.max_time == softki.MAX_TIME
        ard = label == "SoftKI-512-ard"  # the library's default model; the rest the paper's
        assert spec.options["kernel"] == "rbf" and spec.options["ard"] is ard
        if label.startswith("SoftKI"):
            assert spec.options["distance"] == ("relative" if ard else "euclidean")
        assert spec.lr == (0.1 if label == "SGPR-512" else 0.01)
        assert spec.batch_size == (None if label == "SGPR-512" else 1024)
        assert spec.options["num_inducing"] == int(label.split("-")[1])


def test_runs_pick_labels_in_plan_order():
    plan = list(softki._plan(False, ("bike", "protein"), ("SVGP-512", "SoftKI-512")))
    assert [(d, label) for d, label, _ in plan] == [
        ("bike", "SoftKI-512"), ("bike", "SVGP-512"),
        ("protein", "SoftKI-512"), ("protein", "SVGP-512")]


def test_unknown_run_label_raises(tmp_path):
    with pytest.raises(ValueError, match="SoftKI-512, SGPR-512"):
        softki.run(tmp_path, runs=("SVGP-2048",))


def test_suites_without_labelled_runs_refuse_runs(tmp_path):
    from gpscale.benchmarks.registry import run_suite

    with pytest.raises(ValueError, match="no labelled runs"):
        run_suite("solvegp", tmp_path, runs=("SVGP-256",))
    assert not any(tmp_path.iterdir())  # refused before writing anything


def test_unknown_dataset_raises(tmp_path):
    with pytest.raises(ValueError, match="kin40k"):
        softki.run(tmp_path, datasets=("song",))


@pytest.mark.slow
def test_a_failing_run_is_recorded_and_the_suite_goes_on(data_root, tmp_path, monkeypatch):
    """A run that stops with NonFiniteLossError gives a row saying so; the others still run."""
    from gpscale.errors import NonFiniteLossError

    monkeypatch.setenv("GPSCALE_DATA", str(data_root))
    real_run = softki.runner.run

    def softki_fails(spec):
        if spec.method == "softki":
            raise NonFiniteLossError("Cholesky of SoftKI K_zz failed", epoch=3, history=None)
        return real_run(spec)

    monkeypatch.setattr(softki.runner, "run", softki_fails)
    rows = softki.run(tmp_path, quick=True)
    assert rows[0]["stopped"] == "failed in epoch 3" and rows[0]["epochs"] == 2
    assert rows[0]["test_rmse"] is None and rows[0]["time_vs_svgp512"] is None
    assert rows[4]["test_rmse"] is None  # the fixed-noise SoftKI run fails too
    assert all(math.isfinite(r["test_rmse"]) for r in rows[1:4])
    assert "failed in epoch 3" in (tmp_path / "report.md").read_text()
