"""scikit-learn estimators: ``GPRegressor`` and ``GPClassifier``.

Each wraps one method of the registry (``method="auto"``, the default, picks one from the
data), ``training.fit`` and the method's predictive::

    reg = GPRegressor(method="svgp", epochs=20, num_inducing=256).fit(X, y)
    mean, std = reg.predict(X_test, return_std=True)

Inputs (and regression targets) are standardised with training statistics by default; columns
constant on the training set are dropped (not for an image method, ``conv-solvegp``: its pixels
are used as they are). Any keyword that is not an estimator parameter is a
method option (``num_inducing``, ``kernel``, ...) and round-trips through ``get_params`` /
``set_params`` like a parameter, so the estimators clone and grid-search as scikit-learn expects.
Method options are checked against the method's declaration (``gpscale methods KEY``) when the
estimator is made and again in ``fit``: an unknown name or an ill-typed value is a ``ValueError``
listing the valid options. Training options default to the method's own
(:data:`gpscale.training.METHOD_DEFAULTS`); ``preset`` chooses among its presets as
``gpscale fit --preset`` does (``"optimum"`` trains a full-batch method on to its objective's
optimum instead of stopping where its gains fall below the loss's noise). ``device="cuda"``
(or ``"auto"``) trains and predicts on a GPU; predictions come back as NumPy arrays either way.

The estimator's own parameters are checked in ``fit``, as scikit-learn does, against
``_parameter_constraints``: a wrong type or value (``lr="fast"``, ``lr=0``, ``lr`` above
:data:`~gpscale.training.config.MAX_LR`, ``epochs=0``) is
scikit-learn's ``InvalidParameterError`` (a ``ValueError`` and a ``TypeError``) naming the
parameter and what it accepts. ``random_state`` follows scikit-learn: an integer seeds training
(the default 0, so that two fits agree), ``None`` draws a seed from NumPy's global random state
(``np.random.seed`` makes that reproducible) and a ``RandomState`` instance draws one from itself.
On up to :data:`UNTIMED_MAX_ROWS` rows training stops on convergence or at the method's epoch
cap, never on the clock unless ``max_time`` is given: a fit that a time budget stops depends on the
machine's speed and load, so only a fit without one is reproduced exactly by a fixed
``random_state``. On more rows the method's default budget applies, as on the command line, so
that a large fit ends in bounded time (pass ``max_time`` to choose it); so it does for an image
method (``conv-solvegp``), whose epochs take minutes.

NaN or inf in X or y is a ``ValueError`` naming the first rows; so is a NaN or inf prediction
(``predict``, ``predict_proba``): no non-finite number is returned.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from gpscale.data.transforms import Standardizer
from gpscale.distributions import Predictive
from gpscale.io import model_from_payload, model_payload, register_loader
from gpscale.methods import auto
from gpscale.methods.auto import AUTO
from gpscale.methods.base import module_device
from gpscale.methods.options import composed_dtype, kernel_in_model_units
from gpscale.methods.registry import METHODS, get_spec
from gpscale.run import plan_text
from gpscale.training import FitConfig, History, resolve_fit_config
from gpscale.training.config import (
    DEFAULT_BUDGET_S,
    DTYPES,
    MAX_LR,
    OPTIMIZERS,
    PRESETS,
    SCHEDULERS,
)
from gpscale.training.harness import cast, train_method
from gpscale.training.race import final_budget, pick_auto, warm_options
from gpscale.validation import check_class_labels, check_finite_output, check_x, nonfinite_rows

__all__ = ["GPRegressor", "GPClassifier", "estimator_from_payload", "UNTIMED_MAX_ROWS"]

UNTIMED_MAX_ROWS = 20_000
"""Up to this many training rows an estimator trains without a wall-clock budget unless
``max_time`` is given (reproducible fits); from there on the method's default budget applies."""

_TRAINING_KEYS = ("optimizer", "lr", "epochs", "batch_size", "max_time", "scheduler", "device",
                  "preset")


class _GPEstimator(BaseEstimator):
    """Shared fit/predict plumbing; subclasses fix the task and the target handling."""

    _task = "regression"

    # Checked in fit (scikit-learn's _validate_params); method options are checked against
    # the method's own declaration instead.
    _parameter_constraints: dict[str, list[Any]] = {
        "method": [str],
        "epochs": [Interval(Integral, 1, None, closed="left"), None],
        "lr": [Interval(Real, 0, MAX_LR, closed="right"), None],
        "batch_size": [Interval(Integral, 1, None, closed="left"), None],
        "optimizer": [StrOptions(set(OPTIMIZERS)), None],
        "max_time": [Interval(Real, 0, None, closed="neither"), None],
        "scheduler": [StrOptions(set(SCHEDULERS)), None],
        "preset": [StrOptions(set(PRESETS))],
        "dtype": [StrOptions(set(DTYPES)), None],
        "device": [str, None],
        "standardize": ["boolean"],
        "random_state": ["random_state"],
        "progress": ["boolean"],
    }

    def __init__(self, method: str = "auto", *, epochs: int | None = None,
                 lr: float | None = None, batch_size: int | None = None,
                 optimizer: str | None = None, max_time: float | None = None,
                 scheduler: str | None = None, preset: str = "default",
                 dtype: str | None = None,
                 device: str | None = None, standardize: bool = True,
                 random_state: int | np.random.RandomState | None = 0,
                 progress: bool = False, **options: Any):
        self.method = method
        self.epochs = epochs
        self.lr = lr
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.max_time = max_time
        self.scheduler = scheduler
        self.preset = preset
        self.dtype = dtype
        self.device = device
        self.standardize = standardize
        self.random_state = random_state
        self.progress = progress
        self._options = dict(options)
        self._check_options()

    def _check_options(self) -> dict[str, Any]:
        """The method options, typed; ``ValueError`` for an unknown name or ill-typed value.

        A ``method`` that is not a registered key is left for ``fit`` to report (scikit-learn
        expects ``__init__`` and ``set_params`` to accept any value of a declared parameter).
        """
        if _is_auto(self.method):
            auto.check_options(self._task, self._options)
            return dict(self._options)
        if not (isinstance(self.method, str) and self.method in _registered()):
            return dict(self._options)
        return get_spec(self.method).resolve(self._options, fill_defaults=False)

    # -- scikit-learn parameter protocol, extended with method options -------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        params = super().get_params(deep=deep)
        params.update(self._options)
        return params

    def set_params(self, **params: Any) -> _GPEstimator:
        own = set(self._get_param_names())
        for key, value in params.items():
            if key in own:
                setattr(self, key, value)
            else:
                self._options[key] = value
        return self

    # -- fitting --------------------------------------------------------------------------------
    def _check_xy(self, X, y, **kwargs: Any):
        """``validate_data`` for fit, with the parameters checked first and NaN or inf in X
        or y reported by row."""
        self._validate_params()
        _check_finite_targets(y)
        X, y = validate_data(self, X, y, dtype=np.float64, ensure_all_finite=False, **kwargs)
        check_x(torch.from_numpy(X))
        return X, y

    def _fit_tensors(self, x: torch.Tensor, y: torch.Tensor, num_classes: int | None) -> None:
        if x.shape[0] < 2:
            raise ValueError(f"{type(self).__name__} needs at least 2 samples; got "
                             f"n_samples={x.shape[0]}")
        seed = _seed(self.random_state)
        # pixels stay as they are; auto never picks an image method
        images = not _is_auto(self.method) and get_spec(self.method).inputs == "images"
        self.transform_ = (Standardizer.fit(x, y, standardize_y=self._task == "regression",
                                            standardize_x=not images)
                           if self.standardize else None)
        names = getattr(self, "feature_names_in_", None)
        given = kernel_in_model_units(dict(self._options), transform=self.transform_,
                                      names=None if names is None else list(names),
                                      num_dims=x.shape[1])
        xy = self._transform_xy(x, y)
        self.method_, options, warm, left = self._choose_method(xy, num_classes, seed, given)
        config = resolve_fit_config(
            self.method_, x.shape[0], dtype=composed_dtype(options, self.dtype), seed=seed,
            progress=bool(self.progress),
            **{k: getattr(self, k) for k in _TRAINING_KEYS})
        if self.max_time is None and x.shape[0] <= UNTIMED_MAX_ROWS and not images:
            # module docstring; after a race the winner trains from its own start, to the end
            config, warm = replace(config, max_time=None), None
        elif left is not None:  # what the race left of the budget
            config = replace(config, max_time=left)
        latents = num_classes if (num_classes or 0) > 2 else 1
        logging.getLogger("gpscale.fit").info(plan_text(self.method_, config, options,
                                                        x.shape[0], latents, self._task))
        train = cast(xy, config, self._task)
        trained = train_method(self.method_, train, task=self._task, num_classes=num_classes,
                               options=options, config=config, seed=seed, warm=warm)
        self.model_ = trained.model
        self.history_: History = trained.history
        self.fit_config_ = config
        # where the model is (the CPU when its conditioning did not fit on the GPU)
        self._train = tuple(t.to(module_device(self.model_)) for t in train)
        self._state = trained.state
        self.n_features_in_ = x.shape[1]

    @property
    def device_(self) -> str:
        """Where the fitted model is and predicts: ``device``, or ``"cpu"`` after training or
        conditioning ran out of GPU memory and fell back to the CPU (with a warning)."""
        check_is_fitted(self, "model_")
        return str(module_device(self.model_))

    def _choose_method(self, train: tuple[torch.Tensor, torch.Tensor],
                       num_classes: int | None, seed: int, given: dict[str, Any]
                       ) -> tuple[str, dict[str, Any], dict[str, torch.Tensor] | None,
                                  float | None]:
        """The method key to fit, its typed options, the parameters to start from and the
        seconds left of the budget: ``method`` as given, or for ``"auto"`` what
        :func:`~gpscale.training.race.pick_auto` resolves on the standardised ``train`` (a
        race on held-out rows, or the rules; its reason in ``method_reason_`` and logged on
        ``gpscale.fit``). An unknown method or option is a ``ValueError``."""
        if not _is_auto(self.method):
            self.method_reason_ = "given"
            return (self.method, get_spec(self.method).resolve(given, fill_defaults=False),
                    None, None)
        x, y = train
        budget = DEFAULT_BUDGET_S if self.max_time is None else float(self.max_time)
        tic = time.perf_counter()
        picked = pick_auto(
            self._task, x, y, num_classes=num_classes, options=given,
            device=FitConfig(device=self.device or "cpu").torch_device, seed=seed,
            budget=budget, epochs=self.epochs,
            config_for=lambda key: resolve_fit_config(
                key, x.shape[0], dtype=composed_dtype(given, self.dtype), seed=seed,
                **{k: getattr(self, k) for k in _TRAINING_KEYS}))
        self.method_reason_ = picked.choice.reason
        key = picked.choice.method
        if picked.race is None:
            return key, picked.options, None, None
        left = final_budget(budget, time.perf_counter() - tic)
        return key, warm_options(key, picked.options, given, picked.warm), picked.warm, left

    def _transform_xy(self, x, y):
        if self.transform_ is None:
            return x, y
        ys = self.transform_.transform_y(y) if self._task == "regression" else y
        return self.transform_.transform_x(x), ys

    def _predictive(self, X) -> Predictive:
        check_is_fitted(self, "model_")
        X = validate_data(self, X, reset=False, dtype=np.float64, ensure_all_finite=False)
        x = check_x(torch.tensor(X, dtype=torch.float64))
        if self.transform_ is not None:
            x = self.transform_.transform_x(x)
            bad = nonfinite_rows(x)
            if bad:
                raise ValueError(f"X rows {bad[:5]} (0-based) are beyond float64 once "
                                 "standardised with the training statistics (far outside the "
                                 "training data); remove or rescale them")
        x = x.to(device=self._train[0].device, dtype=self._train[0].dtype)
        with torch.no_grad():
            return self.model_.predict(self._state, x)

    # -- persistence ----------------------------------------------------------------------------
    def _to_payload(self) -> dict[str, Any]:
        check_is_fitted(self, "model_")
        return {
            "estimator": type(self).__name__,
            "params": self.get_params(deep=False),
            "model": model_payload(self.model_, self._train),
            "transform": None if self.transform_ is None else self.transform_.to_dict(),
            "extra": self._extra_payload(),
            "history": self.history_.state_dict(),
            "n_features_in": self.n_features_in_,
        }

    def _extra_payload(self) -> dict[str, Any]:
        return {}


class GPRegressor(RegressorMixin, _GPEstimator):
    """Gaussian-process regression with any gpscale method.

    ``method="auto"`` (the default) picks one from n, d and memory at ``fit`` and logs why;
    ``method_`` holds the key that was fitted and ``method_reason_`` why (README: which method
    when); ``device_`` where the fitted model is (the CPU after a GPU ran out of memory).

    ``predict(X, return_std=True)`` returns the predictive mean of y and its standard deviation
    (latent variance plus observation noise), in the units of the training targets.

    Example:
        >>> import numpy as np
        >>> X = np.linspace(0, 1, 50)[:, None]; y = np.sin(6 * X[:, 0])
        >>> reg = GPRegressor(method="exact", epochs=20).fit(X, y)
        >>> bool(abs(reg.predict(X) - y).max() < 0.2)
        True
    """

    def fit(self, X, y) -> GPRegressor:
        X, y = self._check_xy(X, y, y_numeric=True)
        self._fit_tensors(torch.tensor(X), torch.tensor(y, dtype=torch.float64), None)
        return self

    def predict(self, X, return_std: bool = False):
        """The predictive mean of y at X, and with ``return_std`` its standard deviation.

        Raises:
            ValueError: NaN or inf in X, or in a prediction (naming the rows).
        """
        pred = self._predictive(X)
        mean, var = pred.mean.detach().double(), pred.observed_variance.detach().double()
        if self.transform_ is not None:
            mean, std = self.transform_.inverse_mean(mean), self.transform_.inverse_std(var)
        else:
            std = var.sqrt()
        mean_np, std_np = mean.cpu().numpy(), std.cpu().numpy()
        check_finite_output(mean_np, std_np, what="predictive mean or standard deviation")
        return (mean_np, std_np) if return_std else mean_np


class GPClassifier(ClassifierMixin, _GPEstimator):
    """Gaussian-process classification (binary or multi-class) with any gpscale method.

    Labels may be any sortable values; ``classes_`` holds them in order. ``method="auto"``
    (the default) picks ``iterncgp`` up to n·C = 200,000 latent values and ``svgp`` beyond;
    ``method_`` holds the key that was fitted.
    """

    _task = "classification"

    def fit(self, X, y) -> GPClassifier:
        X, y = self._check_xy(X, y)
        # Float labels with a fractional part (a regression target passed by mistake) are a
        # ValueError with scikit-learn's hint, not one class per distinct value.
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"classification needs at least 2 classes; y has only one class: "
                             f"{self.classes_.tolist()}")
        check_class_labels(self.classes_, len(codes))  # as gpscale fit --task classification
        self._fit_tensors(torch.tensor(X), torch.tensor(codes, dtype=torch.int64),
                          len(self.classes_))
        return self

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities (n, C) at X, columns in the order of ``classes_``.

        Raises:
            ValueError: NaN or inf in X, or in a probability (naming the rows).
        """
        probs = self._predictive(X).probs
        if probs is None:
            raise ValueError(f"method {self.method_!r} returned no class probabilities")
        out = probs.detach().double().cpu().numpy()
        check_finite_output(out, what="class probability")
        return out

    def predict(self, X) -> np.ndarray:
        probs = self.predict_proba(X)  # NotFittedError before classes_ is looked up
        return self.classes_[probs.argmax(1)]

    def _extra_payload(self) -> dict[str, Any]:
        return {"classes": self.classes_}


def _seed(random_state: Any) -> int:
    """The training seed of ``random_state``: an integer itself; ``None`` (NumPy's global
    random state) or a ``RandomState``: an integer drawn from it."""
    if isinstance(random_state, Integral) and not isinstance(random_state, bool):
        return int(random_state)
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def _check_finite_targets(y: Any) -> None:
    """A ``ValueError`` naming the first rows (0-based) of numeric targets that hold NaN or inf
    (scikit-learn's own check names none); anything else is left to ``validate_data``."""
    try:
        values = np.asarray(y)
    except (ValueError, TypeError):
        return
    if values.dtype.kind not in "fc" or values.ndim == 0 or len(values) == 0:
        return
    bad = nonfinite_rows(values)
    if bad:
        raise ValueError(f"y contains NaN or inf values (first rows: {bad[:5]}); remove or "
                         "impute those rows")


def _is_auto(method: Any) -> bool:
    return isinstance(method, str) and method == AUTO


def _registered() -> dict[str, Any]:
    return METHODS


def _condition(model, train):
    """The model's state on its training data, computed once without gradients."""
    with torch.no_grad():
        return model.posterior(*train)


_ESTIMATORS = {"GPRegressor": GPRegressor, "GPClassifier": GPClassifier}


def estimator_from_payload(payload: dict[str, Any]) -> _GPEstimator:
    """Rebuild a fitted estimator from what ``gpscale.save`` wrote."""
    est = _ESTIMATORS[payload["estimator"]](**payload["params"])
    est.model_ = model_from_payload(payload["model"])
    est.method_ = payload["model"]["key"]
    est._train = payload["model"]["data"]
    est._state = _condition(est.model_, est._train)
    est.transform_ = (None if payload["transform"] is None
                      else Standardizer.from_dict(payload["transform"]))
    est.history_ = History.from_state_dict(payload["history"])
    est.n_features_in_ = payload["n_features_in"]
    if "classes" in payload["extra"]:
        est.classes_ = payload["extra"]["classes"]
    return est


register_loader("estimator", estimator_from_payload)
