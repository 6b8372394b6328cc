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


def test_chunked_rows_equal_one_interpolation():
    """SKI's row blocks give the same W v, Wᵀ u and nonzero count as one Interpolation."""
    import torch

    from gpscale.linalg.interpolation import interpolate, make_grid

    grid = make_grid([0.0] * 3, [1.0] * 3, [8, 7, 9])
    g = torch.Generator().manual_seed(0)
    x = torch.rand(250, 3, generator=g, dtype=torch.float64)
    whole, blocks = interpolate(grid, x), ski._ChunkedRows(grid, x, chunk=60)
    assert len(blocks.parts) == 5 and blocks.nonzeros() == int((whole.weight != 0).sum())
    v = torch.randn(grid.num_points, 2, generator=g, dtype=torch.float64)
    u = torch.randn(250, 2, generator=g, dtype=torch.float64)
    torch.testing.assert_close(blocks.matmul(v), whole.matmul(v), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(blocks.rmatmul(u), whole.rmatmul(u), rtol=1e-13, atol=1e-13)
