"""Opening a user's file so that it cannot hang or flood the reader: regular files only.

A named pipe (FIFO) blocks whoever opens it until a writer comes, and then feeds it for as
long as the writer likes; a device such as ``/dev/zero`` or ``/dev/urandom`` never ends; a
folder has no bytes to read. Every reader of gpscale's own files (models, checkpoints) and of
the user's data files asks :func:`check_regular` first, which looks at the file's type with
``os.stat`` without opening it, and :func:`open_regular` then opens with ``O_NONBLOCK`` (so a
FIFO put in the file's place after the check cannot block the open either) and checks the
opened file's type again. A file that is not regular is a :class:`NotRegularFileError`, a
``ValueError`` whose message names the file and what it is.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = ["NotRegularFileError", "check_regular", "open_regular", "read_regular"]

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(ValueError):
    """The path names a folder, a named pipe, a device or a socket, not a regular file.

    Attributes:
        path: the file.
        problem: the message without the path (``"is a named pipe (FIFO), ..."``).
    """

    def __init__(self, path: str | Path, mode: int):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        self.path = str(path)
        self.problem = ("is a folder, not a file" if stat.S_ISDIR(mode) else
                        f"is {kind}, not a regular file; gpscale reads data and model files "
                        "only from regular files (save the content to a file first)")
        super().__init__(f"{path}: {self.problem}")


def check_regular(path: str | Path) -> os.stat_result:
    """``os.stat`` of ``path`` (symlinks followed), refused unless it is a regular file.

    Raises:
        FileNotFoundError, PermissionError: as ``os.stat`` raises them.
        NotRegularFileError: a folder, named pipe, device or socket.
    """
    status = os.stat(path)
    if not stat.S_ISREG(status.st_mode):
        raise NotRegularFileError(path, status.st_mode)
    return status


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for binary reading, after :func:`check_regular`; the open cannot block
    (``O_NONBLOCK``) and the opened file is checked to be regular again."""
    check_regular(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the check and the open
            raise NotRegularFileError(path, mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def read_regular(path: str | Path) -> bytes:
    """All bytes of a regular file (:func:`open_regular`)."""
    with open_regular(path) as f:
        return f.read()
