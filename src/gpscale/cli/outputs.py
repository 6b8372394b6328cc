"""Where the command line may write, checked before any work starts.

``gpscale fit`` and ``gpscale predict`` write files a user may care about more than the run
itself: an input, an earlier model, another run's output. Every check here happens before data
is read or a model trained, so a refused run costs nothing, and every write itself goes through
:mod:`gpscale.files` (a temporary file with an unpredictable name in the target's folder, renamed
into place). The rules:

- ``--out`` of ``predict`` must not be one of its inputs (``--data``, ``--model``), a folder, or
  something other than a regular file (``/dev/stdout``, a pipe): leave ``--out`` out to write to
  standard output. A symlink at ``--out`` is followed: the file it names is replaced.
- ``--out`` of ``fit`` is a folder; a ``model.pt`` already there is kept unless ``--overwrite``,
  and so is a ``metrics.json``, ``history.csv`` or ``history.json`` that ``gpscale fit`` did not
  write (the histories of an earlier run that failed are replaced); it must be writable; and
  while a run writes there it holds a lock on it, so a second run on the same folder is refused
  rather than mixed with the first. The same lock guards ``--checkpoint``. Holding the folder,
  the run first completes or removes what a killed run left there (:func:`gpscale.commit.recover`).
- ``gpscale predict`` of a fit's ``model.pt`` first completes the outputs a killed fit left
  half made current, and refuses a ``model.pt`` whose ``metrics.json`` beside it is another
  run's (:func:`settle_fit_outputs`, :func:`check_same_run`).
- ``--out`` of ``datasets synthesize`` is a file; an existing one is kept unless ``--overwrite``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpscale.commit import OUTPUT_NAMES, metrics_run_id, pending, recover, written_by_gpscale

__all__ = ["FIT_FILES", "check_predict_out", "check_same_run", "check_synthesize_out",
           "claim_fit_outputs", "expand_user", "settle_fit_outputs"]

FIT_FILES = OUTPUT_NAMES
"""What ``gpscale fit`` writes into ``--out``."""
LOCK_NAME = ".gpscale-fit.lock"
log = logging.getLogger("gpscale.fit")


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
        for run_id in recover(folder):
            log.warning("completed the outputs of an interrupted gpscale fit in %s (run %s)",
                        folder, run_id)
        _check_replaceable(folder, out, overwrite)
        yield (folder / "model.pt").exists()


def _check_replaceable(folder: Path, out: str, overwrite: bool) -> None:
    """Refuse (ValueError) to replace what ``overwrite`` does not allow: a folder or other
    non-file at an output's name always, a ``model.pt``, or a file gpscale fit did not
    write, without ``overwrite``."""
    for name in FIT_FILES:
        path = folder / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise ValueError(f"--out {out}: {path} is {_kind(mode)}; remove it or choose "
                             "another --out")
    if overwrite:
        return
    if os.path.lexists(folder / "model.pt"):
        raise ValueError(f"--out {out} already holds a model.pt from an earlier run; pass "
                         "--overwrite to replace it, or choose another --out")
    for name in FIT_FILES:
        path = folder / name
        if os.path.lexists(path) and not written_by_gpscale(folder, name):
            raise ValueError(f"--out {out} holds {path}, which gpscale fit did not write; pass "
                             "--overwrite to replace it, or choose another --out")


def settle_fit_outputs(model: str | Path) -> None:
    """Before ``gpscale predict`` reads a fit's ``model.pt``: complete the outputs that a
    killed fit left half made current in its folder (the staged set was complete, so the
    folder then holds that run's files only).

    Raises:
        ValueError: a fit holds the folder (it is making its outputs current right now), or
            the folder cannot be locked.
    """
    path = Path(model)
    folder = path.parent
    if path.name != "model.pt" or not pending(folder):
        return
    with _locked(folder, LOCK_NAME, f"to {folder}"):
        completed = recover(folder, discard=False)
    for run_id in completed:
        log.warning("completed the outputs of an interrupted gpscale fit in %s (run %s)",
                    folder, run_id)


def check_same_run(model: str | Path, info: Any) -> None:
    """Refuse (ValueError) a fit's ``model.pt`` whose ``metrics.json`` beside it belongs to
    another run, so that predictions are never taken for those of the run the metrics
    describe. Models named otherwise, and folders whose ``metrics.json`` carries no run id
    (not written by gpscale fit, or before runs had ids), are not checked."""
    path = Path(model)
    if path.name != "model.pt":
        return
    theirs = metrics_run_id(path.parent)
    ours = info.get("run_id") if isinstance(info, dict) else None
    if theirs is None or ours == theirs:
        return
    if pending(path.parent):
        raise ValueError(f"--model {model}: a gpscale fit is making its outputs current in "
                         f"{path.parent} right now; run predict again once it has finished")
    raise ValueError(f"--model {model} and the metrics.json beside it come from different "
                     f"gpscale fit runs ({ours or 'no run id'} and {theirs}); refit into this "
                     "folder, or move one of the two away")


def check_synthesize_out(out: str, *, overwrite: bool) -> Path:
    """``datasets synthesize --out`` as a path to write; ``ValueError`` where it is not a
    writable file path, or an existing file and ``overwrite`` is off."""
    path = expand_user(out, "--out")
    if os.path.lexists(path):
        if path.exists() and not path.is_file():
            raise ValueError(f"--out {out} is {_kind(path.stat().st_mode)}, not a file; give "
                             "a file path")
        if not overwrite:
            raise ValueError(f"--out {out} exists; pass --overwrite to replace it, or choose "
                             "another file")
    _check_writable(path.parent, "--out", out)
    return path
