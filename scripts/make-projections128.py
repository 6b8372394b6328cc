"""Write the 128-input regression set of `auto`'s race measurements as a CSV (x0..x127, y).

2,500 rows of standard-normal inputs; y is the sum of the sines of ten random projections of
the first ten inputs, plus a small interaction of two of them and Gaussian noise of standard
deviation 0.05. Usage: python scripts/make-projections128.py OUT.csv [--seed 0]
"""

import argparse

import numpy as np

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--rows", type=int, default=2_500)
args = parser.parse_args()
rng = np.random.default_rng(args.seed)
x = rng.standard_normal((args.rows, 128))
w = rng.standard_normal((10, 10)) / np.sqrt(10)
y = np.sin(x[:, :10] @ w.T).sum(1) + 0.3 * x[:, 0] * x[:, 1] + 0.05 * rng.standard_normal(args.rows)
header = ",".join([f"x{j}" for j in range(128)] + ["y"])
np.savetxt(args.out, np.column_stack([x, y]), delimiter=",", header=header, comments="",
           fmt="%.7g")
