"""The import paths users had before the families became packages (issue #45) still work."""

from __future__ import annotations

import importlib

import pytest

# Each former module and the public names it had: its __all__ and the constants it defined.
FORMER = {
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
    "gpscale.methods.cagp_sharded": [
        "ShardedCaGPLoss", "ShardedCaGPState", "condition", "expected_log_lik", "kl", "loss",
        "predict", "projected_nll"],
    "gpscale.methods.ggp_sharded": [
        "DEFAULT_CHUNK", "ShardedGGPLoss", "predict", "reduce_statistics", "shard_statistics",
        "statistics"],
}
MOVED = {"gpscale.methods.cagp_sharded": "gpscale.methods.cagp.sharded",
         "gpscale.methods.ggp_sharded": "gpscale.methods.ski.sharded"}


@pytest.mark.parametrize("path", sorted(FORMER))
def test_a_former_module_path_imports_with_its_public_names(path):
    module = importlib.import_module(path)
    missing = sorted(name for name in FORMER[path] if not hasattr(module, name))
    assert not missing, f"{path} lost {missing}"
    assert set(FORMER[path]) <= set(module.__all__)


@pytest.mark.parametrize("path", sorted(MOVED))
def test_a_former_data_parallel_path_re_exports_the_same_objects(path):
    former, home = importlib.import_module(path), importlib.import_module(MOVED[path])
    assert all(getattr(former, name) is getattr(home, name) for name in home.__all__)
    assert sorted(former.__all__) == sorted(home.__all__)


def test_each_key_is_registered_by_its_family_package():
    from gpscale.methods import METHODS

    keys = {"cagp-opt", "cagp-cg", "iterncgp", "sod-laplace", "ski", "ggp", "softki", "solvegp"}
    assert keys <= set(METHODS)
    modules = {METHODS[k].factory.__module__ for k in keys}
    assert modules == {"gpscale.methods.cagp.model", "gpscale.methods.iterncgp.model",
                       "gpscale.methods.iterncgp.sod_laplace", "gpscale.methods.ski.model",
                       "gpscale.methods.softki.model", "gpscale.methods.solvegp.model"}
