"""The CPU allocator while a model trains: freed large blocks kept for the next epoch.

Above a threshold glibc's ``malloc`` maps every block afresh from the kernel and unmaps it on
``free``. A training epoch allocates and frees the same large tensors again and again (a
CaGP-Opt epoch on tens of thousands of rows holds several n × i matrices of a hundred
megabytes or more), and each fresh mapping is paid for in page faults, one per 4 kB page as it
is first written: an elementwise product into a new 127 MB tensor costs about six times the
product into one that exists. :func:`training_allocator` therefore, while a model trains on the
CPU, has ``malloc`` serve large blocks from its heap (``M_MMAP_MAX`` 0) and keep the memory
freed there (``M_TRIM_THRESHOLD`` high), so that the next epoch's tensors reuse pages already
touched; afterwards it restores glibc's defaults and returns the free heap to the system
(``malloc_trim``), so the resident memory after training is what the model holds, and the
readers and predictions that follow allocate as before.

Within training the sizes repeat from epoch to epoch, so the kept blocks are reused rather than
fragmented. Only glibc on Linux is changed; elsewhere, and with ``GPSCALE_MALLOC=system``, this
does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import sys
from collections.abc import Iterator

__all__ = ["training_allocator", "ENV", "KEEP_TRIM_THRESHOLD"]

log = logging.getLogger(__name__)

ENV = "GPSCALE_MALLOC"
"""``system`` leaves the allocator as it is."""

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters
KEEP_TRIM_THRESHOLD = 2**31 - 1
"""Free memory at the top of the heap kept while training (bytes: all of it)."""
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536  # glibc's defaults

_depth = 0


@functools.cache
def _glibc():
    """glibc's ``mallopt`` and ``malloc_trim``, or ``None`` (another C library, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 -- present in glibc only
        return libc
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def training_allocator(on_cpu: bool = True) -> Iterator[bool]:
    """While the block runs, ``malloc`` keeps freed large blocks for reuse (module docstring);
    yields whether it does. Re-entrant: the outermost block restores the defaults.
    ``on_cpu=False`` (the tensors are on a GPU, whose allocator caches its blocks already)
    changes nothing."""
    global _depth
    libc = _glibc() if on_cpu and os.environ.get(ENV, "").lower() != "system" else None
    if libc is None:
        yield False
        return
    if _depth == 0 and not (libc.mallopt(M_MMAP_MAX, 0) and
                            libc.mallopt(M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD)):
        log.debug("mallopt refused to keep freed blocks")
    _depth += 1
    try:
        yield True
    finally:
        _depth -= 1
        if _depth == 0:
            libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
            libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
            libc.malloc_trim(0)
