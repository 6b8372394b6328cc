"""``gpscale`` command line: demo | fit | predict | convert | bench | datasets | methods.

This module only parses flags into dataclasses and calls the layers below; it is also the one
place that reads environment variables (``GPSCALE_DATA`` is read by ``gpscale.data.search_path``,
``GPSCALE_THREADS`` and ``GPSCALE_DIST_TIMEOUT`` here, each checked with its name). Where the
commands may write is checked first (:mod:`gpscale.cli.outputs`). Ctrl-C during ``fit`` stops
after the current training step, saves what was trained with ``stopped: interrupted`` and exits
130; a second Ctrl-C, or one in any other command, exits 130 at once with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["main", "build_parser"]


def _option(text: str) -> tuple[str, str]:
    """Parse a method option ``key=value``; the value stays text, typed by the method's
    declaration (``gpscale methods KEY``)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip().replace("-", "_"), raw


def _data_option(text: str) -> tuple[str, Any]:
    """Parse a dataset option ``key=value`` with the value read as JSON when it parses."""
    key, raw = _option(text)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.replace("-", "_"), value


def _add_fit_flags(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="dataset name (see `gpscale datasets`)")
    src.add_argument("--data", help="a CSV file of your own (with --target)")
    p.add_argument("--target", help="target column of --data: a header name or an index")
    p.add_argument("--task", default="regression",
                   choices=["regression", "classification", "counts"], help="task of --data")
    p.add_argument("--method", default="auto",
                   help="method key (`gpscale methods` lists them, `gpscale methods KEY` its "
                   "options and training defaults); default auto: chosen from the task, n, d "
                   "and memory, with the reason printed (README: which method when)")
    method_default = "default: the method's (see `gpscale methods KEY`)"
    p.add_argument("--epochs", type=int, help=f"most training epochs; {method_default}")
    p.add_argument("--lr", type=float, help=f"initial learning rate; {method_default}")
    p.add_argument("--batch-size", type=int,
                   help=f"minibatch size (a size ≥ n trains full batch); {method_default}")
    p.add_argument("--optimizer", choices=["adam", "lbfgs"], help=method_default)
    p.add_argument("--scheduler", choices=["plateau", "linear", "budget", "none"],
                   help="learning-rate schedule: plateau (lower it on each loss plateau, and in "
                   "minibatch runs at 50/75/90%% of the budget; stop when converged), linear (over "
                   "the epochs), budget (linearly over epochs or "
                   f"--max-time), none; {method_default}")
    p.add_argument("--preset", choices=["default", "paper"], default="default",
                   help="training defaults: default (stop on convergence within a time "
                   "budget) or paper (the fixed epochs of the benchmark suites)")
    p.add_argument("--max-time", type=float, metavar="SECONDS",
                   help="wall-clock training budget in seconds (default: 300 for the default "
                   "preset, none when --epochs is given)")
    p.add_argument("--eval-every", type=int, default=0, metavar="K",
                   help="evaluate on the test set every K epochs (default 0: only at the end)")
    p.add_argument("--dtype", choices=["float32", "float64"],
                   help=f"training precision; {method_default}")
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="cpu (default), cuda, cuda:N, or auto (CUDA when torch sees a GPU); "
                   "the saved model.pt loads on the CPU")
    p.add_argument("--split", type=int, default=0,
                   help="which train/test split of the dataset (default 0)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds initialisation and minibatch order (default 0)")
    p.add_argument("--out", default="runs/fit", help="output folder (default runs/fit); one "
                   "that holds a model.pt already is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the model.pt (and metrics) of an earlier run in --out")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="checkpoint file written every epoch; a killed run resumes from it "
                   "(default: none)")
    p.add_argument("--option", "-o", action="append", type=_option, default=[],
                   metavar="KEY=VALUE", help="method option, e.g. -o num_inducing=1024 "
                   "(repeatable; `gpscale methods KEY` lists them with types and defaults)")
    p.add_argument("--data-option", action="append", type=_data_option, default=[],
                   metavar="KEY=VALUE", help="dataset option, e.g. --data-option n=100000; "
                   "with --data: header=none|0, delimiter=X|tab, test_fraction=F")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: a bar on a terminal)")


def build_parser() -> argparse.ArgumentParser:
    from gpscale import __version__

    # -v works before or after the subcommand: the subparsers share this parent, with a
    # SUPPRESS default so that a subparser does not overwrite a -v given before it.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="log progress to stderr")
    parser = argparse.ArgumentParser(
        prog="gpscale", description="Scalable Gaussian processes: train, predict, benchmark.",
        parents=[verbose])
    parser.add_argument("--version", action="version", version=f"gpscale {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[verbose], **kwargs)

    demo = add("demo", help="fit a scalable method and a baseline on synthetic data")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--quick", action="store_true", help="smaller data, fewer epochs")

    fitp = add("fit", help="train a method on a dataset and write metrics and model")
    _add_fit_flags(fitp)
    fitp.add_argument("--nproc", type=int, default=1, metavar="P",
                      help="train data-parallel in P local processes (cagp-opt and minibatch "
                      "methods); several machines: see `python -m pydoc gpscale.distributed`")

    pred = add("predict", help="predict with a saved model on a CSV file")
    pred.add_argument("--model", required=True, help="model.pt written by `gpscale fit`")
    pred.add_argument("--data", required=True,
                      help="CSV file of inputs: with a header row, columns are matched by name "
                      "(any order); without one, by position")
    pred.add_argument("--target", help="a column to drop if present, ignored if absent: a "
                      "header name or an index (the training target column is dropped "
                      "without this flag)")
    pred.add_argument("--out", help="write predictions here (CSV), replacing the file when "
                      "complete; default stdout")

    conv = add("convert", help="rewrite a model or checkpoint file of the earlier pickled "
               "format in the current data-only format")
    conv.add_argument("old", help="the file to convert (model.pt, a checkpoint, a saved "
                      "estimator)")
    conv.add_argument("new", help="where to write the converted file (a new path)")
    conv.add_argument("--trust", action="store_true",
                      help="required: converting unpickles OLD (torch's restricted unpickler: "
                      "tensors, arrays and gpscale's records only); pass it for a file from a "
                      "source you trust")

    bench = add("bench", help="run a benchmark suite")
    bench.add_argument("suite", help="suite name (`gpscale bench list` lists them)")
    bench.add_argument("--out", help="output folder (default runs/bench-SUITE)")
    bench.add_argument("--quick", action="store_true", help="a small smoke-test version")
    bench.add_argument("--datasets", help="comma-separated subset of the suite's datasets")
    bench.add_argument("--runs", help="comma-separated subset of the suite's run labels, e.g. "
                       "SoftKI-512,SVGP-512 (suites with labelled runs: softki; "
                       "iterncgp's MNIST runs; scale: method keys)")
    bench.add_argument("--max-time", type=float, help="training seconds per run instead of "
                       "the method's default budget (suite scale)")
    bench.add_argument("--device", help="cuda or cuda:N: measure on that GPU (suites kernels "
                       "and scale; default the CPU)")

    ds = add("datasets", help="list datasets, or download one")
    ds_sub = ds.add_subparsers(dest="action")
    ds_sub.add_parser("list", help="list datasets (the default)")
    dl = ds_sub.add_parser("download", help="download a dataset into the cache")
    dl.add_argument("name")
    dl.add_argument("--cache-dir", help="default ~/.cache/gpscale")
    dl.add_argument("--base-url", help="a mirror to fetch from instead of the public original: "
                    "file names are appended (https://... or file:///...)")
    dl.add_argument("--force", action="store_true")

    syn = ds_sub.add_parser("synthesize", help="write a synthetic regression file: a smooth "
                            "random field on [0, 1]^d plus noise (gpscale.data.writers)")
    syn.add_argument("--out", required=True, help="the file to write; its extension picks the "
                     "format: .csv, .csv.gz, .parquet or .npy (target last, named y)")
    syn.add_argument("--rows", type=int, required=True, help="number of rows")
    syn.add_argument("--dims", type=int, default=8, help="input columns (default 8)")
    syn.add_argument("--noise", type=float, default=0.04, help="noise variance (default 0.04)")
    syn.add_argument("--lengthscale", type=float, default=0.5,
                     help="the field's RBF lengthscale (default 0.5)")
    syn.add_argument("--seed", type=int, default=0)

    meth = add("methods", help="list method keys, or one method's options")
    meth.add_argument("key", nargs="?", help="a method key: list its options (types, defaults, "
                      "help) and training defaults")
    return parser


def _env_number(name: str, default: Any, kind: type = int) -> Any:
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


def _cmd_fit(args: argparse.Namespace) -> int:
    from gpscale.cli.outputs import claim_fit_outputs
    from gpscale.distributed.env import DEFAULT_TIMEOUT, DistributedError
    from gpscale.methods.registry import get_spec
    from gpscale.run import RunSpec
    from gpscale.training.interrupt import graceful_interrupt, requested

    if args.data is not None and args.method != "auto":
        tasks = get_spec(args.method).tasks  # --task defaults to regression for --data
        if args.task not in tasks:
            raise ValueError(f"method {args.method!r} does not support task {args.task!r} "
                             f"(--task of --data, default regression); it supports "
                             f"{', '.join(tasks)}: pass --task {tasks[0]}")

    spec = RunSpec(
        method=args.method, dataset=args.dataset, csv=args.data, target=args.target,
        task=args.task, split=args.split, seed=args.seed, epochs=args.epochs, lr=args.lr,
        batch_size=args.batch_size, optimizer=args.optimizer, max_time=args.max_time,
        scheduler=args.scheduler, preset=args.preset, eval_every=args.eval_every,
        dtype=args.dtype, device=args.device,
        options=dict(args.option), dataset_options=dict(args.data_option), out=args.out,
        checkpoint=args.checkpoint, progress=False if args.no_progress else None)
    # The training plan (budget, schedule, stopping rule) is shown even without --verbose.
    logging.getLogger("gpscale.fit").setLevel(logging.INFO)
    world_size = _env_number("WORLD_SIZE", 1)  # set by torchrun
    timeout = _env_number("GPSCALE_DIST_TIMEOUT", DEFAULT_TIMEOUT, float)
    if args.nproc < 1:
        raise ValueError(f"--nproc must be at least 1; got {args.nproc}")
    if args.nproc > 1 and world_size > 1:
        raise ValueError("--nproc starts local processes itself; under torchrun leave it out")
    if args.data is not None and not Path(args.data).is_file():
        raise ValueError(f"--data {args.data}: no such file")
    main_rank = world_size == 1 or os.environ.get("RANK", "0") == "0"
    claim = (claim_fit_outputs(args.out, overwrite=args.overwrite, checkpoint=args.checkpoint,
                               inputs={"--data": args.data}) if main_rank
             else contextlib.nullcontext(False))
    # --nproc: Ctrl-C reaches every rank at once and ends the job; one process stops cleanly
    graceful = graceful_interrupt() if args.nproc == 1 else contextlib.nullcontext()
    with claim as earlier, graceful:
        try:
            metrics = _fit_metrics(spec, args.nproc, world_size, timeout)
        except DistributedError as err:
            if isinstance(err, ValueError):  # the same bad input on every rank: one line
                raise
            print(f"gpscale fit: data-parallel run failed: {err}", file=sys.stderr)
            return 4
        interrupted = requested()
    if metrics is None:  # a torchrun rank other than 0: rank 0 reports
        return 0
    from gpscale.metrics import json_safe

    print(json.dumps(json_safe(metrics), indent=2, allow_nan=False))
    wrote = f"{args.out}/metrics.json, history.csv and model.pt"
    if interrupted:
        print(f"gpscale fit: interrupted (Ctrl-C) after epoch {metrics.get('epochs')}; wrote "
              f"{wrote} (stopped: {metrics.get('stopped')})"
              + (f" and the checkpoint {args.checkpoint}" if args.checkpoint else ""),
              file=sys.stderr)
        return 130
    print(f"wrote {wrote}" + (" (replacing the earlier model.pt)" if earlier else ""),
          file=sys.stderr)
    return 0


def _fit_metrics(spec: Any, nproc: int, world_size: int, timeout: float
                 ) -> dict[str, Any] | None:
    """Run ``spec`` in this process, in ``nproc`` local processes or as a torchrun rank;
    the metrics (``None`` on a torchrun rank other than 0)."""
    from gpscale.run import run

    if nproc > 1:
        from gpscale.benchmarks.rank import run_rank
        from gpscale.distributed.launch import launch

        threads = _env_number("GPSCALE_THREADS", None)
        return launch(run_rank, (spec, timeout), nproc=nproc, timeout=timeout,
                      threads=threads)[0]
    if world_size > 1:
        from gpscale.benchmarks.rank import run_rank
        from gpscale.distributed.env import current

        metrics = run_rank(spec, timeout)
        return metrics if current().is_main else None
    return run(spec).metrics


def _cmd_predict(args: argparse.Namespace) -> int:
    from gpscale.cli.outputs import check_predict_out
    from gpscale.cli.predict import predict_csv_chunks
    from gpscale.files import atomic_output

    out = (None if args.out is None else
           check_predict_out(args.out, {"--data": args.data, "--model": args.model}))
    chunks = predict_csv_chunks(args.model, args.data, target=args.target)
    first = next(chunks, None)  # errors in the model or the data surface before --out opens
    tables = itertools.chain([] if first is None else [first], chunks)
    rows = 0
    # --out is written under a temporary name and renamed when complete: a run that fails
    # midway leaves no partial file (and an existing file of that name as it was)
    with (contextlib.nullcontext(sys.stdout) if out is None
          else atomic_output(out, "w", newline="")) as stream:
        for i, table in enumerate(tables):
            table.write(stream, header=i == 0)
            rows += len(table)
    if out is not None:
        print(f"wrote {rows} predictions to {args.out}", file=sys.stderr)
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from gpscale.io import convert

    if Path(args.new).exists():
        raise ValueError(f"{args.new} exists; convert into a new path")
    kind = convert(args.old, args.new, trust=args.trust)
    print(f"wrote {args.new}: {kind} in the current data-only format", file=sys.stderr)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from gpscale.benchmarks.registry import SUITES, run_suite

    if args.suite == "list":
        for name, suite in SUITES.items():
            print(f"{name:12s} {suite.summary}")
        return 0
    datasets = tuple(args.datasets.split(",")) if args.datasets else None
    runs = tuple(args.runs.split(",")) if args.runs else None
    # Suites run for minutes to hours: say which run starts when, even without --verbose.
    logging.getLogger("gpscale.benchmarks").setLevel(logging.INFO)
    report = run_suite(args.suite, args.out or f"runs/bench-{args.suite}", quick=args.quick,
                       datasets=datasets, runs=runs, device=args.device,
                       max_time=args.max_time)
    print(report.read_text())
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    from gpscale.data import download, list_datasets

    if args.action == "synthesize":
        from gpscale.data.writers import write_field

        tic = time.perf_counter()
        table = write_field(args.out, args.rows, num_dims=args.dims, noise=args.noise,
                            lengthscale=args.lengthscale, seed=args.seed)
        print(f"wrote {table.num_rows:,d} rows x {table.num_dims + 1} columns to {table.path} "
              f"in {time.perf_counter() - tic:.1f} s; std(y) {table.y_var ** 0.5:.4f}, noise "
              f"floor (best test RMSE on standardised y) {table.noise_floor:.4f}")
        return 0
    if args.action == "download":
        from gpscale.cli.outputs import expand_user

        cache = None if args.cache_dir is None else str(expand_user(args.cache_dir,
                                                                     "--cache-dir"))
        path = download(args.name, cache_dir=cache, urls=args.base_url, force=args.force)
        print(f"{args.name}: downloaded to {path}")
        return 0
    print(f"{'name':16s} {'task':15s} {'n':>11s} {'d':>5s}  present  location")
    for info in list_datasets():
        name = info.name + "".join(f", {alias}" for alias in info.aliases)
        print(f"{name:16s} {info.task:15s} {info.n:>11,d} {info.d:>5d}  "
              f"{'yes' if info.present else 'no':7s}  {info.location}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from gpscale.methods.registry import METHODS, get_spec
    from gpscale.training import default_fit_config

    if args.key == "auto":
        from gpscale.methods.auto import RULES

        print("auto: picks a method from the task, n, d and memory (first matching row):")
        for task, condition, key in RULES:
            print(f"  {task:15s} {condition:42s} -> {key}")
        return 0
    if args.key:
        spec = get_spec(args.key)
        config = default_fit_config(args.key)
        print(f"{spec.key}: {spec.summary}")
        print(f"tasks: {', '.join(spec.tasks)}; status: {spec.status}")
        print(f"training defaults: optimizer={config.optimizer} lr={config.lr} "
              f"epochs={config.epochs} batch_size={config.batch_size} "
              f"scheduler={config.scheduler} dtype={config.dtype} max_time={config.max_time}")
        print("options (-o KEY=VALUE, or estimator keywords):")
        print(spec.describe())
        return 0
    for key, spec in sorted(METHODS.items()):
        print(f"{key:10s} {spec.status:12s} {','.join(spec.tasks):28s} {spec.summary}")
    print(f"{'auto':10s} {'ready':12s} {'regression,classification,counts':28s} chooses one "
          "of the above from the task, n, d and memory (`gpscale methods auto`)")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from gpscale.benchmarks.demo import run_demo

    report = run_demo(args.out, quick=args.quick)
    print(report.read_text())
    return 0


COMMANDS = {"fit": _cmd_fit, "predict": _cmd_predict, "convert": _cmd_convert,
            "bench": _cmd_bench,
            "datasets": _cmd_datasets, "methods": _cmd_methods, "demo": _cmd_demo}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    try:
        threads = _env_number("GPSCALE_THREADS", None)
        if threads:
            torch.set_num_threads(threads)
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"gpscale {args.command}: interrupted (Ctrl-C); stopped without writing more",
              file=sys.stderr)
        return 130
    except (ValueError, OSError) as err:
        print(f"gpscale {args.command}: error: {err}", file=sys.stderr)
        return 2
    except FloatingPointError as err:  # NonFiniteLossError
        print(f"gpscale {args.command}: training stopped: {err}", file=sys.stderr)
        return 3
    except (MemoryError, torch.cuda.OutOfMemoryError) as err:  # DeviceMemoryError, or torch's
        from gpscale.devices import out_of_memory
        from gpscale.errors import DeviceMemoryError

        if not isinstance(err, DeviceMemoryError):
            err = out_of_memory(err, f"gpscale {args.command}", None)
        print(f"gpscale {args.command}: error: {err}", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(main())
