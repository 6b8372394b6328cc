"""Suite ``scale``: what each scalable method costs as n grows (issue #20).

Each row is one method on one size of a synthetic file, run as ``gpscale fit --data FILE --method
KEY`` runs it (the method's defaults, its printed time budget), in a fresh process so that the
peak memory is the run's own. The files are written once into ``OUT/data`` by
:func:`gpscale.data.writers.write_field`: the 8-D field (ℓ = 0.5, noise 0.04, Parquet) for SVGP,
SOLVE-GP and SoftKI, the 3-D field (``.npy``, memory-mapped) for GGP, and 40,000 rows of the 8-D
field for CaGP-Opt (its K(x*, X)S prediction holds X). Columns:

- ``inducing``: the inducing sets the run resolved (:func:`gpscale.devices.inducing_options`).
- ``load_s``: reading the file and splitting/standardising it (90 % train).
- ``epochs``, ``time_per_epoch_s``, ``train_time_s``, ``stopped``: training as the defaults run it.
- ``test_rmse`` on the held-out 10 % (standardised y) next to ``noise_floor``, the RMSE of the
  noise-free field (no method does better on average).
- ``peak_fit_mb``: peak RSS growth of load + training + test prediction.
- ``condition_s``, ``predict_1m_s``, ``peak_predict_mb``: the prediction state from the training
  data (``model.posterior``; SoftKI's streams over n, GGP's is the statistics pass and a solve),
  then 10⁶ fresh test points predicted in chunks, and that phase's peak RSS growth.

``--datasets`` picks sizes: ``n40k`` (CaGP-Opt), ``n100k``, ``n1m``, ``n2m`` (default: all four)
and ``n100m`` (GGP only, a 3.2 GB ``.npy``; on request); ``--runs`` picks method keys.
``--quick``: 20,000 rows, 10 s budgets; ``--max-time S``: S seconds of training per
run. ``--device cuda`` trains and predicts on the GPU
(``device`` names the card, ``peak_gpu_mb`` is torch's peak allocation there).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from gpscale.benchmarks.memory import current_rss_mb, peak_memory_mb, peak_rss_mb, reset_peak_rss
from gpscale.report import write_results

__all__ = ["run", "SIZES", "measure"]

log = logging.getLogger("gpscale.benchmarks")

SIZES = {"n40k": 40_000, "n100k": 100_000, "n1m": 1_000_000, "n2m": 2_000_000,
         "n100m": 100_000_000}
DEFAULT_SIZES = ("n40k", "n100k", "n1m", "n2m")
FIELD_8D = {"num_dims": 8, "noise": 0.04, "lengthscale": 0.5}
FIELD_3D = {"num_dims": 3, "noise": 0.01, "lengthscale": 0.2}
PREDICT_ROWS = 1_000_000
COLUMNS = ("size", "method", "device", "n_train", "num_dims", "inducing", "load_s", "epochs",
           "time_per_epoch_s", "train_time_s", "stopped", "test_rmse", "noise_floor", "test_nll",
           "peak_fit_mb", "condition_s", "predict_1m_s", "peak_predict_mb", "peak_gpu_mb")


def _plan(sizes: tuple[str, ...]):
    for size in sizes:
        if size == "n40k":
            yield size, "cagp-opt", FIELD_8D
        elif size == "n100m":
            yield size, "ggp", FIELD_3D
        else:
            for key in ("svgp", "solvegp", "softki"):
                yield size, key, FIELD_8D
            yield size, "ggp", FIELD_3D


def _file(out: Path, rows: int, field: dict[str, Any]) -> tuple[Path, float]:
    """The data file for ``rows`` rows of ``field`` (written once) and its noise floor."""
    from gpscale.data.writers import write_field

    ext = "npy" if field["num_dims"] == 3 else "parquet"
    path = out / "data" / f"field{field['num_dims']}d-{rows}.{ext}"
    floor_file = path.with_suffix(".floor")
    if not path.exists() or not floor_file.exists():
        log.info("scale: writing %s", path)
        table = write_field(path, rows, **field)
        floor_file.write_text(f"{table.noise_floor!r}\n")
    return path, float(floor_file.read_text())


def measure(path: str, method: str, field: dict[str, Any], *, max_time: float | None = None,
            predict_rows: int = PREDICT_ROWS, device: str | None = None) -> dict[str, Any]:
    """One row of the suite, in this process (call it through ``peak_memory_mb``); with a
    CUDA ``device`` the run trains and predicts there (``gpscale fit --device``)."""
    from gpscale import run as runner
    from gpscale.data.synthetic import FieldStream
    from gpscale.run import RunSpec

    target = "-1" if path.endswith(".npy") else "y"  # an .npy array has no column names
    spec = RunSpec(method=method, csv=path, target=target, progress=False, max_time=max_time,
                   device=device)
    reset_peak_rss()
    start = current_rss_mb()
    tic = time.perf_counter()
    data = runner.load_data(spec)
    load_s = time.perf_counter() - tic
    del data
    result = runner.run(spec)  # loads again: the figures below are of the run as fit runs it
    model, data, metrics = result.model, result.data, result.metrics
    peak_fit = peak_rss_mb() - start
    dtype, on = next((p.dtype, p.device) for p in model.parameters() if p.is_floating_point())
    x_new = FieldStream(n=predict_rows, seed=12_345, chunk_size=predict_rows,
                        **{k: field[k] for k in ("num_dims", "noise", "lengthscale")}).chunk(0)[0]
    x_new = data.transform.transform_x(x_new) if data.transform else x_new
    x_new = x_new.to(on, dtype)
    reset_peak_rss()
    before = current_rss_mb()
    with torch.no_grad():
        tic = time.perf_counter()
        state = model.posterior(data.x_train.to(on, dtype), data.y_train.to(on, dtype))
        _sync(on)
        condition_s = time.perf_counter() - tic
        tic = time.perf_counter()
        pred = model.predict(state, x_new)
        _sync(on)
        predict_s = time.perf_counter() - tic
    assert pred.mean.shape[0] == predict_rows and bool(torch.isfinite(pred.mean).all())
    sizes = [str(model.options[k]) for k in ("num_inducing", "num_orthogonal")
             if model.options.get(k)]  # as the run resolved them (a GPU's are larger)
    return {"n_train": data.num_train, "num_dims": data.num_dims, "load_s": load_s,
            "inducing": " + ".join(sizes) or None,
            **{k: metrics.get(k) for k in ("epochs", "time_per_epoch_s", "train_time_s",
                                           "stopped", "test_rmse", "test_nll")},
            "peak_fit_mb": peak_fit, "condition_s": condition_s, "predict_1m_s": predict_s,
            "peak_predict_mb": peak_rss_mb() - before,
            **({"device": torch.cuda.get_device_name(on),
                "peak_gpu_mb": torch.cuda.max_memory_allocated(on) / 2**20}
               if on.type == "cuda" else {})}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(out_dir: Path, *, quick: bool = False, datasets: tuple[str, ...] | None = None,
        runs: tuple[str, ...] | None = None, device: str | None = None,
        max_time: float | None = None) -> list[dict[str, Any]]:
    """Every (size, method) row of the plan (``runs``: only these method keys), each in a fresh
    process, on ``device`` (``None``: the CPU), trained for ``max_time`` seconds (``None``: the
    method's default budget; ``quick``: 10 s); report into ``out_dir``."""
    out = Path(out_dir)
    sizes = tuple(datasets or (("quick",) if quick else DEFAULT_SIZES))
    unknown = set(sizes) - set(SIZES) - ({"quick"} if quick else set())
    if unknown:
        raise ValueError(f"scale runs on sizes {', '.join(SIZES)}; got {sorted(unknown)}")
    notes = ("Each method with its defaults (gpscale fit --data FILE --method KEY) on synthetic "
             "fields written by gpscale.data.writers.write_field; peak memory is RSS growth "
             "in a fresh process (fit: from before loading; predict: from before conditioning). "
             + ("QUICK: 20,000 rows, 10 s budgets, 20,000 prediction points." if quick else ""))
    rows = []
    for size in sizes:
        plan = (_plan(("n100k",)) if size == "quick" else _plan((size,)))
        for _, method, field in plan:
            if runs and method not in runs:
                continue
            n = 20_000 if size == "quick" else SIZES[size]
            path, floor = _file(out, n, field)
            log.info("scale: %s on %s", method, path.name)
            try:
                _, row = peak_memory_mb(measure, str(path), method, field,
                                         max_time=10.0 if quick else max_time,
                                         predict_rows=20_000 if quick else PREDICT_ROWS,
                                         device=device)
            except RuntimeError as err:  # e.g. killed for memory: a result, the suite goes on
                row = {"stopped": f"failed: {err}"}
            rows.append({"size": size, "method": method, "noise_floor": floor, **row})
            write_results(out, "scale", rows, columns=COLUMNS, notes=notes)
    return rows
