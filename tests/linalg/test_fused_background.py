"""Compiling ahead: the first calls run uncompiled while a child process warms the compile
caches, later ones compiled in this process, same values; nothing here sees torch's
process-wide "compiling" flag."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings

import pytest
import torch

from gpscale.linalg import compile_ahead, fused
from gpscale.methods import build
from gpscale.training import FitConfig, fit


@pytest.fixture(autouse=True)
def _background(monkeypatch):
    monkeypatch.setattr(fused, "COMPILE_IN_BACKGROUND", True)
    yield
    compile_ahead.stop()  # no child keeps compiling beside later tests


class _Ahead:
    """A stand-in for compile_ahead.submit whose job finishes when the test says so."""

    def __init__(self):
        self.jobs = []

    def __call__(self, fn, args, grad_mode):
        job = compile_ahead.Job(fn, (), grad_mode, torch.get_default_dtype(), status="running")
        self.jobs.append(job)
        return job


def _counting_compiler(calls: list):
    def compiler(fn, dynamic):
        def compiled(*args):
            calls.append("compiled")
            return fn(*args)
        return compiled
    return compiler


def _rbf_args(sq):
    return torch.zeros(2, 3, 3), sq, sq.mT


def test_calls_run_uncompiled_until_the_job_is_done():
    ahead, calls = _Ahead(), []
    wrapped = fused._CompiledFunction(fused._rbf_value, compiler=_counting_compiler(calls),
                                      ahead=ahead)
    sq = torch.ones(2, 3, 1)
    outs = []
    for _ in range(3):
        args = _rbf_args(sq)
        wrapped(*args)
        outs.append(args[0])
    assert calls == [] and len(ahead.jobs) == 1 and not wrapped.ready  # one job, not three
    assert ahead.jobs[0].grad_mode is torch.is_grad_enabled()
    ahead.jobs[0].status = "ok"
    for _ in range(2):
        args = _rbf_args(sq)
        wrapped(*args)
        outs.append(args[0])
    assert calls == ["compiled", "compiled"] and wrapped.ready
    expected = float(torch.exp(torch.tensor(-1.0)))  # exp(−D²/2), D² = 1 + 1 − 2·0
    for out in outs:
        torch.testing.assert_close(out, torch.full((2, 3, 3), expected))


def test_a_failed_job_leaves_the_compilation_to_this_process():
    ahead, calls = _Ahead(), []
    wrapped = fused._CompiledFunction(fused._rbf_value, compiler=_counting_compiler(calls),
                                      ahead=ahead)
    sq = torch.ones(2, 3, 1)
    wrapped(*_rbf_args(sq))
    ahead.jobs[0].status = "failed"
    wrapped(*_rbf_args(sq))
    assert calls == ["compiled"] and wrapped.ready


def test_a_compilation_failure_warns_once():
    ahead = _Ahead()

    def broken(fn, dynamic):
        def raises(*args):
            raise torch._dynamo.exc.TorchDynamoException("no C++ compiler")
        return raises

    wrapped = fused._CompiledFunction(fused._rbf_value, compiler=broken, ahead=ahead)
    sq = torch.ones(2, 3, 1)
    wrapped(*_rbf_args(sq))
    ahead.jobs[0].status = "ok"
    with pytest.warns(RuntimeWarning, match="torch.compile failed.*no C\\+\\+ compiler"):
        wrapped(*_rbf_args(sq))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args = _rbf_args(sq)
        wrapped(*args)
    assert wrapped.failed
    torch.testing.assert_close(args[0], torch.full((2, 3, 3), float(torch.exp(torch.tensor(-1.)))))


def test_a_function_outside_gpscale_fails_its_job_without_a_child():
    job = compile_ahead.submit(lambda t: t + 1, (torch.ones(3),), False)
    assert job.status == "failed" and "could not start the compiler process" in job.error
    assert compile_ahead._CHILD is None


@pytest.mark.slow
def test_the_child_compiles_while_this_process_never_sees_the_compiling_flag():
    sq = torch.ones(2, 3, 1)
    job = compile_ahead.submit(fused._rbf_value, _rbf_args(sq), False)
    assert job.status == "running"
    flagged = 0
    deadline = time.monotonic() + 300
    while not job.done and time.monotonic() < deadline:
        flagged += torch.compiler.is_compiling()
        compile_ahead.poll()
        time.sleep(0.01)
    assert job.status == "ok", job.error
    assert flagged == 0


def test_training_while_compiling_ahead_reproduces_the_uncompiled_run():
    """The defect the child process removed: while a compiler *thread* held torch's
    process-wide compiling flag, Adam kept its step count as a float32 tensor (the default
    dtype) and a float64 CaGP-Opt fit moved by 8e-6 relative after one step."""
    torch.set_default_dtype(torch.float32)  # a user's default (conftest restores float64)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(160, 1, generator=g, dtype=torch.float64) * 4
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(160, generator=g, dtype=torch.float64)
    losses = {}
    for backend in ("fused", "compiled"):
        model = build("cagp-opt", 1, init=(x, y), num_actions=8, backend=backend).double()
        history = fit(model, None, (x, y), FitConfig(lr=1.0, epochs=6, progress=False))
        losses[backend] = history.column("loss")
    assert losses["compiled"] == pytest.approx(losses["fused"], rel=1e-12)


_EXIT_DURING_COMPILE = """
import torch
from gpscale.linalg import compile_ahead, fused
sq = torch.ones(2, 3, 1)
job = compile_ahead.submit(fused._rbf_value, (torch.zeros(2, 3, 3), sq, sq.mT), False)
print(compile_ahead._CHILD.process.pid)
"""


def test_exiting_while_the_child_compiles_stops_it():
    done = subprocess.run([sys.executable, "-c", _EXIT_DURING_COMPILE], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.strip())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped at exit
