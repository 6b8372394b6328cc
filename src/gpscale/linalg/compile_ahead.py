"""Warm ``torch.compile``'s on-disk caches in a separate process while the caller runs uncompiled.

Why a process and not a thread: while Dynamo compiles, torch holds a process-wide flag
(``torch.compiler.is_compiling()``) for the whole session, so code running meanwhile in *other*
threads takes its compile-time branches. ``torch.optim.Adam`` then keeps its step count as a
tensor of the default dtype — float32 bias corrections in a float64 fit — and a training run's
numbers depend on when the compiler thread happened to run (measured: a CaGP-Opt loss moved by
8e-6 relative after one Adam step). A daemon thread still compiling at interpreter exit also
aborted the process (``std::terminate`` from a forced unwind in torch's C++).

So the work is split: a child interpreter (``python -m gpscale.linalg.compile_ahead JOBS``)
compiles each submitted function on stand-in tensors of the caller's shapes, strides, dtypes
and grad mode, which fills Inductor's FX-graph and AOT-autograd caches on disk; the caller keeps
running the uncompiled function and, once the child reports a job done, compiles it itself —
now from the warm cache (1–2 s per function here instead of 5–20 s cold). One child runs at a time;
jobs submitted meanwhile go to the next one. A child still running when the caller exits is
killed. Nothing in the calling process ever sees ``is_compiling()``.

The jobs reach the child as JSON in a private temporary folder: each function by its module and
qualified name (a module-level function of gpscale; anything else fails its job in the caller),
each argument by shape, strides, dtype, device and grad flag. The child imports nothing a job
names outside the ``gpscale`` package and unpickles nothing.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["Job", "poll", "stop", "submit", "wait"]


@dataclass
class Job:
    """One function to compile ahead; ``status`` is 'pending', 'running', 'ok' or 'failed'."""

    fn: Callable
    specs: tuple
    grad_mode: bool
    default_dtype: torch.dtype
    status: str = "pending"
    error: str = ""

    @property
    def done(self) -> bool:
        return self.status in ("ok", "failed")


@dataclass
class _Child:
    process: subprocess.Popen
    jobs: list[Job]
    folder: tempfile.TemporaryDirectory


_PENDING: list[Job] = []
_CHILD: _Child | None = None


def _spec(a: Any) -> tuple:
    if isinstance(a, torch.Tensor):
        return ("tensor", tuple(a.shape), tuple(a.stride()), a.dtype, a.requires_grad,
                str(a.device))
    return ("value", a)


def _job_json(job: Job) -> dict[str, Any]:
    """What the child needs to compile ``job``, as JSON; ``TypeError`` for a function that is
    not a module-level function of gpscale, ``ValueError`` for an argument JSON cannot hold."""
    module, name = getattr(job.fn, "__module__", None), getattr(job.fn, "__qualname__", "")
    if not (isinstance(module, str) and module.split(".")[0] == "gpscale") or "<" in name:
        raise TypeError(f"{job.fn!r} is not a module-level function of gpscale")
    specs = [list(s[:3]) + [str(s[3]).removeprefix("torch."), *s[4:]] if s[0] == "tensor"
             else list(s) for s in job.specs]
    json.dumps(specs, allow_nan=False)  # only plain values travel
    return {"module": module, "name": name, "specs": specs, "grad_mode": job.grad_mode,
            "default_dtype": str(job.default_dtype).removeprefix("torch.")}


def submit(fn: Callable, args: Sequence[Any], grad_mode: bool) -> Job:
    """Queue ``fn`` to be compiled ahead for arguments like ``args`` (tensors, whose shape,
    strides, dtype, device and ``requires_grad`` the child copies, or JSON values) under
    ``grad_mode``; starts a child if none runs. Returns the job to watch."""
    job = Job(fn, tuple(_spec(a) for a in args), bool(grad_mode), torch.get_default_dtype())
    _PENDING.append(job)
    poll()
    return job


def poll() -> None:
    """Non-blocking: collect a finished child's results and start the next one."""
    global _CHILD
    if _CHILD is not None and _CHILD.process.poll() is not None:
        _collect(_CHILD)
        _CHILD = None
    if _CHILD is None and _PENDING:
        jobs = _PENDING[:]
        _PENDING.clear()
        _CHILD = _start(jobs)


def wait(job: Job, timeout: float | None = None) -> bool:
    """Block until ``job`` is done (or ``timeout`` seconds pass); whether it succeeded."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not job.done and (deadline is None or time.monotonic() < deadline):
        poll()
        if not job.done:
            time.sleep(0.05)
    return job.status == "ok"


def _start(jobs: list[Job]) -> _Child | None:
    folder = tempfile.TemporaryDirectory(prefix="gpscale-compile-")
    path = Path(folder.name) / "jobs.json"
    try:
        path.write_text(json.dumps([_job_json(j) for j in jobs]))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with open(Path(folder.name) / "stderr.txt", "w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpscale.linalg.compile_ahead", str(path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    except (OSError, ValueError, TypeError) as exc:
        for job in jobs:
            job.status, job.error = "failed", f"could not start the compiler process: {exc}"
        folder.cleanup()
        return None
    for job in jobs:
        job.status = "running"
    return _Child(process, jobs, folder)


def _collect(child: _Child) -> None:
    folder = Path(child.folder.name)
    try:
        results = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        results = []
    stderr = (folder / "stderr.txt").read_text(errors="replace") if (
        folder / "stderr.txt").exists() else ""
    for k, job in enumerate(child.jobs):
        if k < len(results) and results[k] == "ok":
            job.status = "ok"
        else:
            job.status = "failed"
            job.error = (results[k] if k < len(results) else
                         f"compiler process exited with code {child.process.returncode}: "
                         f"{stderr.strip()[-500:]}")
    child.folder.cleanup()


@atexit.register
def stop() -> None:
    """Kill a running child and drop pending jobs (their status becomes 'failed'); also run at
    interpreter exit: the child's work is only a cache."""
    global _CHILD
    if _CHILD is not None:
        if _CHILD.process.poll() is None:
            _CHILD.process.kill()
            _CHILD.process.wait()
        _collect(_CHILD)
        _CHILD = None
    for job in _PENDING:
        job.status, job.error = "failed", "stopped before it started"
    _PENDING.clear()


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def _function(module: str, name: str) -> Callable:
    if module.split(".")[0] != "gpscale":
        raise ValueError(f"refusing to import {module!r}: not a gpscale module")
    fn: Any = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


def _stand_in(spec: list) -> Any:
    if spec[0] == "value":
        return spec[1]
    _, shape, stride, dtype, requires_grad, device = spec
    dtype = _dtype(dtype)
    size = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
    storage = (torch.rand(size, dtype=dtype, device=device) if dtype.is_floating_point
               else torch.zeros(size, dtype=dtype, device=device))  # only the layout matters
    return storage.as_strided(shape, stride).requires_grad_(requires_grad)


def _main(path: str) -> None:
    """The child: compile every job, writing results.json (one entry per job) as it goes."""
    jobs = json.loads(Path(path).read_text())
    results: list[str] = []
    out = Path(path).with_name("results.json")
    for job in jobs:
        try:
            fn = _function(job["module"], job["name"])
            torch.set_default_dtype(_dtype(job["default_dtype"]))
            args = [_stand_in(s) for s in job["specs"]]
            with torch.set_grad_enabled(job["grad_mode"]):
                torch.compile(fn, dynamic=True)(*args)
            results.append("ok")
        except Exception as exc:  # reported in the caller, which then compiles itself
            results.append(f"{type(exc).__name__}: {str(exc).strip()[:500]}")
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results))
        os.replace(tmp, out)


if __name__ == "__main__":
    _main(sys.argv[1])
