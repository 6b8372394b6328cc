"""``python -m gpscale`` runs the same command line as the ``gpscale`` script."""

from __future__ import annotations

import subprocess
import sys

from gpscale.cli.__main__ import main


def test_python_dash_m_gpscale_is_the_cli(capsys):
    done = subprocess.run([sys.executable, "-m", "gpscale", "methods"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert main(["methods"]) == 0
    assert done.stdout == capsys.readouterr().out
    assert "softki" in done.stdout and "cagp-opt" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "gpscale", "fit", "--method", "nope",
                          "--dataset", "elevators"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "nope" in bad.stderr
