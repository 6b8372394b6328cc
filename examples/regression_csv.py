"""Regression on a CSV file with ``GPRegressor`` and ``method="auto"``.

Without ``--csv`` the script first writes a CSV of its own (a smooth function of four inputs
plus noise) under ``--out`` and uses that. With ``--csv PATH --target COLUMN`` it reads your
file instead: every other column is an input. It holds out a test set, fits, and prints the
test RMSE next to that of predicting the training mean, the method ``auto`` chose and why,
and a few predictions with their standard deviations.

    python examples/regression_csv.py                     # 5,000 generated rows, a few minutes
    python examples/regression_csv.py --csv my.csv --target price
    python examples/regression_csv.py --rows 300 --epochs 5   # a few seconds
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.csv
from sklearn.model_selection import train_test_split

from gpscale.estimators import GPRegressor


def write_example_csv(path: Path, rows: int, seed: int) -> None:
    """A header ``x0,x1,x2,x3,y`` and ``rows`` rows of y = f(x) + noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(rows, 4))
    y = np.sin(6 * x[:, 0]) + x[:, 1] * np.cos(4 * x[:, 2]) + 0.5 * x[:, 3]
    y += 0.1 * rng.standard_normal(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header="x0,x1,x2,x3,y",
               comments="")


def read_csv(path: Path, target: str) -> tuple[np.ndarray, np.ndarray]:
    table = pyarrow.csv.read_csv(path)
    if target not in table.column_names:
        raise SystemExit(f"{path} has no column {target!r}; columns: {table.column_names}")
    inputs = [name for name in table.column_names if name != target]
    x = np.column_stack([table.column(name).to_numpy() for name in inputs]).astype(float)
    return x, table.column(target).to_numpy().astype(float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, help="your CSV file (default: write one)")
    parser.add_argument("--target", default="y", help="target column of --csv (default y)")
    parser.add_argument("--rows", type=int, default=5000, help="rows of the generated CSV")
    parser.add_argument("--epochs", type=int, help="most epochs (default: until converged)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/examples/regression_csv"))
    args = parser.parse_args()

    path = args.csv
    if path is None:
        path = args.out / "data.csv"
        write_example_csv(path, args.rows, args.seed)
        print(f"wrote {args.rows} rows to {path}")
    x, y = read_csv(path, args.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2,
                                                        random_state=args.seed)

    reg = GPRegressor(epochs=args.epochs, random_state=args.seed).fit(x_train, y_train)
    mean, std = reg.predict(x_test, return_std=True)
    rmse = float(np.sqrt(np.mean((mean - y_test) ** 2)))
    baseline = float(np.sqrt(np.mean((y_train.mean() - y_test) ** 2)))
    inside = float(np.mean(np.abs(mean - y_test) <= 2 * std))
    print(f"method: {reg.method_} ({reg.method_reason_})")
    print(f"test RMSE: {rmse:.4f}")
    print(f"baseline RMSE (training mean): {baseline:.4f}")
    print(f"test targets within mean ± 2 std: {inside:.1%}")
    for m, s, t in zip(mean[:3], std[:3], y_test[:3], strict=True):
        print(f"  predicted {m:+.3f} ± {s:.3f}, observed {t:+.3f}")


if __name__ == "__main__":
    main()
