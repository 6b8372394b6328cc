"""Data-parallel training on two local processes: ``gpscale fit ... --nproc 2``.

``--nproc P`` starts P processes on this machine (torch.distributed, gloo on the CPU, NCCL on
GPUs); each holds one shard of the training rows. Minibatch methods (``svgp``, ``solvegp``,
``softki``) average their gradients across the processes, with ``--batch-size`` the global
batch; ``cagp-opt`` and ``ggp`` compute the same loss and gradients as one process would.
Other methods have no data-parallel path and are refused. Across machines, run ``torchrun``
on each instead (docs/guide/distributed.md).

The script writes a synthetic 8-input table with ``gpscale datasets synthesize``, trains on
it with ``gpscale fit --nproc 2`` and prints the metrics that run writes to ``metrics.json``.

    python examples/two_processes.py                      # 200,000 rows, SVGP
    python examples/two_processes.py --method cagp-opt --rows 5000
    python examples/two_processes.py --rows 600 --epochs 2    # seconds
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpscale.cli.__main__ import main as gpscale


def run(argv: list[str]) -> None:
    """``gpscale ARGV`` in this process; exits with its status if it fails."""
    print("$ gpscale " + " ".join(argv), flush=True)
    code = gpscale(argv)
    if code:
        sys.exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows to synthesize")
    parser.add_argument("--method", default="svgp",
                        choices=["svgp", "solvegp", "softki", "cagp-opt", "ggp"])
    parser.add_argument("--nproc", type=int, default=2, help="local processes")
    parser.add_argument("--epochs", type=int, help="most epochs (default: until converged)")
    parser.add_argument("--out", type=Path, default=Path("runs/examples/two_processes"))
    args = parser.parse_args()

    data, fit_dir = args.out / "data.parquet", args.out / "fit"
    dims = 3 if args.method == "ggp" else 8  # ggp (grid interpolation) takes d <= 3
    run(["datasets", "synthesize", "--rows", str(args.rows), "--dims", str(dims),
         "--out", str(data), "--overwrite"])
    fit = ["fit", "--data", str(data), "--target", "y", "--method", args.method,
           "--nproc", str(args.nproc), "--out", str(fit_dir), "--overwrite", "--no-progress"]
    run(fit + (["--epochs", str(args.epochs)] if args.epochs else []))

    metrics = json.loads((fit_dir / "metrics.json").read_text())
    print(f"{fit_dir / 'metrics.json'}: {metrics['method']} on {metrics['nproc']} processes, "
          f"{metrics['n_train']:,} training rows")
    print(f"  epochs: {metrics['epochs']}, training time {metrics['train_time_s']:.1f} s "
          f"(stopped: {metrics['stopped']})")
    print(f"  test RMSE {metrics['test_rmse']:.4f}, test NLL {metrics['test_nll']:.4f}")


if __name__ == "__main__":
    main()
