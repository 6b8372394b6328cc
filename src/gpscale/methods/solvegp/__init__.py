"""SOLVE-GP: sparse orthogonal variational inference (``solvegp``; regression, classification).

Shi, Titsias & Mnih (2020), "Sparse Orthogonal Variational Inference for Gaussian Processes",
arXiv:1910.10596 (notes/004_solvegp.md). The GP splits into the part that M standard inducing
points carry and an orthogonal residual GP with M2 inducing points of its own; the minibatch
ELBO needs Cholesky factors of size M and M2, never M + M2. With no orthogonal points it is SVGP.

============  ====================================================================================
``model``     :class:`SolveGP`: conditioning, the ELBO (or the collapsed bound), the predictive,
              the factory and the registration of ``solvegp``
``parts``     what needs no module: the Alg. 1 quantities as dataclasses (:class:`SolveGPState`),
              the whitened KL, Gauss–Hermite expectations, the collapsed bound with its optimal
              q(v⊥) and q(u), k-means initialisation and the declared options
``pipeline``  what the pipeline needs beside the options: training defaults per preset, the
              inducing sets on a GPU, small test options
============  ====================================================================================

Importing the package registers ``solvegp``.
"""

from gpscale.methods.solvegp.model import DEFAULT_JITTER, TASKS, SolveGP, build_solvegp
from gpscale.methods.solvegp.parts import (
    OBJECTIVES,
    ORTHOGONAL_Q,
    InducingFactors,
    Projections,
    SolveGPState,
    WhitenedQ,
    collapsed_bound,
    gauss_hermite,
    kl_whitened,
    optimal_q_u,
    optimal_q_v,
)

__all__ = ["OBJECTIVES", "ORTHOGONAL_Q", "InducingFactors", "Projections", "SolveGP",
           "SolveGPState", "WhitenedQ", "build_solvegp", "collapsed_bound", "gauss_hermite",
           "kl_whitened", "optimal_q_u", "optimal_q_v", "DEFAULT_JITTER", "TASKS"]
