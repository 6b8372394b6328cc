"""Background compilation: the first calls run uncompiled, later ones compiled, same values."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings

import pytest
import torch

from gpscale.linalg import fused


def _slow_compiler(release: threading.Event, calls: list):
    def compiler(fn, dynamic):
        def compiled(*args):
            release.wait(10)  # the "compilation" finishes only when the test says so
            calls.append("compiled")
            return fn(*args)
        return compiled
    return compiler


def test_first_calls_run_uncompiled_while_the_compiler_works(monkeypatch):
    monkeypatch.setattr(fused, "COMPILE_IN_BACKGROUND", True)
    release, calls = threading.Event(), []
    wrapped = fused._CompiledFunction(fused._rbf_value, compiler=_slow_compiler(release, calls))
    sq = torch.ones(2, 3, 1)
    outs = []
    for _ in range(3):  # the compiler is blocked: these return at once, uncompiled
        out = torch.zeros(2, 3, 3)
        wrapped(out, sq, sq.mT)
        outs.append(out)
    assert calls == [] and not wrapped.ready and wrapped.thread.is_alive()
    release.set()
    assert wrapped.wait(10)
    assert calls == ["compiled"]  # the warm-up call, on copies of the first call's arguments
    out = torch.zeros(2, 3, 3)
    wrapped(out, sq, sq.mT)
    assert calls == ["compiled", "compiled"]
    expected = torch.exp(torch.tensor(-1.0))  # exp(−D²/2), D² = 1 + 1 − 2·0
    for o in [*outs, out]:
        torch.testing.assert_close(o, torch.full((2, 3, 3), float(expected)))


def test_a_background_failure_warns_once_in_the_caller(monkeypatch):
    monkeypatch.setattr(fused, "COMPILE_IN_BACKGROUND", True)

    def broken(fn, dynamic):
        def raises(*args):
            raise torch._dynamo.exc.TorchDynamoException("no C++ compiler")
        return raises

    wrapped = fused._CompiledFunction(fused._rbf_value, compiler=broken)
    sq = torch.ones(2, 3, 1)
    wrapped(torch.zeros(2, 3, 3), sq, sq.mT)
    assert not wrapped.wait(10)
    with pytest.warns(RuntimeWarning, match="torch.compile failed.*no C\\+\\+ compiler"):
        wrapped(torch.zeros(2, 3, 3), sq, sq.mT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = torch.zeros(2, 3, 3)
        wrapped(out, sq, sq.mT)
    assert wrapped.failed and wrapped.thread is not None
    torch.testing.assert_close(out, torch.full((2, 3, 3), float(torch.exp(torch.tensor(-1.0)))))


_EXIT_DURING_COMPILE = """
import time, torch
from gpscale.linalg import fused
fused.COMPILE_IN_BACKGROUND = True
def busy_compiler(fn, dynamic):  # a 'compilation' that spends seconds inside torch ops
    def compiled(*args):
        stop = time.monotonic() + 3.0
        while time.monotonic() < stop:
            torch.ones(2000, 200).unflatten(1, (20, 10)).sum()
        return fn(*args)
    return compiled
wrapped = fused._CompiledFunction(fused._rbf_value, compiler=busy_compiler)
sq = torch.ones(2, 3, 1)
wrapped(torch.zeros(2, 3, 3), sq, sq.mT)
time.sleep(0.2)
print("done")
"""


def test_the_interpreter_exits_cleanly_while_a_compilation_runs():
    """Python 3.11 ends a daemon thread that wants the GIL during finalisation with a forced
    unwind; inside torch's C++ that is std::terminate (SIGABRT, exit −6 after the work was done,
    seen in data-parallel ranks). The exit must wait for the compiler thread instead."""
    done = subprocess.run([sys.executable, "-c", _EXIT_DURING_COMPILE], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "done"
