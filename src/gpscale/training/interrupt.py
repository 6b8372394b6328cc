"""Ctrl-C or SIGTERM as a request to stop cleanly: finish the current step, keep what was trained.

Inside :func:`graceful_interrupt` (``gpscale fit`` runs its whole run in it) the first SIGINT
(Ctrl-C) or SIGTERM (``kill``, a job scheduler's stop, ``timeout``) only sets a flag:
``training.fit`` sees it after the step it is taking, ends the epoch there, writes its
checkpoint and returns a history whose ``stopped`` is ``"interrupted"``; the caller then
evaluates and saves the model as usual. A second signal of either kind raises
``KeyboardInterrupt`` at once (its text names a SIGTERM), for work that would otherwise take too
long to reach a step's end. Outside the context (library use, a notebook) nothing changes:
Ctrl-C raises ``KeyboardInterrupt`` and SIGTERM ends the process, as always.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["graceful_interrupt", "requested", "received", "SIGNAL_NAMES"]

log = logging.getLogger("gpscale.fit")
_REQUESTED = threading.Event()
_RECEIVED: list[int] = []  # the signal that set _REQUESTED (one entry at most)

SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
"""How each handled signal is named to the user."""

# Each handled signal's handler when nobody has installed one: the context installs its own only
# over these, and puts them back.
_DEFAULT_HANDLERS: dict[int, Any] = {signal.SIGINT: signal.default_int_handler,
                                     signal.SIGTERM: signal.SIG_DFL}


def requested() -> bool:
    """Whether Ctrl-C or SIGTERM asked the current run to stop (only ever set inside the
    context)."""
    return _REQUESTED.is_set()


def received() -> str | None:
    """The name of the signal that asked the current run to stop (``"Ctrl-C"`` or
    ``"SIGTERM"``), ``None`` when none did."""
    return SIGNAL_NAMES[signal.Signals(_RECEIVED[0])] if _RECEIVED else None


def _handler(signum: int, frame: object) -> None:
    name = SIGNAL_NAMES[signal.Signals(signum)]
    if _REQUESTED.is_set():
        raise KeyboardInterrupt(*(() if signum == signal.SIGINT else (name,)))
    _RECEIVED.append(signum)
    _REQUESTED.set()
    what = "interrupted" if signum == signal.SIGINT else "terminated (SIGTERM)"
    log.warning("%s: stopping after the current step, then saving what was trained "
                "(%s again to abort without saving)", what, name)


@contextlib.contextmanager
def graceful_interrupt() -> Iterator[None]:
    """Install the two-stage handler for SIGINT and SIGTERM for the duration (main thread only;
    a signal whose handler someone else installed keeps it)."""
    _REQUESTED.clear()
    _RECEIVED.clear()
    main = threading.current_thread() is threading.main_thread()
    mine = [s for s, default in _DEFAULT_HANDLERS.items()
            if main and signal.getsignal(s) == default]
    for signum in mine:
        signal.signal(signum, _handler)
    try:
        yield
    finally:
        for signum in mine:
            signal.signal(signum, _DEFAULT_HANDLERS[signum])
        _REQUESTED.clear()
        _RECEIVED.clear()
