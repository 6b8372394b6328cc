"""Learning-curve plots shared by the benchmark suites (matplotlib's Agg canvas, no display).

A *curve* is a labelled list of history rows (dicts as recorded by ``training.fit`` plus the
``Evaluate`` callback's ``test_*`` entries); :func:`plot_curves` draws one panel per metric
against training time, skipping rows where the metric was not evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_curves", "curve_rows", "write_curves_csv"]


def curve_rows(label: Mapping[str, Any], history_rows: Sequence[Mapping[str, Any]],
               metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Flat rows ``{**label, epoch, time_s, metric...}`` for every evaluated history row."""
    rows = []
    for row in history_rows:
        if all(row.get(m) is None for m in metrics):
            continue
        rows.append({**label, "epoch": row.get("epoch"), "time_s": row.get("time_s"),
                     **{m: row.get(m) for m in metrics}})
    return rows


def write_curves_csv(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Curve rows as CSV, columns the union of the rows' keys in first-seen order."""
    import csv

    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def plot_curves(curves: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, *,
                metrics: Sequence[str], title: str = "", x: str = "time_s",
                log_x: bool = False) -> Path:
    """One panel per metric, one line per curve; x defaults to training seconds.

    Args:
        curves: label -> rows with ``x`` and the metrics (``None`` entries are skipped).
        path: PNG to write.
        metrics: keys to plot, one panel each.
        title: figure title.
        x: key of the horizontal axis.
        log_x: logarithmic horizontal axis.

    Returns:
        ``path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(metrics), 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics, strict=True):
        for label, rows in curves.items():
            points = [(r[x], r[metric]) for r in rows
                      if r.get(metric) is not None and r.get(x) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="." if len(points) < 30 else None, label=label)
        ax.set_xlabel("training time (s)" if x == "time_s" else x)
        ax.set_ylabel(metric)
        if log_x:
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
