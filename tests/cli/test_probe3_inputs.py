"""Findings of the third outside probe through the command line: a target that is not class
labels, flag and option values out of range, Ctrl-C at start-up and SIGTERM during ``fit`` are
each one line and a non-zero exit code, never a traceback or a silently wrong result.

In-process ``gpscale.cli.__main__.main`` on small data (2 epochs); the signal tests run the
command in a child process, as a terminal or a job scheduler would.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from gpscale.cli.__main__ import main

N = 60


def _write(path, header: str, columns: list[np.ndarray]) -> str:
    rows = np.column_stack(columns)
    path.write_text(header + "\n" + "\n".join(",".join(repr(float(v)) for v in row)
                                              for row in rows) + "\n")
    return str(path)


def _regression_file(tmp_path) -> str:
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(N, 2))
    y = np.sin(4 * x[:, 0]) + x[:, 1] + 0.1 * rng.normal(size=N)
    return _write(tmp_path / "d.csv", "a,b,y", [x, y])


def _fit(data, out, *extra, method="exact"):
    return ["fit", "--data", data, "--target", "y", "--method", method, "--epochs", "2",
            "--out", str(out), "--no-progress", *map(str, extra)]


def _fails(capsys, argv, *needles: str) -> str:
    """Exit code 2 and exactly one error line naming every needle; no traceback."""
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith(f"gpscale {argv[0]}: ")]
    assert code == 2 and len(errors) == 1, err
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# -- --task classification on a target that is not class labels ---------------------------------

def test_classification_of_a_continuous_target_is_refused(tmp_path, capsys):
    """A continuous target is refused as GPClassifier refuses it, not trained as one class per
    distinct value; nothing is written."""
    data = _regression_file(tmp_path)
    _fails(capsys, _fit(data, tmp_path / "run", "--task", "classification", method="svgp"),
           "d.csv: the target column 'y' holds numbers with a fractional part",
           "a continuous target, not class labels", "--task regression")
    assert not (tmp_path / "run" / "model.pt").exists()


def test_classification_of_an_identifier_column_is_refused(tmp_path, capsys):
    """Integers that are all distinct (an identifier, a count) are not class labels either."""
    x = np.random.default_rng(0).uniform(size=(N, 2))
    data = _write(tmp_path / "ids.csv", "a,b,y", [x, np.arange(N)])
    _fails(capsys, _fit(data, tmp_path / "run", "--task", "classification", method="svgp"),
           "ids.csv: the target column 'y' has 60 distinct values in 60 rows",
           "fewer than 2 rows per class")


# -- flag and option values ---------------------------------------------------------------------

def test_num_inducing_none_is_the_documented_default(tmp_path, capsys):
    """``-o num_inducing=none`` (declared "int or none") plans and trains like leaving it out."""
    data = _regression_file(tmp_path)
    code = main(_fit(data, tmp_path / "run", "-o", "num_inducing=none", method="svgp"))
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["n_train"] == 54


@pytest.mark.parametrize("lr", ["1e30", "inf", "nan", "0", "-0.1", "10.5"])
def test_a_learning_rate_out_of_range_is_refused(tmp_path, capsys, lr):
    data = _regression_file(tmp_path)
    _fails(capsys, _fit(data, tmp_path / "run", "--lr", lr, method="svgp"),
           "--lr must be a finite positive number, at most 10; got")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag, value", [("--seed", 10**23), ("--seed", -1),
                                         ("--split", 2**64)])
def test_a_seed_out_of_range_is_refused(tmp_path, capsys, flag, value):
    data = _regression_file(tmp_path)
    _fails(capsys, _fit(data, tmp_path / "run", flag, value),
           f"{flag} must be an integer in 0..2**63-1; got {value}")


def test_the_largest_seed_trains(tmp_path, capsys):
    data = _regression_file(tmp_path)
    code = main(_fit(data, tmp_path / "run", "--seed", 2**63 - 1, "--split", 2**63 - 1))
    assert code == 0, capsys.readouterr().err


def test_cholesky_jitter_is_refused_as_declared(tmp_path, capsys):
    """The declaration (``gpscale methods exact``) and the check agree: jitter 0 is outside
    "> 0", refused by the option check that names the option."""
    assert main(["methods", "exact"]) == 0
    declared = next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("cholesky_jitter_double"))
    assert declared.split()[1:4] == ["float", ">", "0"]
    data = _regression_file(tmp_path)
    _fails(capsys, _fit(data, tmp_path / "run", "-o", "cholesky_jitter_double=0"),
           "option cholesky_jitter_double=0.0 is invalid: must be > 0")


def test_more_threads_than_cpus_are_lowered_with_a_warning(monkeypatch, capsys, caplog):
    """``GPSCALE_THREADS`` above the CPUs (torch crashed starting them) runs on every CPU."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setenv("GPSCALE_THREADS", "100000")
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.WARNING, logger="gpscale"):
            assert main(["methods", "exact"]) == 0
        assert torch.get_num_threads() == cpus
    finally:
        torch.set_num_threads(before)
    assert f"GPSCALE_THREADS=100000 is more than the {cpus} CPUs" in caplog.text


# -- signals --------------------------------------------------------------------------------------

def _python(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_the_command_module_imports_no_torch():
    """The console script imports ``gpscale.cli.__main__`` before ``main`` runs: torch (seconds
    to import) loads inside ``main``, where a Ctrl-C is caught."""
    done = _python("""
        import sys
        import gpscale.cli.__main__
        print(sorted(m for m in ("torch", "numpy", "gpytorch") if m in sys.modules))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_ctrl_c_while_torch_loads_is_one_line():
    """SIGINT while ``main`` imports torch: exit code 130, one line, no traceback."""
    done = _python("""
        import os, signal, sys
        from gpscale.cli.__main__ import main

        class CtrlC:  # the terminal's Ctrl-C arrives as torch starts to load
            def find_spec(self, name, path=None, target=None):
                if name == "torch":
                    os.kill(os.getpid(), signal.SIGINT)
                return None

        sys.meta_path.insert(0, CtrlC())
        sys.exit(main(["methods"]))
    """)
    assert done.returncode == 130, done.stderr
    lines = done.stderr.strip().splitlines()  # torch loads once the command has started
    assert lines == ["gpscale methods: interrupted (Ctrl-C); stopped without writing more"]


def test_a_second_ctrl_c_while_exiting_is_silent():
    """After Ctrl-C is reported, another one while the process exits (its exit handlers join
    child processes, as ``gpscale bench kernels`` did) ends it with the same code, silently."""
    done = _python("""
        import atexit, os, signal, sys, time
        import gpscale.cli.__main__ as cli

        def interrupted(args):
            raise KeyboardInterrupt

        def joining_a_child():  # the second Ctrl-C arrives while an exit handler waits
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)

        cli.COMMANDS["methods"] = interrupted
        atexit.register(joining_a_child)
        sys.argv = ["gpscale", "methods"]
        sys.exit(cli.main())
    """)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == [
        "gpscale methods: interrupted (Ctrl-C); stopped without writing more"]


def test_sigterm_stops_fit_like_ctrl_c(tmp_path):
    """SIGTERM during training: the run stops after its step, writes its metrics and model
    (``stopped: interrupted``) and exits 143, as Ctrl-C does with 130."""
    data = _regression_file(tmp_path)
    out = tmp_path / "run"
    done = _python("""
        import importlib, os, signal, sys
        from gpscale.cli.__main__ import main

        loop = importlib.import_module("gpscale.training.fit")  # the module, not the function

        step = loop._step

        def terminated_step(*args, **kwargs):  # SIGTERM arrives during the first step
            if not getattr(terminated_step, "sent", False):
                terminated_step.sent = True
                os.kill(os.getpid(), signal.SIGTERM)
            return step(*args, **kwargs)

        loop._step = terminated_step
        sys.exit(main(sys.argv[1:]))
    """, "fit", "--data", data, "--target", "y", "--method", "svgp", "--epochs", "50",
                   "--batch-size", "8", "--out", str(out), "--no-progress")
    assert done.returncode == 143, done.stderr
    assert "Traceback" not in done.stderr
    assert "gpscale fit: terminated (SIGTERM) after epoch 1" in done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stopped"] == "interrupted" and metrics["epochs"] == 1
    assert (out / "model.pt").is_file()

