"""What the pipeline needs to know about ``softki`` beside its options: training defaults per
preset and small test options (:class:`~gpscale.methods.registry.MethodSpec` fields, spread by
its ``register`` call).

The paper trains with Adam at lr 0.01 on batches of 1,024 in float32 (the ``paper`` preset).
The default preset starts at 3× that: under the plateau schedule 0.01 stops short, behind
SVGP's test NLL; 0.03 gains clearly on most sets at a small cost on a few, and 0.1 overshoots
(BENCHMARKS "defaults"). On a GPU SoftKI keeps its 512 interpolation points, the paper's size
there, which already comes close to the noise floor.
"""

from __future__ import annotations

from typing import Any

from gpscale.methods.registry import MINIBATCH, training_presets

__all__ = ["PIPELINE"]

PIPELINE: dict[str, dict[str, Any]] = {
    "softki": dict(training_defaults=training_presets(MINIBATCH, lr=0.03),
                   test_options={"num_inducing": 8}),
}
"""The declarations of ``softki`` (module docstring)."""
