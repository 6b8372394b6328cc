"""Start P local processes of a data-parallel job, as ``torchrun --nproc-per-node P`` would.

:func:`launch` spawns P fresh interpreters (``spawn`` start method: safe with threads and CUDA),
sets the torchrun variables in each (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` = a free port), joins the
process group (:func:`gpscale.distributed.env.init_from_env`) and calls ``fn(*args)`` on every
rank. ``fn`` must be a module-level function (it is pickled by reference). The ranks log to
stderr as the parent process does (its format and levels), rank 0 fully and the others their
warnings and errors only, so a job's progress lines are shown once. The ranks' return
values come back as a list in rank order; they travel as data-only files
(:mod:`gpscale.files`: tensors, arrays and plain data, nothing unpickled) in a temporary folder
only the user can read.

If a rank fails, the others stop by themselves at their next collective (a closed connection
or the ``timeout``); processes still alive ``timeout + grace`` seconds after the first failure
are killed. A rank that stops making progress altogether (stopped by a signal, or hung with its
interpreter frozen) is noticed by its heartbeat: every rank touches a file every
:data:`HEARTBEAT_S` seconds from a daemon thread, and the launcher kills a rank whose heartbeat
is older than ``timeout`` — so a job with a stopped rank ends within about ``timeout`` seconds
(the other ranks then stop at once on the closed connection). The parent then raises
:class:`~gpscale.distributed.env.DistributedError` naming the rank that failed first, its error
and traceback, and what happened to the others.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from gpscale.distributed.env import (
    DEFAULT_TIMEOUT,
    DistributedError,
    RankInputError,
    init_from_env,
    shutdown,
)
from gpscale.files import FormatError, atomic_write, decode, encode

__all__ = ["free_port", "launch", "HEARTBEAT_S"]

HEARTBEAT_S = 0.5
"""Seconds between two heartbeats of a rank."""


def _heartbeat(path: Path) -> None:
    """Touch ``path`` every :data:`HEARTBEAT_S` seconds (a daemon thread: ends with the rank)."""
    def beat() -> None:
        while True:
            path.touch()
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=beat, daemon=True, name="gpscale-heartbeat").start()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _logging_of_parent() -> dict[str, Any] | None:
    """How this process logs, for the ranks to log alike: the root logger's level, its first
    handler's format, and the levels set on gpscale's loggers (``None``: no logging set up)."""
    root = logging.getLogger()
    if not root.handlers:
        return None
    form = next((h.formatter for h in root.handlers if h.formatter is not None), None)
    levels = {name: logger.level for name, logger in logging.Logger.manager.loggerDict.items()
              if name.startswith("gpscale") and isinstance(logger, logging.Logger)
              and logger.level != logging.NOTSET}
    return {"level": root.level, "format": None if form is None else form._fmt,
            "datefmt": None if form is None else form.datefmt, "levels": levels}


def _log_like_parent(setup: dict[str, Any] | None, rank: int) -> None:
    """Log to stderr as the parent does: rank 0 all it would show (its "resumed at epoch"
    line, say), the other ranks only warnings and errors (rank 0 speaks for the job)."""
    if setup is None:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(setup["format"], setup["datefmt"]))
    if rank:
        handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(setup["level"])
    for name, level in setup["levels"].items():
        logging.getLogger(name).setLevel(level)


def _worker(fn: Callable[..., Any], args: Sequence[Any], rank: int, world_size: int,
            port: int, result_dir: str, threads: int, timeout: float,
            backend: str | None, logs: dict[str, Any] | None = None) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    _log_like_parent(logs, rank)
    _heartbeat(Path(result_dir) / f"rank{rank}.beat")
    torch.set_num_threads(threads)
    path = Path(result_dir) / f"rank{rank}.result"
    try:
        init_from_env(timeout=timeout, backend=backend)
        result = {"ok": fn(*args)}
        raw = encode(result)  # a result that is not plain data is this rank's error
    except BaseException as err:  # reported to the parent, then this rank exits non-zero
        result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(),
                  "input_error": isinstance(err, ValueError), "message": str(err)}
        raw = encode(result)
    finally:
        shutdown()
    atomic_write(path, raw)
    if "error" in result:
        sys.exit(1)


def launch(fn: Callable[..., Any], args: Sequence[Any] = (), *, nproc: int = 2,
           timeout: float = DEFAULT_TIMEOUT, grace: float = 30.0, threads: int | None = None,
           backend: str | None = None) -> list[Any]:
    """Run ``fn(*args)`` on ``nproc`` local ranks of one process group; return their results.

    Args:
        fn: a module-level function; it finds its rank with ``gpscale.distributed.current()``.
        args: picklable positional arguments (the same on every rank).
        nproc: P ≥ 1 processes.
        timeout: seconds each collective waits for the other ranks.
        grace: extra seconds, past ``timeout``, the launcher waits after a failure before it
            terminates the ranks still running.
        threads: torch threads per rank; default max(1, cores // P).
        backend: ``'gloo'`` / ``'nccl'``; default by device (see ``init_from_env``).

    Returns:
        ``[fn(*args) on rank 0, …, on rank P−1]``; each must be tensors, arrays and plain
        data (a rank whose result is not fails with the type named).

    Raises:
        ValueError: ``nproc`` < 1.
        RankInputError: the first rank to fail raised a ``ValueError`` (bad input); its
            message only.
        DistributedError: some rank raised or died; the message names it and shows its traceback.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive integer; got {nproc!r}")
    threads = threads or max(1, (os.cpu_count() or 1) // nproc)
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    logs = _logging_of_parent()
    with tempfile.TemporaryDirectory(prefix="gpscale-launch-") as tmp:
        procs = [ctx.Process(target=_worker, name=f"gpscale-rank{r}", daemon=False,
                             args=(fn, tuple(args), r, nproc, port, tmp, threads, timeout,
                                   backend, logs))
                 for r in range(nproc)]
        for p in procs:
            p.start()
        beats = [Path(tmp) / f"rank{r}.beat" for r in range(nproc)]
        failed, stalled = _join(procs, timeout + grace, beats, stale_after=timeout)
        results = [_read(Path(tmp) / f"rank{r}.result") for r in range(nproc)]
    if failed and results[failed[0]].get("input_error"):
        raise RankInputError(results[failed[0]]["message"])
    if failed:
        raise DistributedError(_failure_message(failed, procs, results, stalled))
    return [r["ok"] for r in results]


def _join(procs: list, patience: float, beats: list[Path], stale_after: float
          ) -> tuple[list[int], dict[int, float]]:
    """Wait for every process; kill a rank whose heartbeat is older than ``stale_after`` and,
    ``patience`` seconds after the first failure, every rank still running (SIGKILL: a stopped
    process ignores SIGTERM until it is continued). Returns the failed ranks, first failure
    first, and {stalled rank: seconds since its last heartbeat}."""
    failed: list[int] = []
    stalled: dict[int, float] = {}
    first_failure = None
    while any(p.is_alive() for p in procs):
        now = time.time()
        for r, p in enumerate(procs):
            if p.is_alive() and r not in stalled:
                age = _age(beats[r], now)
                if age is not None and age > stale_after:
                    stalled[r] = age
                    p.kill()
                    p.join()
            if not p.is_alive() and p.exitcode != 0 and r not in failed:
                failed.append(r)
                first_failure = first_failure or time.monotonic()
        if first_failure is not None and time.monotonic() - first_failure > patience:
            for p in procs:
                if p.is_alive():
                    p.kill()
        time.sleep(0.05)
    for p in procs:
        p.join()
    failed += [r for r, p in enumerate(procs) if p.exitcode != 0 and r not in failed]
    return failed, stalled


def _age(path: Path, now: float) -> float | None:
    """Seconds since ``path`` was last touched (None before the rank's first heartbeat)."""
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return None


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        result = decode(path.read_bytes())
    except FormatError as err:
        return {"error": f"its result file {path.name} {err}"}
    return result if isinstance(result, dict) else {"error": "its result file is malformed"}


def _failure_message(failed: list[int], procs: list, results: list[dict[str, Any]],
                     stalled: dict[int, float]) -> str:
    world = len(procs)
    lines = []
    for r in failed:
        if r in stalled:
            lines.append(f"rank {r}/{world} stopped making progress (no heartbeat for "
                         f"{stalled[r]:.0f} s: stopped by a signal or hung); killed by the "
                         "launcher")
        elif "error" in results[r]:
            lines.append(f"rank {r}/{world} raised {results[r]['error']}")
        else:
            lines.append(f"rank {r}/{world} died with exit code {procs[r].exitcode} without "
                         "reporting an error (killed, out of memory, or os._exit)")
    first = failed[0]
    text = "data-parallel job failed:\n  " + "\n  ".join(lines)
    if "traceback" in results[first]:
        text += f"\ntraceback of rank {first}:\n{results[first]['traceback']}"
    return text
