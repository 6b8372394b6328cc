"""Shared fixtures: float64 by default, a seeded generator, tiny problems, data location."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Without a GPU, Triton's interpreter runs the Triton kernels on the CPU
# (tests/linalg/test_triton.py). Triton reads this when its kernels are decorated, so it is set
# before anything imports gpscale.linalg.triton.stationary.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from gpscale.linalg import fused

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# Tests of the compiled kernel products check the compiled code itself: compile on the first
# call instead of in the background (tests/linalg/test_fused_background.py covers that mode).
fused.COMPILE_IN_BACKGROUND = False


@pytest.fixture(autouse=True)
def _float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture
def one_thread():
    """One torch thread for tiny problems (no thread-pool contention on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.fixture
def toy_regression(generator):
    """n = 40, d = 2 smooth regression problem in float64."""
    x = torch.rand(40, 2, generator=generator, dtype=torch.float64) * 4 - 2
    y = torch.sin(x[:, 0]) + 0.5 * torch.cos(2 * x[:, 1])
    y = y + 0.1 * torch.randn(40, generator=generator, dtype=torch.float64)
    return x, y


@pytest.fixture
def data_root() -> Path:
    """The shared data folder ($GPSCALE_DATA, first entry); skips when absent."""
    entries = [p for p in os.environ.get("GPSCALE_DATA", "").split(os.pathsep) if p]
    for entry in entries:
        if (Path(entry) / "uci").is_dir():
            return Path(entry)
    pytest.skip("shared data not found: set GPSCALE_DATA=../shared/data")


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an ATen op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.fixture
def largest_tensor():
    """``with largest_tensor() as probe:`` records ``probe.largest`` (forward or backward)."""
    return LargestTensor
