"""Benchmark suites by name: ``gpscale bench SUITE`` runs ``SUITES[SUITE]``.

A suite's ``run(out_dir, quick=...)`` trains and measures, writes ``results.csv``,
``results.jsonl``, ``report.md`` (and PNG plots where it has them) into ``out_dir``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Suite", "SUITES", "run_suite"]


@dataclass(frozen=True)
class Suite:
    """A named benchmark: ``module`` provides ``run(out_dir, *, quick=False)``."""

    name: str
    module: str
    summary: str

    def runner(self) -> Callable[..., object]:
        return importlib.import_module(self.module).run


SUITES: dict[str, Suite] = {
    s.name: s for s in [
        Suite("peers", "gpscale.benchmarks.peers",
              "GPyTorch exact/SGPR/SVGP on Parkinsons, Elevators, Bike, Protein (split 0)"),
        Suite("kernels", "gpscale.benchmarks.kernels",
              "matrix-free kernel-product throughput vs GEMM roofline; peak memory at n=40k"),
        Suite("cagp", "gpscale.benchmarks.cagp",
              "CaGP paper Table 1 at CPU scale: CaGP-Opt vs SGPR/SVGP (m=1024); memory vs n"),
        Suite("iterncgp", "gpscale.benchmarks.iterncgp",
              "IterNCGP vs SoD-Laplace and SVGP: 10-class mixture (N=20k), MNIST 8k, Poisson "
              "schedules and kernel learning over 20 draws, memory at N*C=1e6 (parts: "
              "mixture, mnist, poisson, poisson-learning, memory)"),
        Suite("ski", "gpscale.benchmarks.ski",
              "GGP vs SKI per-iteration time and memory, n = 1e4..1e7 (paper 002 Table 1)"),
        Suite("solvegp", "gpscale.benchmarks.solvegp",
              "SOLVE-GP 256+256 vs SVGP 256/384/512 on Elevators, Bike, Kin40k, Protein, KEGGu; "
              "MNIST softmax (paper 004)"),
        Suite("defaults", "gpscale.benchmarks.defaults",
              "every method with no options (what gpscale fit gives a new user) on Parkinsons, "
              "Elevators, Bike, Protein, Kin40k; classification keys on gmm10 and MNIST"),
        Suite("auto", "gpscale.benchmarks.auto",
              "method auto (its race) against every key it races, each with its defaults, "
              "on the UCI sets beyond 2,000 rows and generated sets of 12, 128 and 3 inputs"),
        Suite("calibration", "gpscale.benchmarks.calibration",
              "95 % interval coverage and mean predictive std of every regression key with "
              "its defaults on generated sets of known noise (d = 1, 5) and Parkinsons, "
              "Elevators, Protein"),
        Suite("scale", "gpscale.benchmarks.scale",
              "load time, time per epoch, peak memory and prediction of 1e6 points for SVGP, "
              "SOLVE-GP, SoftKI and GGP at n = 1e5, 1e6, 2e6 (GGP also 1e8: --datasets n100m), "
              "CaGP-Opt at 4e4"),
        Suite("softki", "gpscale.benchmarks.softki",
              "SoftKI-512 vs SGPR-512, SVGP-1024/512 on Kin40k, Protein, Bike, Elevators, "
              "KEGGu (paper 003 Tables 1-2)"),
    ]
}


def run_suite(name: str, out_dir: str | Path, *, quick: bool = False,
              datasets: tuple[str, ...] | None = None,
              runs: tuple[str, ...] | None = None, device: str | None = None,
              max_time: float | None = None) -> Path:
    """Run suite ``name`` into ``out_dir``; returns the path of its ``report.md``.

    ``datasets`` restricts a suite that runs on several datasets to those named; ``runs``
    restricts a suite with labelled runs (``softki``) to those labels; ``max_time`` sets the
    training seconds of each run of a suite that takes it (``scale``).
    """
    if name not in SUITES:
        raise ValueError(f"unknown benchmark suite {name!r}; valid suites: "
                         f"{', '.join(SUITES)}")
    runner = SUITES[name].runner()
    if runs and "runs" not in inspect.signature(runner).parameters:
        raise ValueError(f"suite {name!r} has no labelled runs to choose from (--runs)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra = {"datasets": datasets} if datasets else {}
    if runs:
        extra["runs"] = runs
    if device not in (None, "cpu"):
        if "device" not in inspect.signature(runner).parameters:
            raise ValueError(f"suite {name!r} runs on the CPU only (--device); suites with "
                             "--device: kernels, scale")
        extra["device"] = device
    if max_time is not None:
        if "max_time" not in inspect.signature(runner).parameters:
            raise ValueError(f"suite {name!r} has no per-run time budget (--max-time); "
                             "suites with it: scale, calibration")
        if not max_time > 0:
            raise ValueError(f"--max-time must be a positive number of seconds; got {max_time}")
        extra["max_time"] = max_time
    runner(out, quick=quick, **extra)
    return out / "report.md"
