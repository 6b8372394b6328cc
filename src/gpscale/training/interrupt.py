"""Ctrl-C as a request to stop cleanly: finish the current step, keep what was trained.

Inside :func:`graceful_interrupt` (``gpscale fit`` runs its whole run in it) the first SIGINT
only sets a flag: ``training.fit`` sees it after the step it is taking, ends the epoch there,
writes its checkpoint and returns a history whose ``stopped`` is ``"interrupted"``; the caller
then evaluates and saves the model as usual. A second Ctrl-C raises ``KeyboardInterrupt`` at
once, for work that would otherwise take too long to reach a step's end. Outside the context
(library use, a notebook) nothing changes: Ctrl-C raises ``KeyboardInterrupt`` as always.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

__all__ = ["graceful_interrupt", "requested"]

log = logging.getLogger("gpscale.fit")
_REQUESTED = threading.Event()


def requested() -> bool:
    """Whether Ctrl-C asked the current run to stop (only ever set inside the context)."""
    return _REQUESTED.is_set()


def _handler(signum: int, frame: object) -> None:
    if _REQUESTED.is_set():
        raise KeyboardInterrupt
    _REQUESTED.set()
    log.warning("interrupted: stopping after the current step, then saving what was trained "
                "(Ctrl-C again to abort without saving)")


@contextlib.contextmanager
def graceful_interrupt() -> Iterator[None]:
    """Install the two-stage Ctrl-C handler for the duration (main thread only; elsewhere,
    or where someone else's SIGINT handler is installed, the context does nothing)."""
    _REQUESTED.clear()
    usable = (threading.current_thread() is threading.main_thread()
              and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if not usable:
        yield
        return
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _REQUESTED.clear()
