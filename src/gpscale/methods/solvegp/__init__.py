"""SOLVE-GP: sparse orthogonal variational inference (``solvegp``; regression, classification).

Shi, Titsias & Mnih (2020), "Sparse Orthogonal Variational Inference for Gaussian Processes",
arXiv:1910.10596 (notes/004_solvegp.md). The GP splits into the part that M standard inducing
points carry and an orthogonal residual GP with M2 inducing points of its own; the minibatch
ELBO needs Cholesky factors of size M and M2, never M + M2. With no orthogonal points it is SVGP.

===============  =================================================================================
``model``        :class:`SolveGP`: conditioning, the ELBO (or the collapsed bound), the predictive
                 and the one-layer factory
``dgp``          the ``solvegp`` key: one layer, or a SOLVE-DGP on vectors (``layers`` > 1), and
                 its registration
``deep``         deep GPs of SOLVE-GP layers (:class:`DeepSolveGP`): hidden layers on vectors or
                 on image patches, doubly stochastic training, the mixture predictive
``parts``        what needs no module: the Alg. 1 quantities as dataclasses (:class:`SolveGPState`),
                 the whitened KL, Gauss–Hermite expectations, the collapsed bound with its optimal
                 q(v⊥) and q(u), k-means initialisation and the declared options
``pipeline``     what the pipeline needs beside the options: training defaults per preset, the
                 inducing sets on a GPU, small test options
``conv``         §4's convolutional models on images: :class:`ConvSolveGP` (``conv-solvegp``) and
                 :class:`ConvSVGP` (``conv-svgp``), SOLVE-GP / SVGP whose inducing variables are
                 patch values, the deep convolutional GPs of Table 5 (``layers``), with their
                 factory and registration
``conv_kernel``  the convolutional (TICK) kernel and the covariances of its inducing patches
``images``       images as flattened rows: their shape, and how patches are cut from them
``likelihoods``  the expected log-likelihoods and predictives of each likelihood, and the
                 robust-max likelihood
===============  =================================================================================

Importing the package registers ``solvegp``, ``conv-solvegp`` and ``conv-svgp``.
"""

from gpscale.methods.solvegp.conv import ConvSolveGP, ConvSVGP, build_conv_solvegp
from gpscale.methods.solvegp.conv_kernel import ConvKernel
from gpscale.methods.solvegp.deep import DeepSolveGP, HiddenLayer
from gpscale.methods.solvegp.dgp import build_solvegp_key
from gpscale.methods.solvegp.images import ImageShape, PatchGeometry, infer_image_shape
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

__all__ = ["ConvKernel", "DeepSolveGP", "HiddenLayer", "build_solvegp_key", "ConvSVGP",
           "ConvSolveGP", "ImageShape", "PatchGeometry",
           "build_conv_solvegp", "infer_image_shape", "OBJECTIVES", "ORTHOGONAL_Q",
           "InducingFactors", "Projections", "SolveGP",
           "SolveGPState", "WhitenedQ", "build_solvegp", "collapsed_bound", "gauss_hermite",
           "kl_whitened", "optimal_q_u", "optimal_q_v", "DEFAULT_JITTER", "TASKS"]
