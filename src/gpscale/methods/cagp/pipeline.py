"""What the pipeline needs to know about ``cagp-opt`` and ``cagp-cg`` beside their options:
training defaults per preset, the exact-GP pre-fit on a subset (with CaGP-CG's check that its CG
actions can start from the pre-fitted values), CaGP-Opt's default number of actions and small
test options (:class:`~gpscale.methods.registry.MethodSpec` fields, spread by each key's
``register`` call).

**Training.** The paper's Table S1: Adam in float32 with LinearLR(end_factor=0.1), full batch;
lr 0.1 is the middle of the paper's sweep {1, 0.1, 0.01}. The paper runs 1000 (CaGP-Opt) and 250
(CaGP-CG) epochs on a GPU; on a CPU a CaGP-Opt epoch at ten thousand points or more takes seconds
and a CaGP-CG epoch minutes, hence 200 and 50 in the ``paper`` preset. The default preset starts
both at lr 1.0, the best rate on most sets of Table 1 (0.1 on Protein, which the plateau
schedule reaches); a failed first step backs off by 0.3. (With CaGP-Opt's opt-in
``-o prefit=exact`` use ``--lr 0.1``: lr 1.0 throws the pre-fitted values away in its first
steps.)

**Pre-fit.** Above ``AUTO_PREFIT_MIN_POINTS`` training points (or with ``prefit=exact``) an
exact GP on ``prefit_size`` random points supplies the start
(:func:`gpscale.training.prefit.fill_prefit_options`).
"""

from __future__ import annotations

import math
from typing import Any

from gpscale.errors import NumericalError
from gpscale.methods._common import default_size
from gpscale.methods.cagp.cg import cg_action_cap
from gpscale.methods.registry import Prefit, training_presets

__all__ = ["PIPELINE", "check_cg_reach", "default_num_actions", "NUM_ACTIONS_CAP",
           "LARGE_NUM_ACTIONS", "LARGE_ROWS"]

NUM_ACTIONS_CAP = 512
"""CaGP-Opt's default number of actions from 1,024 rows on (below, n/2), below
:data:`LARGE_ROWS`."""
LARGE_NUM_ACTIONS = 1024
"""CaGP-Opt's default number of actions from :data:`LARGE_ROWS` rows on."""
LARGE_ROWS = 32_000
"""From this many training rows CaGP-Opt defaults to :data:`LARGE_NUM_ACTIONS` actions. An
epoch's kernel products cost n² whatever the number of actions i, its float64 ZᵀZ n i²: on
many rows doubling i less than doubles the epoch, while each action's block halves, and the
posterior comes much closer to the exact one in the same time (BENCHMARKS, CaGP-Opt's number
of actions). On fewer rows the blocks of 512 are small already and the n i² term takes over
more of the epoch, so more actions no longer pay on every set."""


def default_num_actions(num_train: int) -> int:
    """CaGP-Opt's default number of actions on ``num_train`` rows: n/2 up to
    :data:`NUM_ACTIONS_CAP` (at least 1), :data:`LARGE_NUM_ACTIONS` from :data:`LARGE_ROWS`."""
    if num_train >= LARGE_ROWS:
        return LARGE_NUM_ACTIONS
    return default_size(None, num_train, NUM_ACTIONS_CAP, 2, "num_actions")


def check_cg_reach(found: dict[str, Any], opts: dict[str, Any], num_train: int) -> None:
    """NumericalError when CG with the method's i actions cannot approach the solve at the
    pre-fitted values ``found``: K̂ = K + σ²I has eigenvalues from ≥ σ² to ≥ the outputscale s,
    and CG needs ~√κ iterations, so i < √(s/σ²) actions stop far from it (CaGP-CG from such a
    start ends worse than from the defaults)."""
    i = default_size(opts["num_actions"], num_train, cg_action_cap(num_train), 2, "num_actions")
    if found["outputscale"] / found["noise"] > i * i:
        raise NumericalError(
            f"√(outputscale / noise) = √({found['outputscale']:.3g} / {found['noise']:.3g}) = "
            f"{math.sqrt(found['outputscale'] / found['noise']):.0f} exceeds the {i} CG actions: "
            "CG cannot reach the solve at the pre-fitted values")


_LINEAR = dict(lr=0.1, scheduler="linear", lr_end_factor=0.1, dtype="float32")

PIPELINE: dict[str, dict[str, Any]] = {
    "cagp-opt": dict(training_defaults=training_presets({**_LINEAR, "epochs": 200}, lr=1.0),
                     prefit=Prefit("subset", model="exact"),
                     row_sized={"num_actions": default_num_actions},
                     test_options={"num_actions": 8}),
    "cagp-cg": dict(training_defaults=training_presets({**_LINEAR, "epochs": 50}, lr=1.0),
                    prefit=Prefit("subset", model="exact", check=check_cg_reach),
                    test_options={"num_actions": 8}),
}
"""The declarations of ``cagp-opt`` and ``cagp-cg`` (module docstring)."""
