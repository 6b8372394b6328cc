"""The outside probe of issue #46, files part: nothing gpscale reads runs code, nothing it writes
clobbers, Ctrl-C and resuming say what they do. Each test is one finding: CLI exit code, one
error line and no traceback; files compared byte for byte before and after."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import gpscale
from gpscale.cli.__main__ import main
from gpscale.cli.outputs import claim_fit_outputs
from gpscale.errors import SavedFileError
from gpscale.io import MAGIC, payload_digest

N = 120


def _csv(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(N, 2))
    y = np.sin(4 * x[:, 0]) + x[:, 1]
    rows = "\n".join(",".join(f"{v:.6f}" for v in row) for row in np.column_stack([x, y]))
    path.write_text("a,b,y\n" + rows + "\n")
    return path


def _fit(data: Path, out: Path, *extra: str, epochs: int = 2) -> list[str]:
    return ["fit", "--data", str(data), "--target", "y", "--method", "exact", "--epochs",
            str(epochs), "--out", str(out), "--no-progress", *extra]


def _fails(capsys, argv, *needles: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"gpscale {argv[0]}: ")]
    assert code == 2 and len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    data = _csv(root / "train.csv")
    assert main(_fit(data, root / "run")) == 0
    return root, data, root / "run" / "model.pt"


class _Payload:
    """Unpickling this runs a shell command (the probe's attack on model files)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _crafted(path: Path, marker: Path, kind: str, content: dict) -> Path:
    """A pickled file of the earlier format, its checksum recomputed so that it passes."""
    payload = {"format": MAGIC, "version": 2, "kind": kind, **content}
    payload["info" if kind == "method" else "history"] = _Payload(marker)
    payload["sha256"] = payload_digest(payload)
    torch.save(payload, path)
    return path


def test_crafted_model_and_checkpoint_never_run(run, tmp_path, capsys):
    _, data, model_path = run
    marker = tmp_path / "PWNED"
    saved = gpscale.io.read_file(model_path, ("method",))
    evil = _crafted(tmp_path / "evil.pt", marker, "method",
                    {"model": saved["model"], "transform": saved["transform"]})
    _fails(capsys, ["predict", "--model", str(evil), "--data", str(data)],
           "pickled format", "gpscale convert")
    for loader in (gpscale.load, gpscale.io.load_with_data):
        with pytest.raises(SavedFileError, match="gpscale convert"):
            loader(evil)
    ckpt = _crafted(tmp_path / "c.pt", marker, "checkpoint", {"epoch": 1, "model": {}})
    before = ckpt.read_bytes()
    _fails(capsys, _fit(data, tmp_path / "out", "--checkpoint", str(ckpt)), "gpscale convert")
    _fails(capsys, ["convert", str(evil), str(tmp_path / "new.pt")], "--trust")
    # even with --trust the old formats are read by torch's restricted unpickler: refused
    _fails(capsys, ["convert", str(evil), str(tmp_path / "new.pt"), "--trust"],
           "cannot be read")
    assert not marker.exists()
    assert ckpt.read_bytes() == before and not (tmp_path / "new.pt").exists()


def test_convert_with_trust_keeps_predictions(run, tmp_path, capsys):
    root, data, model_path = run
    saved = gpscale.io.read_file(model_path, ("method",))
    old = tmp_path / "old.pt"
    legacy = {**saved, "version": 2}  # as gpscale wrote it before 2026-11-28
    torch.save({**legacy, "sha256": payload_digest(legacy)}, old)
    predict = ["predict", "--model", str(model_path), "--data", str(data)]
    assert main(predict) == 0
    want = capsys.readouterr().out
    assert main(["convert", str(old), str(tmp_path / "new.pt"), "--trust"]) == 0
    assert main([*predict[:2], str(tmp_path / "new.pt"), *predict[3:]]) == 0
    assert capsys.readouterr().out == want
    _fails(capsys, ["convert", str(old), str(tmp_path / "new.pt"), "--trust"], "exists")


def test_predict_out_never_replaces_an_input_or_a_device(run, tmp_path, capsys):
    _, data, model_path = run
    before = {p: p.read_bytes() for p in (data, model_path)}
    base = ["predict", "--model", str(model_path), "--data", str(data), "--out"]
    _fails(capsys, [*base, str(data)], "is the --data file")
    _fails(capsys, [*base, str(model_path)], "is the --model file")
    _fails(capsys, [*base, "/dev/stdout"], "system path")
    _fails(capsys, [*base, str(tmp_path)], "a folder")
    link = tmp_path / "link.csv"
    link.symlink_to(data)
    _fails(capsys, [*base, str(link)], "is the --data file")
    assert {p: p.read_bytes() for p in before} == before


def test_planted_symlinks_at_temporary_names_are_not_followed(run, tmp_path, capsys):
    _, data, model_path = run
    victim = tmp_path / "victim"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    for name in (".pred.csv.partial", "model.pt.tmp", ".model.pt.tmp", "metrics.json.tmp",
                 "c.pt.tmp", ".c.pt.tmp"):
        (out / name).symlink_to(victim)
    assert main(["predict", "--model", str(model_path), "--data", str(data), "--out",
                 str(out / "pred.csv")]) == 0
    assert main(_fit(data, out, "--checkpoint", str(out / "c.pt"))) == 0
    assert victim.read_text() == "keep"
    assert (out / "pred.csv").read_text().startswith("mean,std")
    gpscale.load(out / "model.pt")


def test_an_earlier_model_is_kept_unless_overwrite(run, tmp_path, capsys):
    root, data, model_path = run
    out = tmp_path / "run"
    out.mkdir()
    (out / "model.pt").write_bytes(model_path.read_bytes())
    before = (out / "model.pt").read_bytes()
    _fails(capsys, _fit(data, out), "already holds a model.pt", "--overwrite")
    assert (out / "model.pt").read_bytes() == before and not (out / "metrics.json").exists()
    assert main(_fit(data, out, "--overwrite", "--seed", "1")) == 0
    assert "replacing the earlier model.pt" in capsys.readouterr().err


def test_a_second_run_on_one_out_is_refused(run, tmp_path, capsys):
    _, data, _ = run
    out = tmp_path / "shared"
    with claim_fit_outputs(str(out), overwrite=False, inputs={}, checkpoint=None):
        _fails(capsys, _fit(data, out), "another gpscale fit", f"pid {os.getpid()}")
    assert main(_fit(data, out)) == 0  # the lock went with the first run


def test_unusable_out_and_checkpoint_fail_before_training(run, tmp_path, capsys):
    _, data, _ = run
    afile = tmp_path / "file"
    afile.write_text("x")
    _fails(capsys, _fit(data, afile), "is a file, not a folder")
    _fails(capsys, _fit(data, afile / "sub"), "is a file, not a folder")
    _fails(capsys, _fit(data, tmp_path / "o", "--checkpoint", str(tmp_path)), "a folder")
    _fails(capsys, _fit(data, tmp_path / "o", "--checkpoint", str(data)), "is also")
    _fails(capsys, _fit(data, tmp_path / "o", "--checkpoint", str(tmp_path / "o" / "model.pt")),
           "is also")
    assert afile.read_text() == "x" and not (tmp_path / "o" / "metrics.json").exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only folders")
def test_read_only_out_fails_before_training(run, tmp_path, capsys):
    _, data, _ = run
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    _fails(capsys, _fit(data, locked), "cannot write in")


def test_resume_says_so_and_honours_a_smaller_budget(run, tmp_path, capsys, caplog):
    _, data, _ = run
    ckpt = str(tmp_path / "c.pt")
    assert main(_fit(data, tmp_path / "a", "--checkpoint", ckpt)) == 0
    capsys.readouterr()
    _fails(capsys, _fit(data, tmp_path / "b", "--checkpoint", ckpt, epochs=1),
           "already holds 2 epochs", "--epochs")
    _fails(capsys, _fit(data, tmp_path / "c", "--checkpoint", ckpt, "--max-time", "1e-9",
                        epochs=4), "past the budget")
    with caplog.at_level("INFO", logger="gpscale.fit"):
        assert main(_fit(data, tmp_path / "d", "--checkpoint", ckpt, epochs=4)) == 0
    assert f"resumed at epoch 3 from {ckpt} (2 epochs" in caplog.text
    assert json.loads((tmp_path / "d" / "metrics.json").read_text())["epochs"] == 4


@pytest.mark.parametrize(("name", "value"), [("GPSCALE_THREADS", "abc"),
                                             ("GPSCALE_THREADS", "0"),
                                             ("GPSCALE_DIST_TIMEOUT", "abc"),
                                             ("GPSCALE_DIST_TIMEOUT", "nan")])
def test_environment_variables_are_checked_by_name(run, tmp_path, capsys, monkeypatch, name,
                                                   value):
    _, data, _ = run
    monkeypatch.setenv(name, value)
    _fails(capsys, _fit(data, tmp_path / "o"), f"environment variable {name}", repr(value))


@pytest.mark.parametrize("lr", ["inf", "nan", "-1", "0"])
def test_learning_rate_must_be_finite_and_positive(run, tmp_path, capsys, lr):
    _, data, _ = run
    _fails(capsys, _fit(data, tmp_path / "o", f"--lr={lr}"), "lr must be a finite positive")


def test_cache_dir_of_an_unknown_user(capsys):
    _fails(capsys, ["datasets", "download", "yacht", "--cache-dir", "~nosuchuser0x/x"],
           "--cache-dir", "no home folder for nosuchuser0x")


def test_nproc_with_a_method_without_a_parallel_path_is_one_line(run, tmp_path, capsys):
    _, data, _ = run
    _fails(capsys, _fit(data, tmp_path / "o", "--nproc", "2"), "no data-parallel path")


def test_keyboard_interrupt_in_predict_leaves_out_as_it_was(run, tmp_path, capsys,
                                                            monkeypatch):
    _, data, model_path = run
    out = tmp_path / "p.csv"
    out.write_text("earlier")

    def interrupted(*args, **kwargs):
        yield from ()
        raise KeyboardInterrupt

    monkeypatch.setattr("gpscale.cli.predict.predict_csv_chunks", interrupted)
    code = main(["predict", "--model", str(model_path), "--data", str(data), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err and "interrupted" in err
    assert out.read_text() == "earlier" and sorted(os.listdir(tmp_path)) == ["p.csv"]


def _start_fit(data: Path, out: Path, ckpt: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "gpscale.cli", "fit", "--data", str(data), "--target", "y",
            "--method", "svgp", "--batch-size", "8", "--epochs", "100000", "--max-time", "120",
            "--out", str(out), "--checkpoint", str(ckpt), "--no-progress"]
    return subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)


def test_ctrl_c_stops_after_the_step_and_saves_what_was_trained(run, tmp_path):
    _, data, _ = run
    out, ckpt = tmp_path / "run", tmp_path / "c.pt"
    proc = _start_fit(data, out, ckpt)
    _wait_for(ckpt, proc)  # an epoch has finished
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    done = [line for line in stderr.splitlines() if line.startswith("gpscale fit: interrupted")]
    assert len(done) == 1 and "stopped: interrupted" in done[0] and str(ckpt) in done[0]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stopped"] == "interrupted" and metrics["epochs"] >= 1
    assert json.loads(stdout)["stopped"] == "interrupted"
    gpscale.load(out / "model.pt")


@contextlib.contextmanager
def _released(fifo: Path, seconds: float = 10.0):
    """A command blocked on ``fifo`` is released (a writer opens and closes it), so that a
    reader which does block fails the test on its message instead of hanging it."""
    done = threading.Event()

    def release():
        deadline = time.monotonic() + seconds
        while not done.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):  # ENXIO until a reader has it open
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            time.sleep(0.05)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_as_model_or_data_is_one_line_not_a_hang(run, tmp_path, capsys):
    """Probe finding: a FIFO as --model or --data blocked `gpscale predict` until killed."""
    _, data, model_path = run
    fifo_model, fifo_data = tmp_path / "m.pt", tmp_path / "d.csv"
    os.mkfifo(fifo_model)
    os.mkfifo(fifo_data)
    for argv, fifo in (
            (["predict", "--model", str(fifo_model), "--data", str(data)], fifo_model),
            (["predict", "--model", str(model_path), "--data", str(fifo_data)], fifo_data),
            (["convert", str(fifo_model), str(tmp_path / "new.pt"), "--trust"], fifo_model)):
        with _released(fifo):
            _fails(capsys, argv, str(fifo), "is a named pipe (FIFO), not a regular file")
    assert not (tmp_path / "new.pt").exists()


def test_a_named_pipe_as_fit_data_is_named_as_one(tmp_path, capsys):
    """A FIFO as `fit --data` was called "no such file"; the reader now says what it is."""
    fifo = tmp_path / "d.csv"
    os.mkfifo(fifo)
    with _released(fifo):
        _fails(capsys, ["fit", "--data", str(fifo), "--target", "y", "--out",
                        str(tmp_path / "out")], str(fifo),
               "is a named pipe (FIFO), not a regular file")


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null here")
def test_a_device_as_model_or_data_is_refused_before_it_is_read(run, tmp_path, capsys):
    """Probe finding: /dev/zero as --model, convert --trust input or --data was read until
    memory ran out; a device is now refused by its type (/dev/null: it ends at once, so a
    reader that reads devices fails here rather than filling memory)."""
    _, data, model_path = run
    for name in ("dev.pt", "dev.csv"):
        (tmp_path / name).symlink_to("/dev/null")
    for argv in (["predict", "--model", str(tmp_path / "dev.pt"), "--data", str(data)],
                 ["predict", "--model", str(model_path), "--data", str(tmp_path / "dev.csv")],
                 ["convert", str(tmp_path / "dev.pt"), str(tmp_path / "new.pt"), "--trust"]):
        _fails(capsys, argv, str(tmp_path / "dev."), "is a character device, not a regular file")


def _edited(model_path: Path, out: Path, change) -> Path:
    payload = gpscale.io.read_file(model_path, ("method",))
    for key in ("format", "version", "kind", "sha256"):
        payload.pop(key, None)
    change(payload)
    return gpscale.io.write_file(out, "method", payload)


@pytest.mark.parametrize(("change", "field"), [
    (lambda p: p["model"]["state_dict"]["likelihood.noise_covar.raw_noise"].fill_(float("nan")),
     "its parameter 'likelihood.noise_covar.raw_noise' holds NaN or inf"),
    (lambda p: p["model"].update(data="abc"), "its field 'model.data' holds a str"),
    (lambda p: p.update(transform=[1, 2]), "its field 'transform' holds a list"),
    (lambda p: p.update(info="abc"), "its field 'info' holds a str"),
    (lambda p: p["info"].update(feature_names=5), "its field 'info.feature_names' holds an int"),
], ids=["nan-parameter", "data", "transform", "info", "feature-names"])
def test_a_checksum_valid_model_with_a_bad_field_is_one_line_naming_it(run, tmp_path, capsys,
                                                                       change, field):
    """Probe finding: such files loaded, then `predict` ended in a traceback (a NaN
    parameter's NumericalError escaped main)."""
    _, data, model_path = run
    bad = _edited(model_path, tmp_path / "bad.pt", change)
    _fails(capsys, ["predict", "--model", str(bad), "--data", str(data)], str(bad), field)
