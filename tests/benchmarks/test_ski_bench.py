"""Suite ``ski`` in quick mode: rows, ratios and the report."""

from __future__ import annotations

import pytest

from gpscale.benchmarks import ski


def test_quick_ski_suite_writes_table1_ratios(tmp_path):
    """Quick run on the sine: ski and ggp rows per n with finite ratios, plus WᵀW-format rows."""
    rows = ski.run(tmp_path, quick=True, datasets=("sine",))
    pairs = [r for r in rows if r["method"] in ("ski", "ggp") and r.get("wtw_format") is None
             and r.get("time_per_iter_s") is not None]
    assert [(r["method"], r["n"]) for r in pairs] == [("ski", 10**4), ("ggp", 10**4),
                                                      ("ski", 10**5), ("ggp", 10**5)]
    for r in pairs:
        assert r["time_per_iter_s"] > 0 and r["counted_memory"] > 0
    for r in pairs[1::2]:
        assert 0 < r["time_ratio"] < float("inf")
        # nnz(WᵀW) + 2m ≤ 7m + 2m is far below nnz(W) + m + n ≥ 5n for n ≫ m.
        assert r["memory_ratio"] < 0.1
    assert {r["wtw_format"] for r in rows if r.get("wtw_format")} == {"stencil", "csr"}
    assert (tmp_path / "report.md").read_text().count("ggp") >= 2
    # the KISS-GP peer at n = 10⁴: same model, same grid size, so the same test mean error
    kiss = [r for r in rows if r["method"] == "kissgp (gpytorch)"]
    ggp_smae = [r["mean_smae"] for r in rows if r["method"] == "ggp" and r.get("mean_smae")]
    assert len(kiss) == 1 and kiss[0]["n"] == 10**4 and kiss[0]["time_per_iter_s"] > 0
    assert ggp_smae and abs(kiss[0]["mean_smae"] - ggp_smae[0]) < 0.01 * ggp_smae[0]


def test_unknown_dataset_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="sine, field3d"):
        ski.run(tmp_path, quick=True, datasets=("protein",))
