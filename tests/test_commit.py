"""A run's outputs made current together: a failed write leaves the folder as it was, the
manifest recognises exactly the files a run wrote, and recovery completes only records of ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpscale.commit import (
    MANIFEST,
    STAGING_PREFIX,
    metrics_run_id,
    pending,
    recover,
    write_together,
    written_by_gpscale,
)


def _text(text: str):
    return lambda path: Path(path).write_text(text)


def _fail(path: Path) -> None:
    Path(path).write_text("half")
    raise RuntimeError("disk full")


def test_a_failed_write_leaves_the_folder_as_it_was(tmp_path):
    write_together(tmp_path, "a", {"metrics.json": _text('{"run_id": "a"}'),
                                   "history.csv": _text("epoch\n1\n")})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(RuntimeError, match="disk full"):
        write_together(tmp_path, "b", {"metrics.json": _text('{"run_id": "b"}'),
                                       "history.csv": _fail})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert metrics_run_id(tmp_path) == "a"


def test_the_manifest_knows_what_a_run_wrote_and_nothing_else(tmp_path):
    write_together(tmp_path, "a", {"history.csv": _text("epoch\n1\n")})
    assert written_by_gpscale(tmp_path, "history.csv")
    (tmp_path / "history.json").write_text("{}")
    assert not written_by_gpscale(tmp_path, "history.json")  # not in the manifest
    (tmp_path / "history.csv").write_text("epoch\n2\n")
    assert not written_by_gpscale(tmp_path, "history.csv")  # changed since


def test_a_partial_commit_keeps_the_other_entries(tmp_path):
    write_together(tmp_path, "a", {"metrics.json": _text("{}"), "history.csv": _text("1\n")})
    write_together(tmp_path, "b", {"history.csv": _text("2\n")})
    files = json.loads((tmp_path / MANIFEST).read_text())["files"]
    assert {name: entry["run_id"] for name, entry in files.items()} == {
        "metrics.json": "a", "history.csv": "b"}


def test_recovery_ignores_a_record_naming_other_files(tmp_path):
    """A record that would move anything but an output file is not one of ours."""
    stage = tmp_path / f"{STAGING_PREFIX}crafted"
    stage.mkdir()
    (stage / "train.csv").write_text("replaced")
    (stage / "COMMIT").write_text(json.dumps({"run_id": "x", "files": {"train.csv": "0"}}))
    (tmp_path / "train.csv").write_text("mine")
    assert not pending(tmp_path)
    assert recover(tmp_path, discard=False) == []
    assert (tmp_path / "train.csv").read_text() == "mine" and stage.exists()
    assert recover(tmp_path) == [] and not stage.exists()
