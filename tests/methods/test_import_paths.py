"""Each family package exports its public names, and registers its method keys."""

from __future__ import annotations

import importlib

import pytest

# Each family package and the public names it exports (in its __all__).
PUBLIC = {
    "gpscale.methods.cagp": [
        "OBJECTIVES", "CaGP", "CaGPState", "IterativePosterior", "build_cagp_cg",
        "build_cagp_opt", "action_gram", "gram_cholesky", "iterative_posterior", "kernel_times",
        "trace_solve", "warn_float64_fallback", "JITTER_NOISE_FRACTION", "REFRESH_EVERY"],
    "gpscale.methods.iterncgp": [
        "IterNCGP", "IterNCGPState", "NewtonStep", "POLICIES", "PredictiveOptions", "Recycling",
        "IterativeResidualPolicy", "PreconditionedResidualPolicy", "SoDLaplace",
        "SoDLaplaceState", "Stopping", "UnitVectorPolicy", "Variational", "build_iterncgp",
        "build_sod_laplace"],
    "gpscale.methods.ski": [
        "GGP", "SKI", "GridState", "SufficientStatistics", "build_ggp", "build_ski",
        "sufficient_statistics", "SOLVERS", "VARIANCES"],
    "gpscale.methods.softki": [
        "DISTANCES", "OBJECTIVES", "SoftKI", "SoftKIPosterior", "SoftKIState",
        "SoftmaxInterpolation", "build_softki", "PAPER_INIT"],
    "gpscale.methods.solvegp": [
        "OBJECTIVES", "ORTHOGONAL_Q", "InducingFactors", "Projections", "SolveGP",
        "SolveGPState", "WhitenedQ", "build_solvegp", "collapsed_bound", "gauss_hermite",
        "kl_whitened", "optimal_q_u", "optimal_q_v", "DEFAULT_JITTER", "TASKS"],
}


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_a_family_package_exports_its_public_names(path):
    module = importlib.import_module(path)
    missing = sorted(name for name in PUBLIC[path] if not hasattr(module, name))
    assert not missing, f"{path} lost {missing}"
    assert set(PUBLIC[path]) <= set(module.__all__)


def test_each_key_is_registered_by_its_family_package():
    from gpscale.methods import METHODS

    keys = {"cagp-opt", "cagp-cg", "iterncgp", "sod-laplace", "ski", "ggp", "softki", "solvegp"}
    assert keys <= set(METHODS)
    modules = {METHODS[k].factory.__module__ for k in keys}
    assert modules == {"gpscale.methods.cagp.model", "gpscale.methods.iterncgp.model",
                       "gpscale.methods.iterncgp.sod_laplace", "gpscale.methods.ski.model",
                       "gpscale.methods.softki.model", "gpscale.methods.solvegp.dgp"}
