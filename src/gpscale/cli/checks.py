"""What the ``gpscale`` command is given, checked before anything runs: its environment
variables (``GPSCALE_THREADS``, ``GPSCALE_DIST_TIMEOUT``, torchrun's ``WORLD_SIZE``; each error
names the variable) and the flag values of ``fit`` that argparse's types do not bound (each
error names the flag). Imports no torch at module level (see :mod:`gpscale.cli.__main__`)."""

from __future__ import annotations

import argparse
import logging
import math
import os
from typing import Any

__all__ = ["env_number", "env_threads", "check_fit_flags", "LearningRateFlag", "MAX_SEED"]

MAX_SEED = 2**63 - 1
"""The largest ``--seed`` or ``--split``: torch's generators take a seed below 2**64, and the
seeds derived from one (``seed + split``, ``seed + 7919``) must stay there."""


def env_number(name: str, default: Any, kind: type = int) -> Any:
    """Environment variable ``name`` as a positive ``kind``; ``ValueError`` naming it."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not value > 0 or (kind is float and not math.isfinite(value)):
        what = "an integer ≥ 1" if kind is int else "a positive number of seconds"
        raise ValueError(f"environment variable {name} must be {what}; got {raw!r}")
    return value


def env_threads() -> int | None:
    """``GPSCALE_THREADS``: torch's CPU threads (per process with ``--nproc``); ``None`` when
    unset. More than the CPUs this process may run on is lowered to that count with a warning:
    starting that many threads fails (torch crashes, pyarrow cannot launch its workers) and
    could never be faster."""
    threads = env_number("GPSCALE_THREADS", None)
    cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
    if threads is not None and threads > cpus:
        logging.getLogger("gpscale").warning(
            "GPSCALE_THREADS=%d is more than the %d CPUs this process may run on; using %d",
            threads, cpus, cpus)
        threads = cpus
    return threads


class LearningRateFlag(argparse.Action):
    """``fit --lr``: stored as given (a float); its help names the bound :func:`check_fit_flags`
    applies, read only when the help is shown: ``gpscale.training`` imports torch, which building
    the parser for ``gpscale --version`` or ``--help`` does without."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)

    @property
    def help(self) -> str:
        from gpscale.training.config import MAX_LR

        return f"initial learning rate, in (0, {MAX_LR:g}]; {self.help_tail}"

    @help.setter
    def help(self, tail: str) -> None:  # argparse's help=...: the text after the bound
        self.help_tail = tail


def check_fit_flags(args: argparse.Namespace) -> None:
    """Refuse ``fit`` flag values that would run to a meaningless result (``--lr 1e30``) or
    fail deep inside torch in its own words (``--seed 10**23``): one line naming the flag."""
    from gpscale.training.config import MAX_LR

    for flag, value in (("--seed", args.seed), ("--split", args.split)):
        if not 0 <= value <= MAX_SEED:
            raise ValueError(f"{flag} must be an integer in 0..2**63-1; got {value}")
    if args.lr is not None and not (math.isfinite(args.lr) and 0 < args.lr <= MAX_LR):
        raise ValueError(f"--lr must be a finite positive number, at most {MAX_LR:g}; got "
                         f"{args.lr:g}")
