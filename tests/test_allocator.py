"""The training allocator: large blocks from the heap while a model trains, glibc's defaults
after; nothing changed off the CPU or with GPSCALE_MALLOC=system."""

from __future__ import annotations

import ctypes
import os

import pytest
import torch

from gpscale import allocator
from gpscale.allocator import training_allocator

LARGE = 16_000_000  # float32 entries: 61 MiB, above glibc's largest dynamic mmap threshold


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mapped_bytes_of_a_large_tensor() -> int:
    """How much a fresh large tensor adds to the memory glibc holds in mmapped blocks."""
    libc = allocator._glibc()
    libc.mallinfo2.restype = _MallInfo2
    before = libc.mallinfo2().hblkhd
    t = torch.ones(LARGE)
    grown = libc.mallinfo2().hblkhd - before
    del t
    return grown


needs_glibc = pytest.mark.skipif(
    allocator._glibc() is None or not hasattr(allocator._glibc(), "mallinfo2"),
    reason="glibc ≥ 2.33 only")


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@needs_glibc
def test_large_blocks_come_from_the_heap_while_training_and_go_back_after():
    """Inside the block a large tensor is not mapped afresh and its pages stay resident after
    it is freed; leaving the block returns them to the system."""
    with training_allocator() as kept:
        assert kept
        assert _mapped_bytes_of_a_large_tensor() == 0
        with training_allocator() as inner:  # re-entrant: the inner exit restores nothing
            assert inner
        t = torch.ones(LARGE)  # written, so resident
        del t
        assert _mapped_bytes_of_a_large_tensor() == 0
        resident = _resident_bytes()
    assert resident - _resident_bytes() > LARGE * 4 * 0.8


class _RecordingLibc:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, args)) or 1


@pytest.mark.parametrize("how", ["gpu", "env"])
def test_opting_out_changes_nothing(monkeypatch, how):
    """Tensors on a GPU, or GPSCALE_MALLOC=system: the block yields False and calls no
    allocator function; on the CPU it sets and restores both settings and trims."""
    libc = _RecordingLibc()
    monkeypatch.setattr(allocator, "_glibc", lambda: libc)
    if how == "env":
        monkeypatch.setenv(allocator.ENV, "system")
    with training_allocator(on_cpu=how != "gpu") as kept:
        assert not kept
    assert libc.calls == []
    monkeypatch.delenv(allocator.ENV, raising=False)
    with training_allocator() as kept:
        assert kept
    assert [name for name, _ in libc.calls] == ["mallopt"] * 4 + ["malloc_trim"]
    assert libc.calls[0][1] == (allocator.M_MMAP_MAX, 0)
    assert libc.calls[2][1] == (allocator.M_MMAP_MAX, allocator.DEFAULT_MMAP_MAX)


def test_fit_trains_inside_the_training_allocator(monkeypatch):
    """``training.fit`` enters the block for CPU tensors, and leaves it on return."""
    from gpscale.training.config import FitConfig
    from gpscale.training.fit import fit

    seen = []

    def loss(model, x, y):
        seen.append(allocator._depth)
        return ((model(x)[:, 0] - y) ** 2).mean()

    model = torch.nn.Linear(2, 1)
    x, y = torch.randn(20, 2), torch.randn(20)
    fit(model, loss, (x, y), FitConfig(epochs=2, lr=0.01))
    expected = 1 if allocator._glibc() is not None else 0
    assert seen and all(depth == expected for depth in seen)
    assert allocator._depth == 0
