"""A run's output files, made current together.

``gpscale fit --out DIR`` writes ``model.pt``, ``metrics.json``, ``history.csv`` and
``history.json``. A reader must never find the metrics of one run beside the model of another,
and a file that gpscale did not write must be recognisable as such, so the files of one run are
written and made current as one set (:func:`write_together`):

1. each file is written into a staging folder inside DIR, ``.gpscale-run-XXXXXXXX`` (a new
   folder with an unpredictable name);
2. a commit record, ``COMMIT`` in the staging folder, names the run id and the SHA-256 of each
   file. A staging folder without it holds a run killed while writing: it is thrown away.
   With it, the set is decided: whoever next holds DIR (:func:`recover`) completes what a kill
   left undone;
3. the files are renamed into DIR one by one (``os.replace``; a Ctrl-C in between waits until the
   renames are done), then the record's entries replace those of DIR's manifest,
   ``.gpscale-outputs.json``, and the staging folder is removed.

Every run has a run id: ``metrics.json`` carries it as ``run_id``, and so does ``model.pt``'s
info, so a reader that holds both can tell whether they belong together (:func:`metrics_run_id`).
The manifest names, for each file, the run that wrote it and its SHA-256: a file it does not
describe, or whose content has changed since, was not written by ``gpscale fit``
(:func:`written_by_gpscale`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpscale.files import atomic_write

__all__ = ["OUTPUT_NAMES", "MANIFEST", "STAGING_PREFIX", "new_run_id", "write_together",
           "recover", "pending", "written_by_gpscale", "metrics_run_id"]

OUTPUT_NAMES = ("model.pt", "metrics.json", "history.csv", "history.json")
"""What a run writes into its output folder, in the order it is made current."""
MANIFEST = ".gpscale-outputs.json"
STAGING_PREFIX = ".gpscale-run-"
_RECORD = "COMMIT"
_MAX_RECORD_BYTES = 1 << 20  # a record or manifest names a few files; more is not ours


def new_run_id() -> str:
    """A fresh run id (32 hexadecimal digits)."""
    return uuid.uuid4().hex


def write_together(folder: str | Path, run_id: str,
                   writers: dict[str, Callable[[Path], Any]]) -> None:
    """Write ``writers[name](path)`` for each output name into a staging folder inside
    ``folder``, then make them current together (module docstring).

    Args:
        folder: the output folder (created if needed).
        run_id: the id of the run the files belong to.
        writers: a function per output name (:data:`OUTPUT_NAMES`) that writes that file at
            the path it is given; the files are made current in this order.

    Raises:
        ValueError: a name is not one of :data:`OUTPUT_NAMES`.
    """
    unknown = [name for name in writers if name not in OUTPUT_NAMES]
    if unknown:
        raise ValueError(f"unknown output file {unknown[0]!r}; expected one of "
                         f"{', '.join(OUTPUT_NAMES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=folder, prefix=STAGING_PREFIX))
    try:
        for name, write in writers.items():
            write(stage / name)
        record = {"run_id": run_id,
                  "files": {name: _sha256(stage / name) for name in writers}}
        atomic_write(stage / _RECORD, json.dumps(record, indent=1).encode())
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    _complete(folder, stage, record)


def recover(folder: str | Path, *, discard: bool = True) -> list[str]:
    """Complete the commits that a killed run left in ``folder`` and, with ``discard``, remove
    the staging folders of runs killed while writing and stale ``.partial`` files of the
    outputs. Call it only while holding the folder (no run writes there meanwhile).

    Returns:
        The run ids whose outputs were made current here.
    """
    folder = Path(folder)
    completed = []
    with os.scandir(folder) as entries:
        found = list(entries)
    for entry in found:
        if entry.name.startswith(STAGING_PREFIX) and entry.is_dir(follow_symlinks=False):
            stage = Path(entry.path)
            record = _read_record(stage / _RECORD)
            if record is not None:
                _complete(folder, stage, record)
                completed.append(record["run_id"])
            elif discard:
                shutil.rmtree(stage, ignore_errors=True)
        elif discard and _is_stale_partial(entry):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    return completed


def pending(folder: str | Path) -> bool:
    """Whether ``folder`` holds a decided set of outputs not yet (all) made current: a run is
    making them current right now, or was killed while doing so."""
    folder = Path(folder)
    try:
        with os.scandir(folder) as entries:
            stages = [Path(e.path) for e in entries if e.name.startswith(STAGING_PREFIX)
                      and e.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    return any(_read_record(stage / _RECORD) is not None for stage in stages)


def written_by_gpscale(folder: str | Path, name: str) -> bool:
    """Whether ``folder/name`` is a regular file that a run wrote there and nobody changed
    since (the manifest's SHA-256 for it matches)."""
    path = Path(folder) / name
    entry = _read_json(Path(folder) / MANIFEST).get("files", {})
    entry = entry.get(name) if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or not _is_regular(path):
        return False
    return entry.get("sha256") == _sha256(path)


def metrics_run_id(folder: str | Path) -> str | None:
    """The ``run_id`` of ``folder/metrics.json``, or ``None`` where it has none (no such
    regular file, not JSON, written before runs had ids, or by someone else)."""
    run_id = _read_json(Path(folder) / "metrics.json").get("run_id")
    return run_id if isinstance(run_id, str) else None


def _complete(folder: Path, stage: Path, record: dict[str, Any]) -> None:
    """Rename the staged files into ``folder``, update the manifest, remove ``stage``.

    Each step can be repeated (a file already moved is skipped), which is what lets
    :func:`recover` finish a commit a kill interrupted; a Ctrl-C (or an exit request) while
    the steps run is raised once they are done, so that it cannot split the set.
    """
    steps = [lambda name=name: _move(stage / name, folder / name) for name in record["files"]]
    steps += [lambda: _update_manifest(folder, record),
              lambda: shutil.rmtree(stage, ignore_errors=True)]
    deferred: BaseException | None = None
    while steps:
        try:
            steps[0]()
            steps.pop(0)
        except (KeyboardInterrupt, SystemExit) as err:
            deferred = err
    if deferred is not None:
        raise deferred


def _move(source: Path, target: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.replace(source, target)


def _update_manifest(folder: Path, record: dict[str, Any]) -> None:
    files = _read_json(folder / MANIFEST).get("files")
    files = dict(files) if isinstance(files, dict) else {}
    files.update({name: {"run_id": record["run_id"], "sha256": digest}
                  for name, digest in record["files"].items()})
    manifest = {"format": "gpscale-outputs", "files": files}
    atomic_write(folder / MANIFEST, json.dumps(manifest, indent=1).encode())


def _read_record(path: Path) -> dict[str, Any] | None:
    """A staging folder's commit record, or ``None`` where it is absent or not one of ours
    (a record naming anything but output files, or without a run id, is ignored)."""
    record = _read_json(path)
    files, run_id = record.get("files"), record.get("run_id")
    if not isinstance(run_id, str) or not isinstance(files, dict) or not files:
        return None
    if not all(name in OUTPUT_NAMES and isinstance(d, str) for name, d in files.items()):
        return None
    return record


def _read_json(path: Path) -> dict[str, Any]:
    """A small JSON object from a regular file; ``{}`` where there is none."""
    if not _is_regular(path) or path.stat().st_size > _MAX_RECORD_BYTES:
        return {}
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_stale_partial(entry: os.DirEntry) -> bool:
    """A temporary file of an output's atomic write (``.model.pt.XXXX.partial``), left by a
    process that was killed while writing it."""
    names = (*OUTPUT_NAMES, MANIFEST)
    return (entry.name.endswith(".partial") and not entry.is_dir(follow_symlinks=False)
            and any(entry.name.startswith(f".{name}.") for name in names))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
