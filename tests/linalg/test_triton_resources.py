"""The default launch shapes of the Triton kernels, compiled ahead of time for sm_90 (H100,
H200) on the CPU: no register spills, and shared memory within what one multiprocessor has.
A shape that spills runs several times slower on the card; one over the shared memory does
not launch at all (the tiles then take over, with a warning)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
from gpscale.linalg.triton import resources  # noqa: E402


def _usage(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except RuntimeError as err:  # an older Triton, or no cuobjdump in its wheel: skip; a kernel
        if "cannot compile ahead of time" in str(err) or "no cuobjdump" in str(err):
            pytest.skip(str(err))  # that does not compile: fail
        raise


def test_the_default_shapes_compile_for_hopper_without_spills():
    found = _usage(resources.defaults)
    for kernel, got in found.items():
        assert got["stack_bytes"] == 0, (kernel, got)
        assert 0 < got["shared_bytes"] <= resources.HOPPER_SHARED_BYTES, (kernel, got)
        assert got["registers"] <= 255, (kernel, got)


@pytest.mark.slow
def test_the_check_sees_spills_and_shared_memory():
    """The shape the forward had before (128 × 32, 4 warps) spills; the symmetric backward at
    128 × 64 needs more shared memory than a multiprocessor has: the check can fail."""
    old = _usage(resources.usage, "forward", {"BM": 128, "BN": 32, "W": 4, "S": 3})
    assert old["stack_bytes"] > 0
    big = _usage(resources.usage, "backward_symmetric", {"BM": 128, "BN": 64, "W": 8, "S": 3},
                 precisions=("ieee", "tf32x3"))
    assert big["shared_bytes"] > resources.HOPPER_SHARED_BYTES


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["backward_rows", "backward_cols"])
@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_the_general_backward_kernels_compile_for_hopper(kernel, dtype):
    """The two-pass backward (rectangular products, k > 64) compiles for sm_90 too: the
    interpreter runs code that the compiler can refuse (a loop-carried value changing type),
    and only a compile shows it."""
    got = _usage(resources.usage, kernel, {"BM": 64, "BN": 32, "W": 4, "S": 2}, dtype=dtype)
    assert got["registers"] > 0 and got["shared_bytes"] <= resources.HOPPER_SHARED_BYTES


@pytest.mark.slow
@pytest.mark.parametrize("profile", [0, 1, 3])
def test_every_profile_compiles_for_hopper_in_float64(profile):
    for kernel in ("forward", "backward_symmetric"):
        got = _usage(resources.usage, kernel, {"BM": 64, "BN": 32, "W": 4, "S": 2},
                     profile=profile, dtype="fp64")
        assert got["registers"] > 0
