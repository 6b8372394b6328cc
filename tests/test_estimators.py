"""GPRegressor / GPClassifier: scikit-learn conventions, options, persistence, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpscale
from gpscale.estimators import GPClassifier, GPRegressor


# Every scikit-learn check applies and passes: none is listed as an expected failure. (Checks for
# sample weights are not generated because ``fit`` takes none; sklearn itself skips the pandas and
# array-API checks when those packages are absent.)
@parametrize_with_checks([GPRegressor(method="exact", epochs=5, lr=0.1)])
def test_sklearn_estimator_checks(estimator, check):
    """scikit-learn's estimator checks for the regressor (exact GP, short training)."""
    check(estimator)


@pytest.fixture
def regression_data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(120, 2))
    y = 3.0 + 2.0 * np.sin(2 * X[:, 0]) + 0.05 * rng.standard_normal(120)
    return X, y


def test_regressor_fits_smooth_function(regression_data):
    """Exact GP on a smooth function: small error in original units, std above noise level."""
    X, y = regression_data
    reg = GPRegressor(method="exact", epochs=60, lr=0.1).fit(X[:100], y[:100])
    mean, std = reg.predict(X[100:], return_std=True)
    assert np.sqrt(np.mean((mean - y[100:]) ** 2)) < 0.15
    assert std.shape == (20,) and bool((std > 0.01).all())
    assert reg.score(X[100:], y[100:]) > 0.98


def test_return_std_is_predictive_std_in_target_units(regression_data):
    """std = y_std * sqrt(latent variance + noise) of the standardised model."""
    X, y = regression_data
    reg = GPRegressor(method="exact", epochs=5).fit(X, y)
    _, std = reg.predict(X[:7], return_std=True)
    pred = reg._predictive(X[:7])
    y_var = float(reg.transform_.inverse_variance(torch.ones(1, dtype=torch.float64)))
    expected = np.sqrt(y_var * (pred.variance + pred.noise).numpy())
    np.testing.assert_allclose(std, expected, rtol=1e-6)


def test_method_options_are_parameters():
    """Method options round-trip through get_params/set_params/clone like parameters."""
    reg = GPRegressor(method="sgpr", num_inducing=16, kernel="rbf")
    params = reg.get_params()
    assert params["num_inducing"] == 16 and params["kernel"] == "rbf"
    reg.set_params(num_inducing=8, epochs=3)
    copy = clone(reg)
    assert copy.get_params()["num_inducing"] == 8 and copy.epochs == 3


def test_save_load_round_trip(tmp_path, regression_data):
    """A saved estimator predicts identically after loading."""
    X, y = regression_data
    reg = GPRegressor(method="sgpr", num_inducing=20, epochs=5).fit(X, y)
    gpscale.save(reg, tmp_path / "reg.pt")
    loaded = gpscale.load(tmp_path / "reg.pt")
    np.testing.assert_array_equal(loaded.predict(X[:9]), reg.predict(X[:9]))
    np.testing.assert_array_equal(loaded.predict(X[:9], return_std=True)[1],
                                  reg.predict(X[:9], return_std=True)[1])


def test_wrong_feature_count_at_predict(regression_data):
    X, y = regression_data
    reg = GPRegressor(method="exact", epochs=2).fit(X, y)
    with pytest.raises(ValueError, match="3 features"):
        reg.predict(np.zeros((2, 3)))


def test_nan_input_is_rejected(regression_data):
    X, y = regression_data
    X = X.copy()
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        GPRegressor(method="exact", epochs=2).fit(X, y)


def test_classifier_binary_with_string_labels():
    """Binary SVGP classification: separable data, arbitrary labels, probabilities sum to 1."""
    rng = np.random.default_rng(1)
    X = rng.uniform(-2, 2, size=(300, 2))
    labels = np.where(X[:, 0] + X[:, 1] > 0, "pos", "neg")
    clf = GPClassifier(method="svgp", num_inducing=16, epochs=40, lr=0.05).fit(X, labels)
    proba = clf.predict_proba(X)
    assert list(clf.classes_) == ["neg", "pos"]
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-6)
    assert clf.score(X, labels) > 0.9


def test_classifier_multiclass():
    rng = np.random.default_rng(2)
    centers = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
    y = rng.integers(0, 3, 300)
    X = centers[y] + 0.4 * rng.standard_normal((300, 2))
    clf = GPClassifier(method="svgp", num_inducing=16, epochs=40, lr=0.05).fit(X, y)
    assert clf.predict_proba(X).shape == (300, 3)
    assert clf.score(X, y) > 0.9


def test_classifier_needs_two_classes():
    with pytest.raises(ValueError, match="at least 2 classes"):
        GPClassifier(method="svgp").fit(np.zeros((5, 1)), np.zeros(5))


def test_classifier_refuses_a_target_that_is_not_class_labels():
    """Integers all distinct (an identifier, a count) would be one class per row: refused as
    ``gpscale fit --task classification`` refuses them (fractional numbers: scikit-learn's
    check)."""
    X = np.random.default_rng(0).uniform(size=(30, 2))
    with pytest.raises(ValueError, match="y has 30 distinct values in 30 rows: fewer than 2 "
                                         "rows per class"):
        GPClassifier(method="svgp").fit(X, np.arange(30))
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        GPClassifier(method="svgp").fit(X, X[:, 0])


def test_fit_is_reproducible_under_random_state(regression_data):
    X, y = regression_data
    a = GPRegressor(method="svgp", num_inducing=10, epochs=3, random_state=3).fit(X, y)
    b = GPRegressor(method="svgp", num_inducing=10, epochs=3, random_state=3).fit(X, y)
    np.testing.assert_array_equal(a.predict(X[:5]), b.predict(X[:5]))
    assert torch.get_default_dtype() == torch.float64  # conftest default left untouched


@pytest.mark.parametrize("labels", [np.array([0, 1]), np.array(["a", "b", "c"])])
def test_iterncgp_classifier_with_default_options(labels):
    """GPClassifier(method="iterncgp") needs no options: pre-fit kernel, Laplace, probabilities."""
    rng = np.random.default_rng(3)
    centers = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])[: len(labels)]
    index = rng.integers(0, len(labels), 240)
    X = centers[index] + 0.5 * rng.standard_normal((240, 2))
    clf = GPClassifier(method="iterncgp").fit(X, labels[index])
    proba = clf.predict_proba(X)
    assert proba.shape == (240, len(labels))
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-6)
    assert list(clf.classes_) == sorted(labels.tolist())
    assert clf.score(X, labels[index]) > 0.9


@pytest.mark.parametrize("params, name", [
    ({"lr": "fast"}, "lr"), ({"lr": float("nan")}, "lr"), ({"lr": float("inf")}, "lr"),
    ({"lr": 0.0}, "lr"), ({"lr": -0.1}, "lr"), ({"lr": 1e30}, "lr"), ({"epochs": 0}, "epochs"),
    ({"epochs": 2.5}, "epochs"), ({"batch_size": "big"}, "batch_size"),
    ({"optimizer": "sgd"}, "optimizer"), ({"scheduler": "cosine"}, "scheduler"),
    ({"dtype": "float16"}, "dtype"), ({"max_time": 0}, "max_time"),
    ({"standardize": "yes"}, "standardize"), ({"random_state": "seven"}, "random_state"),
    ({"random_state": -1}, "random_state"), ({"method": 3}, "method")])
def test_bad_parameters_name_the_parameter(regression_data, params, name):
    """Finding 10: each parameter is checked in fit (scikit-learn's _parameter_constraints);
    the error, a ValueError and a TypeError at once, names it."""
    X, y = regression_data
    reg = GPRegressor(**{"method": "exact", "epochs": 2, **params})
    with pytest.raises(ValueError, match=f"The '{name}' parameter of GPRegressor must be"):
        reg.fit(X, y)
    with pytest.raises(TypeError, match=f"'{name}' parameter"):
        reg.fit(X, y)


def test_sklearn_param_validation_check():
    """scikit-learn's own check of _parameter_constraints (not in check_estimator's list)."""
    from sklearn.utils.estimator_checks import check_param_validation

    check_param_validation("GPRegressor", GPRegressor(method="exact", epochs=2))
    check_param_validation("GPClassifier", GPClassifier(method="svgp", epochs=2))


def test_random_state_none_draws_from_numpys_global_rng(regression_data):
    """random_state=None (scikit-learn's convention) works; np.random.seed reproduces it; a
    RandomState instance is accepted too."""
    X, y = regression_data
    fits = []
    for _ in range(2):
        np.random.seed(5)
        fits.append(GPRegressor(method="svgp", num_inducing=10, epochs=3,
                                random_state=None).fit(X, y).predict(X[:5]))
    np.testing.assert_array_equal(*fits)
    reg = GPRegressor(method="svgp", num_inducing=10, epochs=3,
                      random_state=np.random.RandomState(1)).fit(X, y)
    assert np.isfinite(reg.predict(X[:5])).all()


def test_nonfinite_inputs_name_the_rows(regression_data):
    X, y = regression_data
    bad_y = y.copy()
    bad_y[[3, 17]] = [np.nan, np.inf]
    with pytest.raises(ValueError, match=r"y contains NaN or inf values \(first rows: \[3, 17\]"):
        GPRegressor(method="exact", epochs=2).fit(X, bad_y)
    reg = GPRegressor(method="exact", epochs=2).fit(X, y)
    bad_x = X[:6].copy()
    bad_x[4, 0] = np.inf
    with pytest.raises(ValueError, match=r"X contains NaN or inf values \(first rows: \[4\]"):
        reg.predict(bad_x)
    small = GPRegressor(method="exact", epochs=2).fit(X / 100, y)  # x_std < 1
    with pytest.raises(ValueError, match=r"X rows \[0, 1\] \(0-based\) are beyond float64 once "
                                         "standardised"):
        small.predict(np.full((2, 2), 1.7e308))


def _poison(est, rows):
    """Make ``est``'s model return NaN predictions at the given test rows."""
    predict = est.model_.predict

    def poisoned(state, x):
        pred = predict(state, x)
        mean = pred.mean.clone()
        mean[rows] = float("nan")
        probs = None if pred.probs is None else pred.probs.clone()
        if probs is not None:
            probs[rows] = float("nan")
        return type(pred)(mean, pred.variance, pred.noise, probs, pred.rate)

    est.model_.predict = poisoned


def test_nonfinite_predictions_are_an_error_naming_the_rows(regression_data):
    """Item 4: a NaN or inf prediction never leaves predict or predict_proba."""
    X, y = regression_data
    reg = GPRegressor(method="exact", epochs=2).fit(X, y)
    _poison(reg, [2, 5])
    for call in (lambda: reg.predict(X[:8]), lambda: reg.predict(X[:8], return_std=True)):
        with pytest.raises(ValueError, match=r"predictive mean or standard deviation is NaN or "
                                             r"inf for rows \[2, 5\] of X \(0-based\)"):
            call()
    labels = (X[:, 0] > 0).astype(int)
    clf = GPClassifier(method="svgp", num_inducing=8, epochs=2).fit(X, labels)
    _poison(clf, [1])
    for call in (clf.predict_proba, clf.predict):
        with pytest.raises(ValueError, match=r"class probability is NaN or inf for rows \[1\]"):
            call(X[:4])


def test_device_is_where_the_fitted_model_is(regression_data):
    """``device_`` reads the model's device (after an out-of-memory fallback, the CPU), and is
    refused before ``fit``."""
    from sklearn.exceptions import NotFittedError

    X, y = regression_data
    reg = GPRegressor(method="exact", epochs=3)
    with pytest.raises(NotFittedError):
        _ = reg.device_
    reg.fit(X, y)
    assert reg.device_ == "cpu"
    reg.model_.to("meta")  # wherever the model went, device_ follows it
    assert reg.device_ == "meta"
