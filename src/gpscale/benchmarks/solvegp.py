"""Suite ``solvegp``: SOLVE-GP against GPyTorch's SVGP (paper 004, Tables 2, 6, 7; notes §3.4).

The paper's regression comparison at this machine's scale: Elevators, Bike, Kin40k, Protein and
KEGGu (``keggundirected``), split 0, SOLVE-GP with M + M2 = 256 + 256 inducing points against
SVGP with 256, 384 and 512 (the paper: 1024 + 1024 against 1024, 1536 and 2048), all trained by
``runner.run`` in one process with the same data, kernel (Matérn-3/2, ARD, like ``peers``),
optimiser (Adam, lr 0.01, batch 1024, float32, as App. G) and budget: ``EPOCHS`` epochs (the
paper: 100) capped at ``MAX_TIME`` seconds of training per run, sized for a 2-core CPU so that
the whole suite takes about 40 minutes. Reported per run: test NLL (= −test log-likelihood per
point, standardised targets), RMSE, epochs done, time per epoch and per iteration (one minibatch
step), and the time per iteration as a fraction of SVGP(2M)'s on the same dataset.

Classification: MNIST (8,000 train / 2,000 test, 784 pixels, 10 classes), softmax likelihood
with 10 independent latent GPs for both methods: SOLVE-GP (``MNIST_M`` + ``MNIST_M``) against
SVGP (``MNIST_M``) and SVGP (2 ``MNIST_M``); test accuracy and NLL. M is smaller than for
regression because each step costs 10 latent GPs on 784-dimensional inputs.

Convolutional (``--datasets mnist-conv``, §4, Table 1's comparison on MNIST): ``conv-solvegp``
with ``CONV_M`` + ``CONV_M`` inducing patches against ``conv-svgp`` with ``CONV_M`` and
2 ``CONV_M``, each with the keys' defaults (TICK, 5 × 5 patches at stride 2, robust-max, batch
64, lr 0.01) for ``CONV_EPOCHS`` epochs and no time cap, so that the three take the same
iterations; test accuracy and NLL, and the time per iteration against conv-SVGP (2M)'s.
``--datasets mnist-deep``: the same three as two-layer deep convolutional GPs (``layers=2``:
a hidden layer of ``DEEP_HIDDEN_M`` (+ ``DEEP_HIDDEN_M``) inducing patches, twice as many for
the double SVGP, as Table 5 doubles every layer), also ``CONV_EPOCHS`` epochs each.

``quick=True``: Elevators with tiny M (16 + 16 against 16, 24, 32) and MNIST (8 + 8 against 8,
16), one epoch each, and the convolutional rows with 4 + 4 patches on 256 images: a smoke test of
the whole pipeline in about a minute.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from gpscale import run as runner
from gpscale.report import write_results
from gpscale.run import RunSpec

__all__ = ["run", "REGRESSION", "CLASSIFICATION", "CONV", "EPOCHS", "MAX_TIME", "MNIST_EPOCHS",
           "MNIST_MAX_TIME"]

log = logging.getLogger("gpscale.benchmarks")

REGRESSION = ("elevators", "bike", "kin40k", "protein", "keggundirected")
CLASSIFICATION = ("mnist",)
CONV = ("mnist-conv", "mnist-deep")
"""The convolutional rows: MNIST through ``conv-solvegp`` / ``conv-svgp``, one layer or two."""
DEEP_HIDDEN_M = 128
CONV_M = 384
CONV_EPOCHS = 3
EPOCHS = 20
"""Epochs per regression run (the paper trains 100; at batch 1024 this is 200–1000 steps)."""
MAX_TIME = 100.0
"""Wall-clock cap (seconds of training, evaluation excluded) per regression run."""
MNIST_EPOCHS = 20
MNIST_MAX_TIME = 150.0
M = 256
MNIST_M = 128
BATCH_SIZE = 1024
LR = 0.01
CONV_BATCH_SIZE = 64
"""The convolutional keys' default batch (their runs take the keys' defaults)."""
COLUMNS = ("dataset", "method", "num_inducing", "num_orthogonal", "n_train", "epochs",
           "train_time_s", "time_per_epoch_s", "time_per_iter_s", "iter_time_vs_svgp_2m",
           "test_nll", "test_rmse", "test_accuracy", "stopped")


def _variants(m: int) -> tuple[tuple[str, str, dict[str, int]], ...]:
    """(label, method key, options): SOLVE-GP (m + m), SVGP (m), SVGP (1.5 m), SVGP (2 m)."""
    return (
        (f"SOLVE-GP {m}+{m}", "solvegp", {"num_inducing": m, "num_orthogonal": m}),
        (f"SVGP {m}", "svgp", {"num_inducing": m}),
        (f"SVGP {3 * m // 2}", "svgp", {"num_inducing": 3 * m // 2}),
        (f"SVGP {2 * m}", "svgp", {"num_inducing": 2 * m}),
    )


def _conv_plan(quick: bool, dataset: str):
    """The convolutional rows: (dataset, label, key, options, overrides)."""
    m = 4 if quick else CONV_M
    overrides = {"epochs": 1 if quick else CONV_EPOCHS, "max_time": None}
    if quick:
        overrides["dataset_options"] = {"num_train": 256, "num_test": 128}
    variants = ((f"conv-SOLVE-GP {m}+{m}", "conv-solvegp",
                 {"num_inducing": m, "num_orthogonal": m}),
                (f"conv-SVGP {m}", "conv-svgp", {"num_inducing": m}),
                (f"conv-SVGP {2 * m}", "conv-svgp", {"num_inducing": 2 * m}))
    if dataset == "mnist-deep":
        h = 4 if quick else DEEP_HIDDEN_M
        hidden = ({"hidden_inducing": h, "hidden_orthogonal": h}, {"hidden_inducing": h},
                  {"hidden_inducing": 2 * h})
        variants = tuple((f"2-layer {label} (hidden {extra['hidden_inducing']}"
                          + (f"+{h})" if "hidden_orthogonal" in extra else ")"),
                          key, {**options, **extra, "layers": 2})
                         for (label, key, options), extra in zip(variants, hidden, strict=True))
    for label, key, options in variants:
        yield dataset, label, key, options, overrides


def _plan(quick: bool, datasets: tuple[str, ...] | None):
    """(dataset, label, key, options, overrides) for every run."""
    known = REGRESSION + CLASSIFICATION + CONV
    datasets = datasets or (("elevators", "mnist", "mnist-conv") if quick else known)
    unknown = set(datasets) - set(known)
    if unknown:
        raise ValueError(f"solvegp runs on {', '.join(known)}; got {sorted(unknown)}")
    for dataset in datasets:
        if dataset in CONV:
            yield from _conv_plan(quick, dataset)
            continue
        mnist = dataset in CLASSIFICATION
        m = (8 if mnist else 16) if quick else (MNIST_M if mnist else M)
        variants = _variants(m)
        if mnist:  # SOLVE-GP, SVGP(M) and SVGP(2M) only: each MNIST run is expensive
            variants = variants[:2] + variants[3:]
        epochs = 1 if quick else (MNIST_EPOCHS if mnist else EPOCHS)
        max_time = None if quick else (MNIST_MAX_TIME if mnist else MAX_TIME)
        overrides = {"epochs": epochs, "max_time": max_time}
        for label, key, options in variants:
            yield dataset, label, key, options, overrides


def run(out_dir: Path, *, quick: bool = False,
        datasets: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Run every (dataset, method) of the plan (or only ``datasets``); report into ``out_dir``."""
    rows = []
    for dataset, label, key, options, overrides in _plan(quick, datasets):
        log.info("solvegp: %s on %s", label, dataset)
        if dataset in CONV:  # the keys' own defaults, equal epochs
            spec = RunSpec(method=key, dataset="mnist", split=0, seed=0, options=options,
                           eval_every=0, progress=False, **overrides)
        else:
            spec = RunSpec(preset="paper", method=key, dataset=dataset, split=0, seed=0,
                           options={"kernel": "matern32", "ard": True, **options},
                           batch_size=BATCH_SIZE, lr=LR, optimizer="adam", dtype="float32",
                           eval_every=0, progress=False, **overrides)
        row = _row(runner.run_metrics(spec), label, options,
                   spec.batch_size or CONV_BATCH_SIZE)  # failures give a row
        rows.append({**row, "dataset": dataset})
        _report(out_dir, rows)  # after every run: a later crash loses nothing
    return rows


def _report(out_dir: Path, rows: list[dict[str, Any]]) -> None:
    _add_time_ratios(rows)
    notes = (f"Split 0, Adam lr {LR}, batch {BATCH_SIZE}, float32, Matérn-3/2 ARD. Each "
             f"regression run trains {EPOCHS} epochs or {MAX_TIME:.0f} s, whichever ends first "
             f"(MNIST: {MNIST_EPOCHS} epochs or {MNIST_MAX_TIME:.0f} s); quick runs 1 epoch. "
             "test_nll is the negative test log-likelihood per point on standardised targets "
             "(paper's test LL = −test_nll). time_per_iter_s = training time / minibatch steps; "
             "iter_time_vs_svgp_2m divides it by SVGP(2M)'s on the same dataset. "
             f"mnist-conv: the convolutional keys' defaults (batch {CONV_BATCH_SIZE}), "
             f"{CONV_EPOCHS} epochs each; mnist-deep: the same as two-layer deep GPs.")
    write_results(out_dir, "solvegp", rows, columns=COLUMNS, notes=notes)


def _row(metrics: dict[str, Any], label: str, options: dict[str, int],
         batch_size: int) -> dict[str, Any]:
    per_iter = None
    if "train_time_s" in metrics:  # not for a failed run
        steps = metrics["epochs"] * math.ceil(metrics["n_train"] / batch_size)
        per_iter = metrics["train_time_s"] / max(steps, 1)
    return {**{k: metrics.get(k) for k in COLUMNS}, "method": label,
            "num_inducing": options["num_inducing"],
            "num_orthogonal": options.get("num_orthogonal", 0), "time_per_iter_s": per_iter}


def _add_time_ratios(rows: list[dict[str, Any]]) -> None:
    """iter_time_vs_svgp_2m: time per iteration over that of the largest SVGP on the dataset."""
    for row in rows:
        svgps = [r for r in rows if r["dataset"] == row["dataset"] and r["num_orthogonal"] == 0]
        if not svgps:
            continue
        ref = max(svgps, key=lambda r: r["num_inducing"])["time_per_iter_s"]
        own = row["time_per_iter_s"]
        row["iter_time_vs_svgp_2m"] = own / ref if ref and own is not None else None
