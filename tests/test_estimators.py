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
