"""Suite ``solvegp``: the quick plan runs end to end and reports consistent rows."""

from __future__ import annotations

import csv
import math

import pytest
import torch

import gpscale.methods.solvegp  # noqa: F401  (registers the key)
from gpscale.benchmarks import solvegp


@pytest.fixture(autouse=True)
def _one_thread():
    """Small problems: one thread avoids thread-pool contention on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_plan_covers_the_paper_comparison():
    """Full plan: SOLVE-GP (M+M) and SVGP (M, 1.5M, 2M) on the five regression sets; MNIST
    with SOLVE-GP, SVGP (M) and SVGP (2M)."""
    plan = list(solvegp._plan(quick=False, datasets=None))
    regression = [p for p in plan if p[0] not in ("mnist", "mnist-conv", "mnist-deep")]
    assert {p[0] for p in regression} == set(solvegp.REGRESSION)
    assert {p[1] for p in regression} == {"SOLVE-GP 256+256", "SVGP 256", "SVGP 384", "SVGP 512"}
    assert {p[1] for p in plan if p[0] == "mnist"} == {"SOLVE-GP 128+128", "SVGP 128",
                                                      "SVGP 256"}
    assert all(p[4]["max_time"] is not None for p in plan if p[0] not in solvegp.CONV)
    conv = [p for p in plan if p[0] == "mnist-conv"]  # equal iterations, no time cap
    assert [p[1] for p in conv] == ["conv-SOLVE-GP 384+384", "conv-SVGP 384", "conv-SVGP 768"]
    deep = [p for p in plan if p[0] == "mnist-deep"]  # the same, two layers
    assert [p[1] for p in deep] == ["2-layer conv-SOLVE-GP 384+384 (hidden 128+128)",
                                    "2-layer conv-SVGP 384 (hidden 128)",
                                    "2-layer conv-SVGP 768 (hidden 256)"]
    assert [p[3]["hidden_inducing"] for p in deep] == [128, 128, 256]
    assert all(p[3]["layers"] == 2 for p in deep)
    assert {p[4]["epochs"] for p in conv + deep} == {solvegp.CONV_EPOCHS}
    assert all(p[4]["max_time"] is None for p in conv + deep)
    with pytest.raises(ValueError, match="solvegp runs on"):
        list(solvegp._plan(quick=True, datasets=("nope",)))


@pytest.mark.long
def test_quick_run_writes_results(tmp_path, data_root, monkeypatch):
    """quick=True trains every method one epoch on elevators and MNIST and reports them."""
    monkeypatch.setenv("GPSCALE_DATA", str(data_root))
    rows = solvegp.run(tmp_path, quick=True)
    assert [r["method"] for r in rows] == ["SOLVE-GP 16+16", "SVGP 16", "SVGP 24", "SVGP 32",
                                           "SOLVE-GP 8+8", "SVGP 8", "SVGP 16",
                                           "conv-SOLVE-GP 4+4", "conv-SVGP 4", "conv-SVGP 8"]
    for row in rows:
        assert row["epochs"] == 1
        assert math.isfinite(row["test_nll"]) and row["time_per_iter_s"] > 0
        assert row["time_per_iter_s"] <= row["time_per_epoch_s"]
    ratios = {(r["dataset"], r["method"]): r["iter_time_vs_svgp_2m"] for r in rows}
    assert ratios[("elevators", "SVGP 32")] == pytest.approx(1.0)
    assert ratios[("mnist", "SVGP 16")] == pytest.approx(1.0)
    assert ratios[("mnist-conv", "conv-SVGP 8")] == pytest.approx(1.0)
    assert all(v is not None and v > 0 for v in ratios.values())
    assert all(0 <= r["test_accuracy"] <= 1 for r in rows if r["dataset"].startswith("mnist"))
    assert all(r["test_rmse"] is not None for r in rows if r["dataset"] == "elevators")
    with open(tmp_path / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert (tmp_path / "report.md").read_text().startswith("# Benchmark `solvegp`")
