"""``gpscale`` command line: demo | fit | predict | convert | bench | datasets | methods.

This module only parses flags into dataclasses and calls the layers below; it is also the one
place that reads environment variables (``GPSCALE_DATA`` is read by ``gpscale.data.search_path``,
``GPSCALE_THREADS`` and ``GPSCALE_DIST_TIMEOUT`` here, each checked with its name by
:mod:`gpscale.cli.checks`, which also bounds the flag values argparse's types do not). Where the
commands may write is checked first (:mod:`gpscale.cli.outputs`). Ctrl-C during ``fit`` stops
after the current training step, saves what was trained with ``stopped: interrupted`` and exits
130 (SIGTERM the same, exiting 143); a second Ctrl-C, or one in any other command or while the
command starts (importing torch takes seconds), exits 130 at once with one line. So that a
Ctrl-C at start-up is caught, this module imports torch and the package's layers only inside
:func:`main`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    from gpscale.cli.checks import LearningRateFlag

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
    p.add_argument("--lr", type=float, action=LearningRateFlag, help=method_default)
    p.add_argument("--batch-size", type=int,
                   help=f"minibatch size (a size ≥ n trains full batch); {method_default}")
    p.add_argument("--optimizer", choices=["adam", "lbfgs"], help=method_default)
    p.add_argument("--scheduler", choices=["plateau", "linear", "budget", "none"],
                   help="learning-rate schedule: plateau (lower it on each loss plateau, and in "
                   "minibatch runs at 50/75/90%% of the budget; stop when converged), linear (over "
                   "the epochs), budget (linearly over epochs or "
                   f"--max-time), none; {method_default}")
    p.add_argument("--preset", choices=["default", "paper", "optimum"], default="default",
                   help="training defaults: default (stop on convergence within a time budget), "
                   "paper (the fixed epochs of the benchmark suites) or optimum (default, but "
                   "on to the loss's optimum, not stopping at its noise: for comparing "
                   "likelihoods)")
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
                   help="which train/test split of the dataset (default 0); with --data the "
                   "seed of its random split")
    p.add_argument("--seed", type=int, default=0, help="seeds initialisation and minibatch "
                   "order: an integer in 0..2**63-1 (default 0)")
    p.add_argument("--out", default="runs/fit", help="output folder (default runs/fit); one "
                   "that holds a model.pt already, or a metrics.json or history file that "
                   "gpscale fit did not write, is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the model.pt of an earlier run in --out, and files there of "
                   "the names fit writes that fit did not write")
    p.add_argument("--checkpoint", metavar="FILE", help="checkpoint file written every "
                   "epoch; a killed run resumes from it (default: none)")
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
                       "iterncgp's MNIST runs; scale, calibration: method keys)")
    bench.add_argument("--max-time", type=float, help="training seconds per run instead of "
                       "the method's default budget (suites scale, calibration)")
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
    syn.add_argument("--overwrite", action="store_true", help="replace an existing --out file")

    meth = add("methods", help="list method keys, or one method's options")
    meth.add_argument("key", nargs="?", help="a method key: list its options (types, defaults, "
                      "help) and training defaults")
    return parser


def _cmd_fit(args: argparse.Namespace) -> int:
    from gpscale.cli.checks import check_fit_flags, env_number
    from gpscale.cli.outputs import claim_fit_outputs, expand_user
    from gpscale.distributed.env import DEFAULT_TIMEOUT, DistributedError
    from gpscale.methods.registry import get_spec
    from gpscale.run import RunSpec
    from gpscale.training.interrupt import graceful_interrupt, received

    check_fit_flags(args)
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
        options=dict(args.option), dataset_options=dict(args.data_option),
        out=None if args.out is None else str(expand_user(args.out, "--out")),
        checkpoint=args.checkpoint, progress=False if args.no_progress else None)
    # The training plan (budget, schedule, stopping rule) is shown even without --verbose.
    logging.getLogger("gpscale.fit").setLevel(logging.INFO)
    world_size = env_number("WORLD_SIZE", 1)  # set by torchrun
    timeout = env_number("GPSCALE_DIST_TIMEOUT", DEFAULT_TIMEOUT, float)
    if args.nproc < 1:
        raise ValueError(f"--nproc must be at least 1; got {args.nproc}")
    if args.nproc > 1 and world_size > 1:
        raise ValueError("--nproc starts local processes itself; under torchrun leave it out")
    if args.data is not None and not Path(args.data).exists():  # the reader names a pipe
        raise ValueError(f"--data {args.data}: no such file")
    main_rank = world_size == 1 or os.environ.get("RANK", "0") == "0"
    claim = (claim_fit_outputs(args.out, overwrite=args.overwrite, checkpoint=args.checkpoint,
                               inputs={"--data": args.data}) if main_rank
             else contextlib.nullcontext(False))
    # --nproc: Ctrl-C reaches every rank at once and ends the job; one process stops cleanly
    graceful = graceful_interrupt() if args.nproc == 1 else contextlib.nullcontext()
    with claim as earlier, graceful:
        try:
            metrics = _fit_metrics(spec, args.nproc, world_size, timeout, args.threads)
        except DistributedError as err:
            if isinstance(err, ValueError):  # the same bad input on every rank: one line
                raise
            print(f"gpscale fit: data-parallel run failed: {err}", file=sys.stderr)
            return 4
        interrupted = received()  # "Ctrl-C", "SIGTERM" or None
    if metrics is None:  # a torchrun rank other than 0: rank 0 reports
        return 0
    from gpscale.metrics import json_safe

    print(json.dumps(json_safe(metrics), indent=2, allow_nan=False))
    wrote = f"{args.out}/metrics.json, history.csv and model.pt"
    if interrupted:
        what = "interrupted (Ctrl-C)" if interrupted == "Ctrl-C" else "terminated (SIGTERM)"
        print(f"gpscale fit: {what} after epoch {metrics.get('epochs')}; wrote "
              f"{wrote} (stopped: {metrics.get('stopped')})"
              + (f" and the checkpoint {args.checkpoint}" if args.checkpoint else ""),
              file=sys.stderr)
        return _EXIT_CODES[interrupted]
    print(f"wrote {wrote}" + (" (replacing the earlier model.pt)" if earlier else ""),
          file=sys.stderr)
    return 0


def _fit_metrics(spec: Any, nproc: int, world_size: int, timeout: float,
                 threads: int | None = None) -> dict[str, Any] | None:
    """Run ``spec`` in this process, in ``nproc`` local processes or as a torchrun rank;
    the metrics (``None`` on a torchrun rank other than 0)."""
    from gpscale.run import run

    if nproc > 1:
        from gpscale.distributed.launch import launch
        from gpscale.run_parallel import run_rank

        return launch(run_rank, (spec, timeout), nproc=nproc, timeout=timeout,
                      threads=threads)[0]
    if world_size > 1:
        from gpscale.distributed.env import current
        from gpscale.run_parallel import run_rank

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
    # the package's one way into gpscale.benchmarks, a leaf on top (tests/test_layout.py)
    from gpscale.benchmarks.registry import SUITES, run_suite

    if args.suite == "list":
        for name, suite in SUITES.items():
            print(f"{name:12s} {suite.summary}")
        return 0
    datasets = tuple(args.datasets.split(",")) if args.datasets else None
    runs = tuple(args.runs.split(",")) if args.runs else None
    # Suites run for minutes to hours: say which run starts when, even without --verbose
    # (the suites log on gpscale.benchmarks, the runs they start on gpscale.run).
    for name in ("gpscale.benchmarks", "gpscale.run"):
        logging.getLogger(name).setLevel(logging.INFO)
    report = run_suite(args.suite, args.out or f"runs/bench-{args.suite}", quick=args.quick,
                       datasets=datasets, runs=runs, device=args.device,
                       max_time=args.max_time)
    print(report.read_text())
    return 0


def _cmd_datasets(args: argparse.Namespace) -> int:
    from gpscale.data import download, list_datasets

    if args.action == "synthesize":
        from gpscale.cli.outputs import check_synthesize_out
        from gpscale.data.writers import write_field

        out = check_synthesize_out(args.out, overwrite=args.overwrite)
        tic = time.perf_counter()
        table = write_field(out, args.rows, num_dims=args.dims, noise=args.noise,
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
    from gpscale.methods.registry import METHODS, get_spec, load_plugins
    from gpscale.training import default_fit_config

    load_plugins()  # the user's own methods, where GPSCALE_PLUGINS names their modules
    if args.key == "auto":
        from gpscale.methods import auto
        from gpscale.training.race import HELD_SHARE, RACE_SHARE

        print(f"auto: regression beyond the exact GP's n ≤ {auto.EXACT_MAX_N:,} (-o auto=race,"
              " the default): a race of the keys that take the options given: exact up to "
              f"{auto.RACE_EXACT_MAX_N:,} points, ggp for d ≤ {auto.GRID_MAX_DIMS} or an additive"
              f" kernel, cagp-opt up to {auto.CAGP_MAX_N:,}, svgp, solvegp, softki. Each trains "
              f"on {1 - HELD_SHARE:.0%} of the rows; successive halving on the other rows' NLL "
              f"within {RACE_SHARE:.0%} of the time budget; the winner trains on every row for the"
              " rest, from its race's parameters. Against each key alone: BENCHMARKS.md, \"auto\".")
        print("otherwise, and with -o auto=rules (seconds, no race), the first matching row:")
        for task, condition, key in auto.RULES:
            print(f"  {task:15s} {condition:42s} -> {key}")
        return 0
    if args.key:
        spec = get_spec(args.key)
        config = default_fit_config(args.key)
        print(f"{spec.key}: {spec.summary}")
        print(f"tasks: {', '.join(spec.tasks)}; status: {spec.status}")
        if spec.inputs == "images":
            print("inputs: images, one flattened (channel-last) image per row; square grey "
                  "or colour images are recognised, others need -o image_shape=H,W[,C]")
        print(f"training defaults: optimizer={config.optimizer} lr={config.lr} "
              f"epochs={config.epochs} batch_size={config.batch_size} "
              f"scheduler={config.scheduler} dtype={config.dtype} max_time={config.max_time}")
        print("options (-o KEY=VALUE, or estimator keywords):")
        print(spec.describe())
        return 0
    for key, spec in sorted(METHODS.items()):
        print(f"{key:12s} {spec.status:12s} {','.join(spec.tasks):28s} {spec.summary}")
    print(f"{'auto':12s} {'ready':12s} {'regression,classification,counts':28s} chooses one "
          "of the above from the task, n, d and memory (`gpscale methods auto`)")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from gpscale.cli.demo import run_demo

    report = run_demo(args.out, quick=args.quick)
    print(report.read_text())
    return 0


COMMANDS = {"fit": _cmd_fit, "predict": _cmd_predict, "convert": _cmd_convert,
            "bench": _cmd_bench,
            "datasets": _cmd_datasets, "methods": _cmd_methods, "demo": _cmd_demo}


_EXIT_CODES = {"Ctrl-C": 130, "SIGTERM": 143}  # 128 + the signal's number, as a shell reports


def main(argv: Sequence[str] | None = None) -> int:
    """The ``gpscale`` command on ``argv`` (default ``sys.argv[1:]``); its exit code."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before a command runs: parsing, importing torch
        print("gpscale: interrupted (Ctrl-C) while starting; nothing was written",
              file=sys.stderr)
        _exit_on_another_interrupt(argv, 130)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    try:
        import torch

        from gpscale.cli.checks import env_threads

        args.threads = env_threads()
        if args.threads:
            torch.set_num_threads(args.threads)
        return COMMANDS[args.command](args)
    except KeyboardInterrupt as err:
        what = str(err) or "Ctrl-C"  # a second SIGTERM during fit names itself
        print(f"gpscale {args.command}: interrupted ({what}); stopped without writing more",
              file=sys.stderr)
        _exit_on_another_interrupt(argv, _EXIT_CODES.get(what, 130))
        return _EXIT_CODES.get(what, 130)
    except (ValueError, OSError) as err:
        print(f"gpscale {args.command}: error: {err}", file=sys.stderr)
        return 2
    except FloatingPointError as err:  # NonFiniteLossError
        print(f"gpscale {args.command}: training stopped: {err}", file=sys.stderr)
        return 3
    except _out_of_memory_errors() as err:  # DeviceMemoryError, or torch's
        from gpscale.devices import PROCESS_ADVICE, out_of_memory
        from gpscale.errors import DeviceMemoryError

        if not isinstance(err, DeviceMemoryError):  # not from a model's step: no training advice
            err = out_of_memory(err, f"gpscale {args.command}", None, advice=PROCESS_ADVICE)
        print(f"gpscale {args.command}: error: {err}", file=sys.stderr)
        return 4


def _out_of_memory_errors() -> tuple[type[BaseException], ...]:
    import torch

    return MemoryError, torch.cuda.OutOfMemoryError


def _exit_on_another_interrupt(argv: Sequence[str] | None, code: int) -> None:
    """After an interrupt is reported, a further Ctrl-C while the process shuts down (exit
    handlers joining child processes) ends it at once, silently and with the same code, instead
    of a traceback from an exit handler. Only when this process is the command (``argv`` not
    given): a caller of :func:`main` in its own process keeps its handler."""
    if argv is None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda signum, frame: os._exit(code))


if __name__ == "__main__":
    sys.exit(main())
