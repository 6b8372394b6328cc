"""IterNCGP: computation-aware Laplace inference for non-conjugate likelihoods (``iterncgp``),
and its subset-of-data baseline (``sod-laplace``).

Tatzel, Wenger, Schneider & Hennig (2024), "Accelerating Non-Conjugate Gaussian Processes By
Trading Off Computation For Uncertainty", arXiv:2310.20285 (notes/000_iterncgp.md). Newton's
method on the Laplace objective as a sequence of GP regressions on pseudo-targets, each solved
approximately by IterGP from the recycled (and compressed) actions of the steps before; the
posterior's variance counts the computation not done. Classification (Bernoulli, softmax) and
counts (Poisson).

==================  =============================================================================
``model``           :class:`IterNCGP`: the outer Newton loop (Alg. 1), prediction, the factory
                    and the registration of ``iterncgp``
``solver``          IterGP with a virtual solver run: the inner loop, recycling and compression
                    (Algs. 2 and 3), :class:`IterNCGPState`
``newton``          the Newton step's line search and trust radius, the factory's Newton options
``latent``          the latent GP: likelihood and kernel per task, the pre-fit options, the
                    kernel products (:class:`~gpscale.methods.iterncgp.latent.LatentKernel`)
                    and the predictive per likelihood
``composed``        the kernel given as an expression: its start values beside the
                    ``lengthscale`` and ``outputscale`` options, and why it is not pre-fitted
``held_distances``  kernel products from distances held across hyperparameter trials
                    (one named isotropic kernel; an expression takes the plain products)
``variational``     the variational refinement of the Laplace posterior (beyond the paper)
``evidence``        the Laplace and variational evidence the kernel hyperparameters learn on
``learning``        the kernel-learning methods of :class:`IterNCGP` on that evidence
``pipeline``        what the pipeline needs beside the options, for both keys: training defaults
                    per preset, the SVGP pre-fit of a fixed kernel, small test options
``sod_laplace``     ``sod-laplace``: dense Laplace on a random subset (the paper's baseline)
==================  =============================================================================

Importing the package registers ``iterncgp`` and ``sod-laplace``.
"""

from gpscale.linalg.policies.unit_vector import UnitVectorPolicy
from gpscale.methods.iterncgp.latent import PredictiveOptions
from gpscale.methods.iterncgp.model import POLICIES, IterNCGP, build_iterncgp
from gpscale.methods.iterncgp.sod_laplace import SoDLaplace, SoDLaplaceState, build_sod_laplace
from gpscale.methods.iterncgp.solver import (
    IterativeResidualPolicy,
    IterNCGPState,
    NewtonStep,
    PreconditionedResidualPolicy,
    Recycling,
    Stopping,
)
from gpscale.methods.iterncgp.variational import Variational

__all__ = [
    "IterNCGP", "IterNCGPState", "NewtonStep", "POLICIES", "PredictiveOptions", "Recycling",
    "IterativeResidualPolicy", "PreconditionedResidualPolicy", "SoDLaplace", "SoDLaplaceState",
    "Stopping", "UnitVectorPolicy", "Variational",
    "build_iterncgp", "build_sod_laplace",
]
