"""Where the command line may write, checked before any work starts.

``gpscale fit`` and ``gpscale predict`` write files a user may care about more than the run
itself: an input, an earlier model, another run's output. Every check here happens before data
is read or a model trained, so a refused run costs nothing, and every write itself goes through
:mod:`gpscale.files` (a temporary file with an unpredictable name in the target's folder, renamed
into place). The rules:

- ``--out`` of ``predict`` must not be one of its inputs (``--data``, ``--model``), a folder, or
  something other than a regular file (``/dev/stdout``, a pipe): leave ``--out`` out to write to
  standard output. A symlink at ``--out`` is followed: the file it names is replaced.
- ``--out`` of ``fit`` is a folder; a ``model.pt`` already there is kept unless ``--overwrite``;
  it must be writable; and while a run writes there it holds a lock on it, so a second run on
  the same folder is refused rather than mixed with the first. The same lock guards
  ``--checkpoint``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["FIT_FILES", "check_predict_out", "claim_fit_outputs", "expand_user"]

FIT_FILES = ("model.pt", "metrics.json", "history.csv", "history.json")
"""What ``gpscale fit`` writes into ``--out``."""
LOCK_NAME = ".gpscale-fit.lock"


def expand_user(path: str, flag: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded; ``ValueError`` naming ``flag`` when
    there is no such user or no home folder."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        user = path[1:].split("/", 1)[0] or "the current user"
        raise ValueError(f"{flag} {path}: cannot expand '~' (no home folder for {user})") \
            from None


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def check_predict_out(out: str, inputs: dict[str, str]) -> Path:
    """``predict --out`` as the path of a regular file that is safe to replace; ``ValueError``
    saying why not.

    A symlink at ``out`` is followed (the file it names is replaced, the link kept), so the
    check is on the file that would change: not an input, not under ``/dev``, ``/proc`` or
    ``/sys`` (``/dev/stdout`` included), not a folder, device or pipe.

    Args:
        out: the ``--out`` argument.
        inputs: the input files by flag (``{"--data": ..., "--model": ...}``).
    """
    given = expand_user(out, "--out")
    path = given.resolve()
    for flag, name in inputs.items():
        if _same(path, Path(name)):
            raise ValueError(f"--out {out} is the {flag} file; write the predictions to "
                             "another file")
    if any(Path(p).parts[1:2] in (("dev",), ("proc",), ("sys",))
           for p in (os.path.abspath(given), path)):
        raise ValueError(f"--out {out} is a system path ({path}), not a file; leave --out out "
                         "to write to standard output")
    if path.exists():
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"--out {out} is {_kind(mode)}, not a file; give a file path, or "
                             "leave --out out to write to standard output")
    _check_writable(path.parent, "--out", out)
    return path


def _check_writable(folder: Path, flag: str, value: str) -> None:
    """Create the folder if needed and prove a file can be made in it (then remove it)."""
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"{flag} {value}: {existing} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".gpscale-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"{flag} {value}: cannot write in {folder} ({err.strerror or err})") \
            from None


@contextlib.contextmanager
def _locked(folder: Path, name: str, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``folder/name`` (POSIX ``flock``; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here
        yield
        return
    path = folder / name
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as err:
        raise ValueError(f"cannot lock {what}: {path} ({err.strerror or err})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise ValueError(f"another gpscale fit (pid {holder}) is writing {what}; wait for "
                             "it to finish, or choose another path") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def claim_fit_outputs(out: str, *, overwrite: bool, inputs: dict[str, str | None],
                      checkpoint: str | None) -> Iterator[bool]:
    """Check and lock ``fit --out`` (and ``--checkpoint``) for the duration of the run.

    Yields whether a ``model.pt`` of an earlier run is there (and will be replaced, which
    ``overwrite`` allowed).

    Raises:
        ValueError: ``--out`` is a file or not writable; it holds a model and ``overwrite`` is
            off; another run holds it; ``--checkpoint`` is a folder, not writable, or one of
            the run's inputs or outputs.
    """
    folder = expand_user(out, "--out")
    _check_writable(folder, "--out", out)
    targets = [folder / name for name in FIT_FILES]
    given = {flag: Path(p) for flag, p in inputs.items() if p}
    for target in targets:
        for flag, path in given.items():
            if _same(target, path):
                raise ValueError(f"--out {out} would overwrite the {flag} file {path}; choose "
                                 "another output folder")
    with contextlib.ExitStack() as stack:
        stack.enter_context(_locked(folder, LOCK_NAME, f"to {folder}"))
        if checkpoint is not None:
            ckpt = expand_user(checkpoint, "--checkpoint")
            for other in [*targets, *given.values()]:
                if _same(ckpt, other):
                    raise ValueError(f"--checkpoint {checkpoint} is also {other}; give the "
                                     "checkpoint a file of its own")
            if ckpt.exists() and not ckpt.is_file():
                raise ValueError(f"--checkpoint {checkpoint} is {_kind(ckpt.stat().st_mode)}, "
                                 "not a file")
            _check_writable(ckpt.parent, "--checkpoint", checkpoint)
            stack.enter_context(_locked(ckpt.parent, f".{ckpt.name}.lock",
                                        f"the checkpoint {ckpt}"))
        earlier = (folder / "model.pt").exists()
        if earlier and not overwrite:
            raise ValueError(f"--out {out} already holds a model.pt from an earlier run; pass "
                             "--overwrite to replace it, or choose another --out")
        yield earlier
