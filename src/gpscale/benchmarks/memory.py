"""Peak-memory measurement for benchmarks.

CPU tensors are invisible to ``tracemalloc``, so each measurement runs in a fresh spawned process
and reads the kernel's resident-set high-water mark (``VmHWM`` in ``/proc/self/status``). The mark
is reset just before the measured call (writing 5 to ``/proc/self/clear_refs``), so the figure is
the call's peak RSS minus the RSS it started from. ``ru_maxrss`` is not used: Linux carries it over
``execve`` from the parent, so a large parent would hide the child's peak. On CUDA the caller
should use ``torch.cuda.max_memory_allocated`` instead.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import resource
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["peak_memory_mb", "current_rss_mb", "peak_rss_mb", "reset_peak_rss"]


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        return None
    return None


def current_rss_mb() -> float:
    """Resident set size of this process now, in MB (``VmRSS``; peak RSS off Linux)."""
    value = _status_mb("VmRSS")
    return peak_rss_mb() if value is None else value


def peak_rss_mb() -> float:
    """High-water mark of this process's RSS in MB since start or the last reset (``VmHWM``)."""
    value = _status_mb("VmHWM")
    if value is not None:
        return value
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def reset_peak_rss() -> None:
    """Reset ``VmHWM`` to the current RSS (Linux); a no-op where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _child(fn, args, kwargs, queue):
    try:
        reset_peak_rss()
        before = current_rss_mb()
        result = fn(*args, **kwargs)
        queue.put(("ok", peak_rss_mb() - before, result))
    except BaseException as exc:  # reported to the parent, which re-raises
        queue.put(("error", 0.0, f"{type(exc).__name__}: {exc}"))


def peak_memory_mb(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """Run ``fn(*args, **kwargs)`` in a fresh process; return (peak extra RSS in MB, result).

    ``fn`` must be a module-level function and its arguments and result picklable. The figure is
    the growth of the peak resident set over the RSS the process had just before the call, so it
    includes everything ``fn`` allocated (inputs it creates, temporaries, outputs).

    Ctrl-C in a terminal reaches the child too; the child ignores it (it would print a traceback
    of its own) and this process, interrupted, stops the child before the ``KeyboardInterrupt``
    leaves, so nothing is left to wait for at exit.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(fn, args, kwargs, queue))
    _start_ignoring_sigint(proc)
    try:
        status, mb, result = _answer(fn, proc, queue)
    finally:
        if proc.is_alive():  # interrupted, or an error here: the measurement is abandoned
            proc.terminate()
        proc.join()
    if status != "ok":
        raise RuntimeError(f"memory measurement of {getattr(fn, '__name__', fn)} failed: {result}")
    return mb, result


def _start_ignoring_sigint(proc: Any) -> None:
    """Start ``proc`` with SIGINT ignored (a fresh interpreter keeps an ignored SIGINT ignored
    and installs no ``KeyboardInterrupt``); this process's handler is put back at once."""
    if threading.current_thread() is not threading.main_thread():
        proc.start()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc.start()
    finally:
        signal.signal(signal.SIGINT, previous)


def _answer(fn: Callable[..., Any], proc: Any, queue: Any) -> tuple[str, float, Any]:
    """The child's (status, MB, result or error text); a child that died without one is a
    ``RuntimeError``."""
    while True:  # a child killed outright (e.g. by the OOM killer) never answers: do not hang
        try:
            return queue.get(timeout=2.0)
        except queue_module.Empty:
            if not proc.is_alive() and queue.empty():
                raise RuntimeError(
                    f"memory measurement of {getattr(fn, '__name__', fn)} failed: its process "
                    f"died with exit code {proc.exitcode} (a negative code is the signal, "
                    "e.g. -9 when killed for memory)") from None
