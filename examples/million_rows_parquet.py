"""A million rows from a Parquet file, through the ``gpscale`` command line.

Step 1 writes a synthetic regression table (8 inputs ``x0..x7`` and a target ``y``: a smooth
random field plus noise of variance 0.04) with ``gpscale datasets synthesize``. Step 2 trains
SVGP on it with ``gpscale fit``, which splits off 10% of the rows as a test set, trains on
minibatches until converged (at most 300 s by default) and writes ``metrics.json``,
``history.csv`` and ``model.pt``. The script prints each command as you would type it, then
the test metrics next to the noise floor: the RMSE of knowing the noise-free field exactly.

    python examples/million_rows_parquet.py                    # 10^6 rows, at most 300 s training
    python examples/million_rows_parquet.py --method softki
    python examples/million_rows_parquet.py --rows 2000 --epochs 5   # seconds
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pyarrow.parquet

from gpscale.cli.__main__ import main as gpscale


def run(argv: list[str]) -> None:
    """``gpscale ARGV`` in this process; exits with its status if it fails."""
    print("$ gpscale " + " ".join(argv), flush=True)
    code = gpscale(argv)
    if code:
        sys.exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to synthesize")
    parser.add_argument("--method", default="svgp", help="a method key (gpscale methods)")
    parser.add_argument("--epochs", type=int, help="most epochs (default: until converged)")
    parser.add_argument("--out", type=Path, default=Path("runs/examples/million_rows_parquet"))
    args = parser.parse_args()

    data, fit_dir, noise = args.out / "data.parquet", args.out / "fit", 0.04
    run(["datasets", "synthesize", "--rows", str(args.rows), "--noise", str(noise),
         "--out", str(data), "--overwrite"])
    fit = ["fit", "--data", str(data), "--target", "y", "--method", args.method,
           "--out", str(fit_dir), "--overwrite", "--no-progress"]
    run(fit + (["--epochs", str(args.epochs)] if args.epochs else []))

    metrics = json.loads((fit_dir / "metrics.json").read_text())
    y = pyarrow.parquet.read_table(data, columns=["y"]).column("y").to_numpy()
    floor = math.sqrt(noise) / float(y.std())
    print(f"{fit_dir / 'metrics.json'}:")
    print(f"  method {metrics['method']}, {metrics['n_train']:,} training rows, "
          f"{metrics['n_test']:,} test rows")
    print(f"  epochs: {metrics['epochs']}, training time {metrics['train_time_s']:.1f} s "
          f"(stopped: {metrics['stopped']})")
    print(f"  test RMSE {metrics['test_rmse']:.4f} (noise floor {floor:.4f}, "
          "predicting the mean ≈ 1)")
    print(f"  test NLL {metrics['test_nll']:.4f}")


if __name__ == "__main__":
    main()
