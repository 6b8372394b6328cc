"""What the pipeline needs to know about the baselines' keys beside their options: training
defaults per preset, GPU inducing sets, dense-memory copies and small test options, one dict of
:class:`~gpscale.methods.registry.MethodSpec` fields per key (each key's ``register`` call
spreads its own).

GPyTorch's models train full batch in float64, SVGP in minibatches of float32 as GPyTorch's
examples. The exact GP's loss and gradient are deterministic and an evaluation costs O(n³)
(seconds at a few thousand points), so L-BFGS with a line search is far ahead of Adam per
evaluation within the time budget (BENCHMARKS "defaults"); five iterations per epoch keep the
budget checked often, and a plateau of 2 epochs is 10 iterations. The best SVGP learning rate
of the CaGP paper's Table 1 is 0.1 or 0.01 by data set: the default starts high (ARD
lengthscales of unimportant inputs need large steps) and lets plateaus lower it.

**Inducing points on a GPU.** A step's time barely depends on the batch there, while SVGP's
arithmetic per step grows as batch · m², and with the CPU's 512 inducing points SVGP does not
reach the noise floor of a large low-dimensional field however long it trains: the inducing
set, not the training, limits it. So for one latent function (regression) it gets 1,024, the
SVGP of the CaGP, SoftKI and SOLVE-GP papers (all run on GPUs): min(1024, n/2) as the CPU's
min(512, n/2).

**Dense memory.** The exact GP and GPyTorch's CG GP hold several n × n matrices at once:
``dense_copies`` counts them, the larger of the peak resident memory of one loss with its
backward and of one conditioning with a prediction (float64, n = 8,000, CPU;
``benchmarks/memory.peak_memory_mb``), rounded up. The exact GP's peak is its loss's; cggp's
too (GPyTorch's CG and Lanczos on the dense matrix hold several copies).
"""

from __future__ import annotations

from typing import Any

from gpscale.methods.registry import FULL_BATCH, MINIBATCH, training_presets

__all__ = ["PIPELINE"]

PIPELINE: dict[str, dict[str, Any]] = {
    "exact": dict(
        training_defaults=training_presets({**FULL_BATCH, "lr": 0.1, "epochs": 50},
                                           optimizer="lbfgs", lr=1.0, lbfgs_max_iter=5,
                                           patience=2),
        dense_copies=3.5, test_options={}),
    "cggp": dict(
        training_defaults=training_presets({**FULL_BATCH, "lr": 0.1, "epochs": 50}, lr=0.1),
        dense_copies=10.5, test_options={}),
    "sgpr": dict(
        training_defaults=training_presets({**FULL_BATCH, "lr": 0.1, "epochs": 100}, lr=0.1),
        test_options={"num_inducing": 8}),
    "svgp": dict(
        training_defaults=training_presets(MINIBATCH, lr=0.1),
        gpu_inducing={"num_inducing": (1024, 2)}, test_options={"num_inducing": 8}),
}
"""Each baseline key's declarations (module docstring)."""
