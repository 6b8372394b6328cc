"""What the pipeline needs to know about ``solvegp`` beside its options: training defaults per
preset, GPU inducing sets and small test options (:class:`~gpscale.methods.registry.MethodSpec`
fields, spread by its ``register`` call).

Training as the SVGP baseline: the paper (App. G) runs Adam at lr 0.01 on batches of 1,024; the
default preset starts at 0.1 and lets plateaus lower it. On a GPU, for one latent function
(regression), the two inducing sets are 512 + 512 (the same 1,024 basis functions as the SVGP
there; the paper's 1,024 + 1,024 took 1.5× SVGP-1,000's time per step in its CIFAR-10 runs, and
a larger set needs more epochs to converge): min(512, n/4) each, as the CPU's min(256, n/4).
"""

from __future__ import annotations

from typing import Any

from gpscale.methods.registry import MINIBATCH, training_presets

__all__ = ["PIPELINE"]

PIPELINE: dict[str, dict[str, Any]] = {
    "solvegp": dict(
        training_defaults=training_presets(MINIBATCH, lr=0.1),
        gpu_inducing={"num_inducing": (512, 4), "num_orthogonal": (512, 4)},
        test_options={"num_inducing": 6, "num_orthogonal": 6}),
}
"""The declarations of ``solvegp`` (module docstring)."""
