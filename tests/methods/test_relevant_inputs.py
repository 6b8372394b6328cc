"""Defaults learn which inputs matter: 32 inputs of which 4 carry the signal (issue #18).

The generated set ``relevant32`` (here n = 3,000 train, 2,000 test; noise standard deviation
0.1 against a signal of standard deviation ≈ 1.6) is learnable only by a method whose ARD
lengthscales of the 28 irrelevant inputs grow: a method stuck at its initial lengthscales
predicts close to the mean (test RMSE ≈ 1 on standardised y). Every regression key that takes
d > 3 inputs trains with no options, as ``gpscale fit --dataset relevant32 --method KEY`` does, and
must reach a test RMSE within 10% of the exact GP's. SKI and GGP are grid methods for d ≤ 3;
SoftKI passes since its softmax distances follow its ARD lengthscales (``distance='relative'``,
its default): with the paper's Euclidean distances it predicted the mean (RMSE 1.55).
Each run may take the default budget (300 s): the whole module takes up to ~45 minutes.

Why n = 3,000 and not the issue's 8,000: the reference must itself be trained with its defaults,
and the exact GP (Cholesky, float64) costs 49 s per epoch at n = 8,000 on a 2-core machine (before
the faster backward pass of commit 4ebbc67, 2026-11-26), so in its 300 s budget it stopped after
6–7 epochs at test RMSE 1.04 (the mean is 1.6); at n = 3,000 its L-BFGS defaults converge in
the budget.
"""

from __future__ import annotations

import pytest

from gpscale.methods import METHODS
from gpscale.run import RunSpec, run_metrics

pytestmark = [pytest.mark.slow, pytest.mark.long]  # eight default runs of up to 300 s
NUM_TRAIN = 3000

KEYS = sorted(k for k, spec in METHODS.items()
              if "regression" in spec.tasks and spec.inputs == "vectors"
              and k not in ("exact", "ski", "ggp"))


def _fit(key: str) -> dict:
    metrics = run_metrics(RunSpec(method=key, dataset="relevant32", progress=False,
                                  dataset_options={"n": NUM_TRAIN}))
    print(f"\nrelevant32 {key}: test RMSE {metrics.get('test_rmse')}, NLL "
          f"{metrics.get('test_nll')}, {metrics.get('epochs')} epochs, stopped "
          f"{metrics.get('stopped')}, {metrics.get('train_time_s')} s")  # shown with -s
    return metrics


@pytest.fixture(scope="module")
def exact_rmse() -> float:
    metrics = _fit("exact")
    # the reference itself must have found the 4 inputs: noise floor 0.1 / 1.6 ≈ 0.06
    assert metrics["test_rmse"] < 0.3, metrics
    return metrics["test_rmse"]


# Since commit 4ebbc67 (2026-11-26) the exact GP trains with L-BFGS and converges here (RMSE
# 0.1252 in y's units, before: 0.1425 unconverged with Adam). SoftKI's default at lr 0.01 was
# 19% behind it (0.1484); at its lr 0.03 default (2026-11-26, 893716b) 0.1369, inside the 10%
# (BENCHMARKS defaults, relevant32).
@pytest.mark.parametrize("key", KEYS)
def test_defaults_reach_the_exact_gp(key, exact_rmse):
    metrics = _fit(key)
    assert metrics["test_rmse"] <= 1.1 * exact_rmse, (key, metrics, exact_rmse)
