"""Training history: one row per epoch (epoch, wall time, loss, learning rate, eval metrics)."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpscale.files import atomic_output, atomic_write
from gpscale.metrics import json_safe

__all__ = ["History"]


@dataclass
class History:
    """Rows recorded by ``training.fit``; ``stopped`` says why training ended.

    ``stopped`` is one of ``"epochs"`` (budget reached), ``"time"`` (wall-clock budget),
    ``"converged"`` (the loss stopped improving, see ``training.schedules``),
    ``"no-improvement"`` (the held-out score stopped improving, see
    ``training.validation``), ``"non-finite"``
    (the loss became NaN/inf), ``"numerical-error"``, ``"out-of-memory"``, ``"conditioned"``
    (nothing to train), ``"interrupted"`` (Ctrl-C under
    ``training.interrupt.graceful_interrupt``) or ``"running"``.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    stopped: str = "running"

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(dict(row))

    @property
    def epochs(self) -> int:
        return int(self.rows[-1]["epoch"]) if self.rows else 0

    @property
    def train_time(self) -> float:
        return float(self.rows[-1]["time_s"]) if self.rows else 0.0

    def column(self, key: str) -> list[Any]:
        return [r.get(key) for r in self.rows]

    def last(self, key: str) -> Any:
        """Most recent non-missing value of ``key`` (e.g. an eval metric), else ``None``."""
        for r in reversed(self.rows):
            if r.get(key) is not None:
                return r[key]
        return None

    def to_csv(self, path: str | Path) -> None:
        """Write the rows as CSV (atomically: the file appears complete or not at all)."""
        cols = list(dict.fromkeys(k for r in self.rows for k in r)) or ["epoch"]
        with atomic_output(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=cols)
            writer.writeheader()
            writer.writerows(self.rows)

    def to_json(self, path: str | Path) -> None:
        text = json.dumps(json_safe({"stopped": self.stopped, "rows": self.rows}), indent=1,
                          allow_nan=False)  # a NaN or inf value is written as null
        atomic_write(path, text.encode())

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows], "stopped": self.stopped}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> History:
        return cls(rows=[dict(r) for r in state["rows"]], stopped=state["stopped"])
