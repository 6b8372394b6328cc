"""The output of a set of runs — a benchmark suite's or ``gpscale demo``'s: ``results.csv`` (a row
per run), ``report.md`` (a markdown table), JSON lines.

Each row is a flat dict; rows of one suite share keys. The report carries the command, the machine
and the library version so that a table pasted into BENCHMARKS.md says how it was obtained.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["machine_description", "write_results", "markdown_table"]


def machine_description() -> str:
    """One line naming CPU count, torch threads, GPU (if any), torch and Python versions."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.machine()} {os.cpu_count()} CPU cores (torch threads "
            f"{torch.get_num_threads()}), {gpu}, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub markdown table of ``rows`` (missing cells are blank)."""
    if not rows:
        return "(no rows)\n"
    cols = list(columns or dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def write_results(out_dir: Path | str, suite: str, rows: Sequence[dict[str, Any]], *,
                  columns: Sequence[str] | None = None, notes: str = "") -> Path:
    """Write ``results.csv``, ``results.jsonl`` and ``report.md``; return the report path."""
    from gpscale import __version__

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cols = list(columns or dict.fromkeys(k for r in rows for k in r))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    with open(out / "results.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({**r, "suite": suite, "gpscale": __version__}, default=str) + "\n")
    command = "gpscale " + " ".join(sys.argv[1:]) if sys.argv and "gpscale" in sys.argv[0] else ""
    report = [f"# Benchmark `{suite}`", "", f"- machine: {machine_description()}",
              f"- gpscale {__version__}"]
    if command:
        report.append(f"- command: `{command}`")
    report += ["", markdown_table(rows, cols)]
    if notes:
        report += ["", notes]
    (out / "report.md").write_text("\n".join(report) + "\n")
    return out / "report.md"
