"""What the pipeline needs to know about ``solvegp`` beside its options: training defaults per
preset, GPU inducing sets and small test options (:class:`~gpscale.methods.registry.MethodSpec`
fields, spread by its ``register`` call).

Training as the SVGP baseline: the paper (App. G) runs Adam at lr 0.01 on batches of 1,024; the
default preset starts at 0.1 and lets plateaus lower it. On a GPU, for one latent function
(regression), the two inducing sets are 512 + 512 (the same 1,024 basis functions as the SVGP
there; the paper's 1,024 + 1,024 took 1.5× SVGP-1,000's time per step in its CIFAR-10 runs, and
a larger set needs more epochs to converge): min(512, n/4) each, as the CPU's min(256, n/4).

The convolutional keys train on small batches of images (the paper's 64; a step's cost grows
with the batch times the patches per image times the inducing patches) at Adam's lr 0.01,
within 15 minutes (a step on the CPU costs about half a second, and MNIST's accuracy still
gains in the sixth epoch: BENCHMARKS "conv"); their test options cut 1 × 2 "images" of the
contract tests' two inputs into 1 × 1 patches.
"""

from __future__ import annotations

from typing import Any

from gpscale.methods.registry import MINIBATCH, training_presets

__all__ = ["PIPELINE"]

CONV_BUDGET_S = 900.0
"""Training budget of the convolutional keys' defaults (module docstring)."""
CONV_MINIBATCH: dict[str, Any] = {**MINIBATCH, "batch_size": 64}
"""Training settings of the convolutional keys (module docstring)."""
CONV_TEST_OPTIONS: dict[str, Any] = {"num_inducing": 4, "num_orthogonal": 4,
                                     "image_shape": [1, 2], "patch_size": 1}

PIPELINE: dict[str, dict[str, Any]] = {
    "solvegp": dict(
        training_defaults=training_presets(MINIBATCH, lr=0.1),
        gpu_inducing={"num_inducing": (512, 4), "num_orthogonal": (512, 4)},
        test_options={"num_inducing": 6, "num_orthogonal": 6}),
    "conv-solvegp": dict(
        training_defaults=training_presets(CONV_MINIBATCH, lr=0.01, max_time=CONV_BUDGET_S),
        test_options=CONV_TEST_OPTIONS),
    "conv-svgp": dict(
        training_defaults=training_presets(CONV_MINIBATCH, lr=0.01, max_time=CONV_BUDGET_S),
        test_options={**CONV_TEST_OPTIONS, "num_orthogonal": 0}),
}
"""The declarations of ``solvegp`` (module docstring)."""
