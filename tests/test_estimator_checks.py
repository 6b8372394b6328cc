"""scikit-learn's estimator checks over every regression key and the classifier (SVGP's in the
default suite, the other keys' among the slow tests).

Short training (20 epochs) and small inducing sets keep each check fast. Float64 training for the
float32-by-default methods whose predictions on a subset must equal those on the whole set to
1e-7 (float32 GEMM blocking differs with the batch size). SKI and GGP build a grid over the
inputs and support d ≤ 3 only; the checks that draw 4–10-dimensional data are expected to fail
with that clear ValueError. The SVGP classifier's softmax probabilities are Monte Carlo
estimates with draws shared by every point, so they pass the order and subset invariance checks.

A fit with a fixed ``random_state`` is reproduced exactly however loaded the machine is: the
estimators train to convergence or their epoch cap and stop on the clock only when ``max_time``
is given, so the idempotence and data-type checks pass with the defaults when the machine's
speed changes between the fits they compare.
"""

from __future__ import annotations

import time

import pytest
from sklearn.utils.estimator_checks import (
    _regression_dataset,
    check_estimators_data_not_an_array,
    check_fit_idempotent,
    parametrize_with_checks,
)

from gpscale.estimators import GPClassifier, GPRegressor
from gpscale.methods import METHODS

SMALL = {"sgpr": {"num_inducing": 8}, "svgp": {"num_inducing": 8},
         "cagp-opt": {"num_actions": 4}, "cagp-cg": {"num_actions": 4, "dtype": "float64"},
         "ski": {"grid_size": 8}, "ggp": {"grid_size": 8}, "softki": {"num_inducing": 8},
         "solvegp": {"num_inducing": 4, "num_orthogonal": 4, "dtype": "float64"}}
REGRESSION_KEYS = sorted(k for k, spec in METHODS.items()  # exact: test_estimators; the checks'
                         if "regression" in spec.tasks and k != "exact"  # data are not images
                         and spec.inputs == "vectors")
GRID_CHECKS = ("check_n_features_in_after_fitting", "check_positive_only_tag_during_fit",
               "check_estimators_dtypes", "check_dtype_object", "check_regressors_train",
               "check_regressor_data_not_an_array", "check_regressors_no_decision_function",
               "check_regressors_int")
GRID_REASON = "ski/ggp support d ≤ 3; this check uses more input dimensions"

ESTIMATORS = [GPRegressor(method=key, epochs=20, lr=0.1, **SMALL.get(key, {}))
              for key in REGRESSION_KEYS] + [
    GPClassifier(method="svgp", epochs=20, lr=0.1, num_inducing=8, dtype="float64"),
    GPClassifier(method="iterncgp", lengthscale=1.0, outputscale=1.0)]


def _expected_failures(estimator):
    if estimator.method in ("ski", "ggp"):
        return {name: GRID_REASON for name in GRID_CHECKS}
    return {}


# the SVGP regressor and classifier in `make test`; every other key among the slow tests
QUICK = [e for e in ESTIMATORS if e.method == "svgp"]


@parametrize_with_checks(QUICK, expected_failed_checks=_expected_failures)
def test_sklearn_estimator_checks_svgp(estimator, check):
    check(estimator)


@pytest.mark.slow
@parametrize_with_checks([e for e in ESTIMATORS if e.method != "svgp"],
                         expected_failed_checks=_expected_failures)
def test_sklearn_estimator_checks_every_other_key(estimator, check):
    check(estimator)


@pytest.fixture
def load_changes_between_fits(monkeypatch):
    """A machine whose load changes from one fit to the next: in every second fit each reading
    of ``time.perf_counter`` is 1,000 s after the last (a time budget would end that fit after
    its first epoch), in the others the clock runs as it does."""
    fits, offset, real = [0], [0.0], time.perf_counter

    def perf_counter() -> float:
        offset[0] += 1000.0 * (fits[0] % 2 == 0)
        return real() + offset[0]

    fit_tensors = GPRegressor._fit_tensors

    def counted(self, *args):
        fits[0] += 1
        return fit_tensors(self, *args)

    monkeypatch.setattr(time, "perf_counter", perf_counter)
    monkeypatch.setattr(GPRegressor, "_fit_tensors", counted)


def _check_not_an_array(name, estimator):
    X, y = _regression_dataset()
    check_estimators_data_not_an_array(name, estimator, X[:60], y[:60], "NotAnArray")


@pytest.mark.parametrize("check", [check_fit_idempotent, _check_not_an_array],
                         ids=["check_fit_idempotent", "check_regressor_data_not_an_array"])
def test_default_fits_reproduce_on_a_loaded_machine(load_changes_between_fits, check):
    """The method's default training (no ``epochs``, no ``max_time``) gives the same model
    twice under a fixed ``random_state``, whatever the clock reads."""
    estimator = GPRegressor(method="exact")
    check(type(estimator).__name__, estimator)


def test_large_fits_keep_the_default_time_budget(monkeypatch, caplog):
    """Above ``UNTIMED_MAX_ROWS`` rows the command line's budget applies (the plan line says
    so); at or below it there is none."""
    import logging

    import numpy as np

    import gpscale.estimators as estimators

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 1)), rng.normal(size=40)
    for limit, timed in ((40, False), (39, True)):
        monkeypatch.setattr(estimators, "UNTIMED_MAX_ROWS", limit)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gpscale.fit"):
            GPRegressor(method="exact").fit(X, y)
        plan = next(r.getMessage() for r in caplog.records if "training for at most" in r.message)
        assert (" or 300 s" in plan) == timed, plan
