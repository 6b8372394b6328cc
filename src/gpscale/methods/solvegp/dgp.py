r"""The ``solvegp`` key: one SOLVE-GP layer, or with ``layers`` > 1 a SOLVE-DGP on vectors.

SOLVE-DGP (Shi, Titsias & Mnih 2020 §4, notes/004_solvegp.md §2.12) is the doubly stochastic
deep GP of Salimbeni & Deisenroth (2017) with SOLVE-GP layers
(:mod:`~gpscale.methods.solvegp.deep`): ``layers − 1`` hidden layers of ``hidden_width``
outputs each (the width of every GP's input after the first; ``None``: min(30, d), Salimbeni &
Deisenroth's choice), each a SOLVE-GP with an ARD kernel on its whole input and a fixed linear
mean (identity where widths agree, else the inputs' leading principal directions), then the
output layer: the one-layer model with the key's options. Hidden layers have the output
layer's inducing sizes unless ``hidden_inducing`` / ``hidden_orthogonal`` say otherwise. The
optimal q and noise after training (``optimal_q``) need a Gaussian layer on the data, so a deep
model keeps what the optimiser reached.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from gpscale.methods._common import default_size
from gpscale.methods.options import Option
from gpscale.methods.registry import MethodSpec, register
from gpscale.methods.solvegp.deep import DeepSolveGP, build_hidden_layer, start_rows
from gpscale.methods.solvegp.model import TASKS, SolveGP, build_solvegp
from gpscale.methods.solvegp.parts import SOLVEGP_OPTIONS
from gpscale.methods.solvegp.pipeline import PIPELINE

__all__ = ["build_solvegp_key", "DGP_OPTIONS", "HIDDEN_WIDTH"]

HIDDEN_WIDTH = 30
"""Most outputs of a hidden layer by default (module docstring)."""


def build_solvegp_key(num_dims: int, *, layers: int = 1, hidden_width: int | None = None,
                      hidden_inducing: int | None = None, hidden_orthogonal: int | None = None,
                      num_predict_samples: int = 10, **options: Any) -> SolveGP | DeepSolveGP:
    """Factory of ``solvegp``: :func:`~gpscale.methods.solvegp.build_solvegp` for one layer,
    a SOLVE-DGP for more (module docstring).

    Args:
        num_dims: input dimension d.
        layers: GP layers, the output layer included.
        hidden_width: outputs of each hidden layer (``None``: min(30, d)).
        hidden_inducing, hidden_orthogonal: inducing points of each hidden layer (``None``: as
            the output layer's).
        num_predict_samples: samples propagated through the hidden layers at prediction.
        **options: the one-layer model's (:func:`~gpscale.methods.solvegp.build_solvegp`).

    Raises:
        ValueError: as ``build_solvegp``; for fewer than one layer or a hidden width below
            one; for the collapsed bound with hidden layers (it needs a Gaussian layer on x).
    """
    if layers < 1:
        raise ValueError(f"layers must be at least 1; got {layers}")
    if layers == 1:
        return build_solvegp(num_dims, **options)
    if options.get("objective", "elbo") != "elbo":
        raise ValueError("a deep GP trains by the minibatch ELBO (objective='elbo'); the "
                         "collapsed bound needs the data to enter a Gaussian layer directly")
    width = min(HIDDEN_WIDTH, num_dims) if hidden_width is None else int(hidden_width)
    if width < 1:
        raise ValueError(f"hidden_width must be at least 1; got {width}")
    init: tuple[Tensor, Tensor] | None = options.pop("init", None)
    seed = int(options.get("seed", 0))
    n_init = None if init is None else init[0].shape[0]
    num_data, h, y = start_rows("solvegp", init, options.pop("num_data", None), seed)
    m = default_size(options.get("num_inducing"), n_init, 256, 4, "num_inducing")
    m2 = default_size(options.get("num_orthogonal"), n_init, 256, 4, "num_orthogonal")
    m_hidden = m if hidden_inducing is None else int(hidden_inducing)
    m2_hidden = m2 if hidden_orthogonal is None else int(hidden_orthogonal)
    hidden, dims = [], num_dims
    for depth in range(layers - 1):
        layer, h = build_hidden_layer(
            h, in_dims=dims, geometry=None, channels=width, num_inducing=m_hidden,
            num_orthogonal=m2_hidden, num_data=num_data,
            kernel=options.get("kernel", "matern32"), whiten=options.get("whiten", True),
            jitter=options.get("jitter"), seed=seed + depth,
            kmeans_max_points=options.get("kmeans_max_points", 10_000))
        hidden.append(layer)
        dims = width
    output = build_solvegp(width, init=None if h is None else (h, y), num_data=num_data,
                           **{**options, "num_inducing": m, "num_orthogonal": m2})
    recorded = {**output.options, "layers": int(layers), "hidden_width": width,
                "hidden_inducing": m_hidden, "hidden_orthogonal": m2_hidden,
                "num_predict_samples": int(num_predict_samples)}
    model = DeepSolveGP(hidden, output, num_dims=num_dims,
                        num_predict_samples=int(num_predict_samples), seed=seed,
                        options=recorded)
    if init is not None:
        model = model.to(device=init[0].device, dtype=init[0].dtype)
        model.reset_variational()
    return model


DGP_OPTIONS = (
    *SOLVEGP_OPTIONS[:-1],
    Option("layers", "int", 1, "GP layers: 1 is SOLVE-GP, more a SOLVE-DGP (doubly "
           "stochastic deep GP)", minimum=1),
    Option("hidden_width", "int", None, "deep: outputs of each hidden layer; none: "
           f"min({HIDDEN_WIDTH}, d)", minimum=1),
    Option("hidden_inducing", "int", None, "deep: inducing points per hidden layer; none: as "
           "num_inducing", minimum=1),
    Option("hidden_orthogonal", "int", None, "deep: orthogonal inducing points per hidden "
           "layer; none: as num_orthogonal", minimum=0),
    Option("num_predict_samples", "int", 10, "deep: samples propagated through the hidden "
           "layers at prediction", minimum=1),
    SOLVEGP_OPTIONS[-1],
)
"""The options of ``solvegp``: SOLVE-GP's, then the deep model's."""

register(MethodSpec(
    key="solvegp",
    factory=build_solvegp_key,
    tasks=TASKS,
    summary="SOLVE-GP: M standard + M2 orthogonal inducing points, minibatch ELBO (or "
            "collapsed); layers > 1: SOLVE-DGP",
    options=DGP_OPTIONS, **PIPELINE["solvegp"],
))
