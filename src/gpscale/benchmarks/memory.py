"""Peak-memory measurement for benchmarks.

CPU tensors are invisible to ``tracemalloc``, and a process's resident-set high-water mark cannot be
reset, so each measurement runs in a fresh spawned process: the peak RSS of that process minus its
RSS just before the measured call is the memory the call needed. On CUDA the caller should use
``torch.cuda.max_memory_allocated`` instead.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["peak_memory_mb", "current_rss_mb"]


def current_rss_mb() -> float:
    """Resident set size of this process now, in MB (Linux ``/proc``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return _peak_rss_mb()


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _child(fn, args, kwargs, queue):
    try:
        before = current_rss_mb()
        result = fn(*args, **kwargs)
        queue.put(("ok", _peak_rss_mb() - before, result))
    except BaseException as exc:  # reported to the parent, which re-raises
        queue.put(("error", 0.0, f"{type(exc).__name__}: {exc}"))


def peak_memory_mb(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """Run ``fn(*args, **kwargs)`` in a fresh process; return (peak extra RSS in MB, result).

    ``fn`` must be a module-level function and its arguments and result picklable. The figure is
    the growth of the peak resident set over the RSS the process had just before the call, so it
    includes everything ``fn`` allocated (inputs it creates, temporaries, outputs).
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(fn, args, kwargs, queue))
    proc.start()
    status, mb, result = queue.get()
    proc.join()
    if status != "ok":
        raise RuntimeError(f"memory measurement of {getattr(fn, '__name__', fn)} failed: {result}")
    return mb, result
