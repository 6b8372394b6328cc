"""What a reader may allocate: the arrays a file declares or decompresses to, checked against
the memory free before they are allocated.

A small file can declare, or decompress to, far more than the machine holds: a Parquet file's
metadata states any number of rows for a few bytes of run-length-encoded pages, a gzip stream
expands a thousandfold. Readers ask :func:`check_fits` before each allocation that such a file
sizes, so that it is refused with one line naming the file instead of exhausting memory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["available_memory", "check_fits", "device_memory", "TooLargeError", "MEMORY_SHARE"]

MEMORY_SHARE = 0.8
"""Most of the free memory one reader's arrays may take."""


class TooLargeError(ValueError):
    """A file declares or expands to more than memory holds: final, never a reason to try
    another reader of the same file."""


def available_memory() -> int | None:
    """Bytes of memory available now (Linux ``sysconf``), or ``None`` where unknown."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def device_memory(device: Any) -> tuple[int, str] | None:
    """(bytes, what they are) that a run on ``device`` (a ``torch.device``) may use: a GPU's
    free memory (torch's cached blocks included), the CPU's physical memory; ``None`` where
    unknown."""
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        name = torch.cuda.get_device_name(device)
        return free + cached, f"free on {device} ({name})"
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "of RAM on this machine"
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(path: str | Path, need: int, what: str) -> None:
    """:class:`TooLargeError` naming ``path`` when ``need`` bytes for ``what`` (e.g. "4,000,000,000
    rows of 3 numeric columns") exceed :data:`MEMORY_SHARE` of the memory free; nothing is
    checked where the free memory is unknown."""
    free = available_memory()
    if free is None or need <= MEMORY_SHARE * free:
        return
    raise TooLargeError(f"{path}: {what} need {need / 2**30:.3g} GiB, more than the "
                     f"{free / 2**30:.3g} GiB of memory free; nothing was allocated (a damaged "
                     "or crafted file, or data too large for this machine: read a subset)")
