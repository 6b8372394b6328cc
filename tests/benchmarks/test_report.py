"""Benchmark report writing and the peak-memory helper."""

from __future__ import annotations

import csv
import json
import multiprocessing as mp
import signal
import sys
import time
from pathlib import Path

import pytest

from gpscale.benchmarks.memory import peak_memory_mb
from gpscale.report import markdown_table, write_results


def _allocate(mb: int) -> int:
    import torch

    t = torch.ones(mb * 2**20 // 8, dtype=torch.float64)
    return int(t.numel())


def test_markdown_table_formats_numbers():
    table = markdown_table([{"a": 1, "b": 0.123456}, {"a": 2, "b": 12345678.0}])
    lines = table.splitlines()
    assert lines[0] == "| a | b |"
    assert lines[2] == "| 1 | 0.1235 |"
    assert lines[3] == "| 2 | 1.23e+07 |"


def test_write_results_files(tmp_path):
    rows = [{"method": "x", "rmse": 0.5}, {"method": "y", "rmse": 0.25}]
    report = write_results(tmp_path, "demo", rows, notes="hello")
    assert [r["rmse"] for r in csv.DictReader(open(tmp_path / "results.csv"))] == ["0.5", "0.25"]
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["suite"] == "demo"
    text = report.read_text()
    assert "| y | 0.25 |" in text and "hello" in text and "machine:" in text


def test_peak_memory_sees_an_allocation():
    """A 200 MB tensor allocated in the child shows up as ≥ 190 MB of peak growth."""
    mb, result = peak_memory_mb(_allocate, 200)
    assert result == 200 * 2**20 // 8
    assert 190 <= mb < 400


def test_peak_memory_reports_child_errors():
    with pytest.raises(RuntimeError, match="ValueError"):
        peak_memory_mb(_fail)


def _fail():
    raise ValueError("boom")


def test_peak_memory_reports_a_killed_child_instead_of_hanging():
    """A child that dies without answering (as under the OOM killer) raises with its exit code."""
    with pytest.raises(RuntimeError, match="exit code -9"):
        peak_memory_mb(_killed)


def _killed():
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def _ignores_sigint(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT (Linux: the ``SigIgn`` mask in its status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1],
               16)
    return bool(mask & (1 << (signal.SIGINT - 1)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_child_which_ignores_it():
    """Ctrl-C reaches the whole process group: the measuring child ignores it (no traceback of
    its own) and the interrupted parent stops it before the ``KeyboardInterrupt`` leaves, so
    nothing is left for the exit handlers to wait for (where a second Ctrl-C gave a traceback)."""
    seen = {}

    def ctrl_c(signum, frame):
        (child,) = mp.active_children()
        seen["ignores"] = _ignores_sigint(child.pid)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            peak_memory_mb(time.sleep, 120)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert seen["ignores"]
    assert mp.active_children() == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
