"""The kernels suite's block-sparse rows (the product CaGP-Opt's epochs are made of)."""

from __future__ import annotations

from gpscale.benchmarks import kernels
from gpscale.linalg import native


def test_block_sparse_rows_time_both_backends_forward_and_backward():
    rows = kernels._block_sparse_rows(700, repeats=1)
    backends = {"compiled", "native"} if native.available() else {"compiled"}
    assert {r["backend"] for r in rows} == backends
    assert {r["measure"] for r in rows} == {"block-sparse forward", "block-sparse backward"}
    for r in rows:
        assert r["n"] == 700 and r["seconds"] > 0
        assert abs(r["entries_per_s"] * r["seconds"] - 700**2) < 1e-6 * 700**2
