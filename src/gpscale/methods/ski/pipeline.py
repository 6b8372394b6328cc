"""What the pipeline needs to know about ``ski`` and ``ggp`` beside their options: training
defaults per preset and small test options (:class:`~gpscale.methods.registry.MethodSpec`
fields, spread by each key's ``register`` call).

Both train full batch in float64 at lr 0.05: GGP's statistics are sums over all the data (a
minibatch would need statistics of its own), and SKI runs the same model.
"""

from __future__ import annotations

from typing import Any

from gpscale.methods.registry import FULL_BATCH, training_presets

__all__ = ["PIPELINE"]

_GRID = dict(training_defaults=training_presets({**FULL_BATCH, "lr": 0.05, "epochs": 40},
                                                lr=0.05),
             test_options={"grid_size": 12})

PIPELINE: dict[str, dict[str, Any]] = {"ski": _GRID, "ggp": _GRID}
"""The declarations of ``ski`` and ``ggp`` (module docstring)."""
