"""Regression on a GPU when there is one: ``GPRegressor(device="auto")``.

``device="auto"`` trains and predicts with CUDA when torch sees a GPU and on the CPU
otherwise; ``device="cuda"`` would instead be an error without one. The estimator builds the
method from the data, moves it and the data to the device, and returns predictions as NumPy
arrays either way. On a GPU, ``auto`` also picks differently: the exact GP while its matrices
fit in the card's memory (docs/guide/gpu.md). The script says which device it used, how long
training took, and the test RMSE next to that of predicting the training mean. It then saves
the fitted estimator to ``--out``/model.pt and loads it back, which always gives a CPU model.

    python examples/gpu.py                     # 20,000 points (several minutes on a CPU)
    python examples/gpu.py --method svgp
    python examples/gpu.py --rows 300 --epochs 5   # a few seconds, also without a GPU
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.model_selection import train_test_split

import gpscale
from gpscale.estimators import GPRegressor


def make_data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """y = f(x) + noise on [0, 1]^4."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(rows, 4))
    y = np.sin(6 * x[:, 0]) + x[:, 1] * np.cos(4 * x[:, 2]) + 0.5 * x[:, 3]
    return x, y + 0.1 * rng.standard_normal(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="number of points")
    parser.add_argument("--method", default="auto", help="a method key (gpscale methods)")
    parser.add_argument("--epochs", type=int, help="most epochs (default: until converged)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/examples/gpu"))
    args = parser.parse_args()

    if torch.cuda.is_available():
        print(f"torch sees a GPU: {torch.cuda.get_device_name()}")
    else:
        print("torch sees no GPU: device='auto' runs on the CPU")
    x, y = make_data(args.rows, args.seed)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2,
                                                        random_state=args.seed)

    tic = time.perf_counter()
    reg = GPRegressor(method=args.method, device="auto", epochs=args.epochs,
                      random_state=args.seed).fit(x_train, y_train)
    fit_s = time.perf_counter() - tic
    mean = reg.predict(x_test)
    rmse = float(np.sqrt(np.mean((mean - y_test) ** 2)))
    baseline = float(np.sqrt(np.mean((y_train.mean() - y_test) ** 2)))
    print(f"device: {reg.fit_config_.torch_device}")
    print(f"method: {reg.method_} ({reg.method_reason_})")
    print(f"fit: {fit_s:.1f} s, {reg.history_.epochs} epochs")
    print(f"test RMSE: {rmse:.4f}")
    print(f"baseline RMSE (training mean): {baseline:.4f}")

    path = gpscale.save(reg, args.out / "model.pt")
    again = gpscale.load(path).predict(x_test)
    print(f"saved {path}; loaded back, its predictions differ by at most "
          f"{np.abs(again - mean).max():.2e}")


if __name__ == "__main__":
    main()
