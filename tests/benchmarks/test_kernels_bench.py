"""The kernels suite's block-sparse rows (the product CaGP-Opt's epochs are made of)."""

from __future__ import annotations

import pytest

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


@pytest.mark.long
def test_gpu_rows_run_on_any_device_and_check_accuracy():
    """The GPU suite's rows, run on the CPU at n = 150 (Triton by its interpreter): every
    backend that runs there plus the hand-written loop, with times, accuracy against float64
    and a roofline from the same process."""
    import torch

    from gpscale.benchmarks import kernels_gpu

    rows = kernels_gpu.gpu_rows(torch.device("cpu"), n=150, gemm_size=128)
    sparse = [r for r in rows if r["measure"].startswith("block-sparse")]
    assert {(r["measure"], r["backend"]) for r in sparse} >= {
        ("block-sparse forward", "compiled"), ("block-sparse backward", "compiled")}
    assert all(r["seconds"] > 0 and r["n"] == 150 for r in sparse)
    rows = [r for r in rows if r["measure"] == "throughput"]
    names = {r["backend"] for r in rows}
    assert {"compiled", "hand-written loop (cdist)"} <= names
    for r in rows:
        assert r["n"] == 150 and r["device"] == "cpu" and "note" not in r
        assert r["seconds"] > 0 and r["backward_s"] > 0 and r["roofline_entries_per_s"] > 0
        assert r["max_rel_error"] < 1e-5, r
        assert abs(r["fraction_of_roofline"] * r["roofline_entries_per_s"] * r["seconds"]
                   - 150**2) < 1e-6 * 150**2


def test_handwritten_loop_is_the_matern_product():
    import torch

    from gpscale.benchmarks.kernels_gpu import handwritten_loop
    from gpscale.kernels import kernel_matmul, make_kernel

    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(50, 3, generator=g), torch.randn(50, 2, generator=g)
    kernel = make_kernel("matern32", 3)
    kernel.base_kernel.lengthscale = torch.tensor([[0.5, 1.0, 2.0]])
    kernel.outputscale = 1.7
    got = handwritten_loop(kernel.base_kernel.lengthscale, kernel.outputscale, x, v, chunk=7)
    torch.testing.assert_close(got, kernel_matmul(kernel, x, x, v, backend="eager"))


def test_suites_without_a_gpu_path_refuse_device(tmp_path):
    import pytest

    from gpscale.benchmarks.registry import run_suite

    with pytest.raises(ValueError, match="runs on the CPU only .--device.*kernels, scale"):
        run_suite("ski", tmp_path, quick=True, device="cuda")


@pytest.mark.long
def test_the_triton_sweep_ranks_configurations_and_names_the_chosen_one():
    """The tuning sweep on the CPU (Triton's interpreter, n = 96): two modes at one shape, the
    finalists' backward, and a chosen row whose environment settings name its configuration;
    the environment is left as it was."""
    import os

    import pytest
    import torch

    from gpscale.benchmarks import kernels_gpu
    from gpscale.linalg import triton as triton_kernels

    if not triton_kernels.available(torch.zeros(1)):
        pytest.skip("the Triton interpreter is off")
    before = os.environ.get("GPSCALE_TRITON_TILES")
    rows = kernels_gpu.sweep(torch.device("cpu"), n=96, gemm_size=128,
                             modes=(("ieee", "expand"), ("tf32x3", "diff")),
                             shapes=("BM=16,BN=16,W=4",),
                             backward_shapes=("BM=16,BN=16,W=4,S=2", "BM=32,BN=16,W=4,S=2"))
    assert os.environ.get("GPSCALE_TRITON_TILES") == before
    measured = [r for r in rows if "seconds" in r]
    assert len(measured) >= 3 and all(r["max_rel_error"] <= kernels_gpu.ERROR_BAR
                                       for r in measured)
    assert any("backward_s" in r and r["backward_ratio"] > 0 for r in measured)
    chosen = rows[-1]
    assert chosen["chosen"] and chosen["env"] == (
        f"GPSCALE_TRITON_TILES={chosen['tiles']} GPSCALE_TRITON_PRECISION="
        f"{chosen['precision']} GPSCALE_TRITON_DISTANCE={chosen['distance']}"
        f" GPSCALE_TRITON_BACKWARD_TILES={chosen['backward_tiles']}")
