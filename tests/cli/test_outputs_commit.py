"""A fit's outputs are one set, and nothing gpscale did not write is replaced without
--overwrite: kills and Ctrl-C between the renames of ``fit --out``, a ``model.pt`` beside another
run's ``metrics.json``, files of the user's own at the names ``fit`` and ``datasets synthesize``
write. CLI exit codes, one error line, files compared before and after."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from gpscale.cli.__main__ import main
from gpscale.cli.outputs import FIT_FILES
from gpscale.commit import MANIFEST, STAGING_PREFIX
from gpscale.io import load_with_data
from gpscale.run import RunSpec, write_partial
from gpscale.training import History

USER_TEXT = "my own notes\n"
LOCK = ".gpscale-fit.lock"


class Killed(BaseException):
    """Stands for SIGKILL: nothing in gpscale handles it."""


def _csv(path: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(40, 2))
    y = np.sin(4 * x[:, 0]) + x[:, 1]
    rows = "\n".join(",".join(f"{v:.6f}" for v in row) for row in np.column_stack([x, y]))
    path.write_text("a,b,y\n" + rows + "\n")
    return path


def _fit(data: Path, out: Path, *extra: str, epochs: int = 1) -> list[str]:
    return ["fit", "--data", str(data), "--target", "y", "--method", "exact", "--optimizer",
            "adam", "--epochs", str(epochs), "--out", str(out), "--no-progress", *extra]


def _one_error(capsys, argv: list[str], code: int, *needles: str) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"gpscale {argv[0]}: ")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _pair(out: Path) -> tuple[dict, dict]:
    """metrics.json and the metrics recorded in model.pt's info."""
    info = load_with_data(out / "model.pt").info
    return json.loads((out / "metrics.json").read_text()), info


def _assert_one_run(out: Path) -> None:
    metrics, info = _pair(out)
    assert metrics["train_time_s"] == info["metrics"]["train_time_s"]
    assert metrics["epochs"] == info["metrics"]["epochs"]
    assert metrics["run_id"] == info["run_id"]
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted([*FIT_FILES, MANIFEST, LOCK]), left


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """Data and the output folder of one finished fit (1 epoch), to copy from."""
    root = tmp_path_factory.mktemp("commit")
    data = _csv(root / "train.csv")
    assert main(_fit(data, root / "run")) == 0
    return data, root / "run"


def _copy(first, tmp_path: Path) -> tuple[Path, Path]:
    data, done = first
    out = tmp_path / "out"
    shutil.copytree(done, out)
    return data, out


def _interrupt_after_first_rename(monkeypatch, out: Path, exc: type[BaseException]) -> None:
    """Let the first rename of an output file into ``out`` happen, then raise ``exc``."""
    real, seen = os.replace, []

    def replace(src, dst, **kwargs):
        dst = Path(dst)
        if dst.parent == out and dst.name in FIT_FILES:
            if seen:
                monkeypatch.setattr(os, "replace", real)
                raise exc
            seen.append(dst.name)
        return real(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


def test_a_kill_between_renames_is_completed_before_predict(first, tmp_path, capsys,
                                                            monkeypatch, caplog):
    """A fit killed after the first of its renames: predict sees the new run whole."""
    data, out = _copy(first, tmp_path)
    _interrupt_after_first_rename(monkeypatch, out, Killed)
    with pytest.raises(Killed):
        main(_fit(data, out, "--overwrite", epochs=2))
    monkeypatch.undo()
    capsys.readouterr()
    with caplog.at_level("WARNING", logger="gpscale.fit"):
        assert main(["predict", "--model", str(out / "model.pt"), "--data", str(data)]) == 0
    assert "completed the outputs of an interrupted gpscale fit" in caplog.text
    _assert_one_run(out)
    assert json.loads((out / "metrics.json").read_text())["epochs"] == 2


def test_a_kill_between_renames_is_completed_by_the_next_fit(first, tmp_path, capsys,
                                                             monkeypatch):
    """The next fit into the folder makes the killed run's set current before it starts."""
    data, out = _copy(first, tmp_path)
    _interrupt_after_first_rename(monkeypatch, out, Killed)
    with pytest.raises(Killed):
        main(_fit(data, out, "--overwrite", epochs=2))
    monkeypatch.undo()
    capsys.readouterr()
    _one_error(capsys, _fit(data, out), 2, "already holds a model.pt", "--overwrite")
    _assert_one_run(out)


def test_a_second_ctrl_c_between_renames_waits_for_the_set(first, tmp_path, capsys,
                                                           monkeypatch):
    """Ctrl-C while the outputs are renamed into place: all four renames happen, then exit 130."""
    data, out = _copy(first, tmp_path)
    _interrupt_after_first_rename(monkeypatch, out, KeyboardInterrupt)
    assert main(_fit(data, out, "--overwrite", epochs=2)) == 130
    _assert_one_run(out)
    assert json.loads((out / "metrics.json").read_text())["epochs"] == 2


def test_leftovers_of_a_run_killed_while_writing_are_removed(first, tmp_path, capsys):
    """A staging folder without its commit record and a stale .partial are cleaned up."""
    data, out = _copy(first, tmp_path)
    stage = out / f"{STAGING_PREFIX}killed"
    stage.mkdir()
    (stage / "metrics.json").write_text("{}")
    (out / ".model.pt.abc123.partial").write_bytes(b"half a model")
    assert main(_fit(data, out, "--overwrite")) == 0
    _assert_one_run(out)


def test_predict_refuses_a_model_beside_another_runs_metrics(first, tmp_path, capsys):
    data, out = _copy(first, tmp_path)
    assert main(_fit(data, tmp_path / "other", "--seed", "1")) == 0
    shutil.copy(tmp_path / "other" / "metrics.json", out / "metrics.json")
    capsys.readouterr()
    _one_error(capsys, ["predict", "--model", str(out / "model.pt"), "--data", str(data)], 2,
               str(out / "model.pt"), "different gpscale fit runs")


@pytest.mark.parametrize("name", ["metrics.json", "history.csv", "history.json"])
def test_fit_out_keeps_a_file_it_did_not_write(first, tmp_path, capsys, name):
    data, _ = first
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text(USER_TEXT)
    _one_error(capsys, _fit(data, out), 2, str(out / name), "did not write", "--overwrite")
    assert (out / name).read_text() == USER_TEXT and not (out / "model.pt").exists()


def test_fit_out_keeps_an_edited_output(first, tmp_path, capsys):
    """A history.csv written by a fit and edited since is the user's now."""
    data, out = _copy(first, tmp_path)
    (out / "model.pt").unlink()
    with open(out / "history.csv", "a") as f:
        f.write("checked,by,hand\n")
    edited = (out / "history.csv").read_text()
    _one_error(capsys, _fit(data, out), 2, str(out / "history.csv"), "did not write")
    assert (out / "history.csv").read_text() == edited


def test_overwrite_replaces_files_fit_did_not_write(first, tmp_path, capsys):
    data, _ = first
    out = tmp_path / "out"
    out.mkdir()
    for name in ("metrics.json", "history.csv", "history.json"):
        (out / name).write_text(USER_TEXT)
    assert main(_fit(data, out, "--overwrite")) == 0
    _assert_one_run(out)


def test_a_fit_after_a_failed_run_needs_no_overwrite(first, tmp_path, capsys):
    """The histories a failed run left are gpscale's own: the next fit replaces them."""
    data, _ = first
    out = tmp_path / "out"
    history = History(rows=[{"epoch": 1, "loss": float("nan"), "time_s": 0.1}],
                      stopped="non-finite")
    write_partial(RunSpec(method="exact", csv=str(data), target="y", out=str(out)), history)
    assert sorted(p.name for p in out.iterdir()) == sorted(["history.csv", "history.json",
                                                            MANIFEST])
    assert main(_fit(data, out)) == 0
    _assert_one_run(out)


def test_a_folder_at_an_output_name_is_refused_before_training(first, tmp_path, capsys):
    data, _ = first
    out = tmp_path / "out"
    (out / "metrics.json").mkdir(parents=True)
    _one_error(capsys, _fit(data, out, "--overwrite"), 2, str(out / "metrics.json"),
               "a folder")


def _synthesize(out: Path, *extra: str) -> list[str]:
    return ["datasets", "synthesize", "--out", str(out), "--rows", "20", "--dims", "2", *extra]


@pytest.mark.parametrize("name", ["mine.csv", "mine.npy"])
def test_synthesize_keeps_an_existing_file_unless_overwrite(tmp_path, capsys, name):
    out = tmp_path / name
    out.write_text(USER_TEXT)
    _one_error(capsys, _synthesize(out), 2, str(out), "exists", "--overwrite")
    assert out.read_text() == USER_TEXT
    assert main(_synthesize(out, "--overwrite")) == 0
    assert out.read_bytes() != USER_TEXT.encode()


def test_synthesize_refuses_a_folder_even_with_overwrite(tmp_path, capsys):
    out = tmp_path / "data.csv"
    out.mkdir()
    _one_error(capsys, _synthesize(out, "--overwrite"), 2, "a folder")
