"""SKI and GGP: structured kernel interpolation, and the same model from sufficient statistics
(``ski``, ``ggp``; inputs of at most 3 dimensions, or sums of kernels on groups of at most 3
inputs).

Wilson & Nickisch (2015), KISS-GP / SKI; Yadav, Sheldon & Musco (2021), "Faster Kernel
Interpolation for Gaussian Processes", arXiv:2101.11751 (notes/002_fki.md). SKI approximates
K(X, X) by W K_G Wᵀ (W sparse interpolation onto a regular grid of m nodes, K_G structured on
the grid) and runs CG on n-vectors. GGP (the paper's GSGP) computes WᵀW, Wᵀy, yᵀy and n once,
in one streaming pass, and then runs the same iterations in m dimensions, at a cost per
iteration independent of n.

================  ==============================================================================
``model``         :class:`SKI` and :class:`GGP`: the two models, their predictive, the factories
                  and the registration of their keys
``statistics``    :class:`SufficientStatistics` and :func:`sufficient_statistics` (the streaming
                  pass), and the resolution of the grid options
``solve``         GGP's m-dimensional solves and the :class:`GridState` they assemble
``pipeline``      what the pipeline needs beside the options: training defaults per preset, small
                  test options
``sharded``       GGP's statistics from per-rank shards for data-parallel training
                  (:meth:`GGP.shard_plan`)
``additive``      additive GGP: ``ggp`` with a sum of kernels on groups of at most 3 inputs, one
                  grid per group (:class:`AdditiveGGP`, its statistics and the refusals)
``groups``        the terms of an additive kernel by input group: refusals, grid kernels, reach,
                  grid sizes (terms on the same inputs share one grid)
``rows_solve``    SKI's n-dimensional CG and variance on the training rows, one grid or stacked
``additive_ski``  additive SKI: ``ski`` with the same expressions (:class:`AdditiveSKI`)
================  ==============================================================================

Importing the package registers ``ski`` and ``ggp``.
"""

from gpscale.methods.ski.additive import AdditiveGGP
from gpscale.methods.ski.additive_ski import AdditiveSKI
from gpscale.methods.ski.model import GGP, SKI, SOLVERS, VARIANCES, build_ggp, build_ski
from gpscale.methods.ski.solve import GridState
from gpscale.methods.ski.statistics import SufficientStatistics, sufficient_statistics

__all__ = ["AdditiveGGP", "AdditiveSKI", "GGP", "SKI", "GridState", "SufficientStatistics",
           "build_ggp", "build_ski", "sufficient_statistics", "SOLVERS", "VARIANCES"]
