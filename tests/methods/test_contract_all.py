"""The Method contract over every registered key: ``condition`` never changes the module, a
model rebuilt from its options and state dict predicts identically, and ``gpscale.save`` /
``gpscale.load`` round-trip to bit-identical predictions."""

from __future__ import annotations

import copy

import pytest
import torch

from gpscale.io import load, save
from gpscale.methods import METHODS, build, get_spec
from gpscale.testing import SMALL_OPTIONS, toy_problem


def test_every_key_is_covered():
    assert set(METHODS) == set(SMALL_OPTIONS)


@pytest.fixture(params=sorted(METHODS), ids=sorted(METHODS))
def fitted(request):
    """(model, x, y, x_test) for key ``request.param``, parameters moved off their start."""
    key = request.param
    task = get_spec(key).tasks[0]
    x, y, x_test = toy_problem(task)
    model = build(key, 2, task=task, init=(x, y), **SMALL_OPTIONS[key])
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.03 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model, x, y, x_test


def _snapshot(model):
    """Each submodule's plain attributes (by identity and by value) and the state dict."""
    attributes = {}
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr in ("_parameters", "_buffers", "_modules"):
                continue
            try:
                copied = copy.deepcopy(value)
            except Exception:  # noqa: BLE001 - e.g. an object holding a lock: identity only
                copied = None
            attributes[(name, attr)] = (value, copied)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return attributes, state


def _plain(value) -> bool:
    """Plain data all the way down (numbers, text, containers of them): compared by value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple, set)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _assert_unchanged(before, model):
    attributes, state = before
    now, _ = _snapshot(model)
    assert set(now) == set(attributes), set(now) ^ set(attributes)
    for key, (value, copied) in attributes.items():
        assert now[key][0] is value, f"condition assigned {key}"
        if _plain(copied):
            assert now[key][0] == copied, f"condition changed {key} in place"
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name


def test_condition_does_not_change_the_module(fitted):
    model, x, y, x_test = fitted
    before = _snapshot(model)
    with torch.no_grad():
        state = model.condition(x, y)
        _assert_unchanged(before, model)
        model.predict(state, x_test)  # may leave GPyTorch's (cleared) memo attributes
        before = _snapshot(model)
        state2 = model.condition(x, y)  # the same data again: nothing memoised on the module
    _assert_unchanged(before, model)
    assert type(state2) is type(state)


def _predict(model, x, y, x_test):
    with torch.no_grad():
        torch.manual_seed(0)  # Monte Carlo class probabilities draw the same samples
        return model.predict(model.condition(x, y), x_test)


def _same(a, b):
    for name in ("mean", "variance", "noise", "probs"):
        va, vb = getattr(a, name, None), getattr(b, name, None)
        assert (va is None) == (vb is None), name
        if va is not None:
            assert torch.equal(va, vb), name


def test_rebuilt_from_options_and_state_dict_predicts_identically(fitted):
    model, x, y, x_test = fitted
    rebuilt = build(model.method_key, model.num_dims, task=model.task,
                    num_classes=model.num_classes, init=None, **model.options)
    rebuilt.load_state_dict(model.state_dict())
    _same(_predict(rebuilt, x, y, x_test), _predict(model, x, y, x_test))


def test_save_load_round_trip_is_bit_identical(fitted, tmp_path):
    model, x, y, x_test = fitted
    save(model, tmp_path / "model.pt", data=(x, y))
    loaded = load(tmp_path / "model.pt")
    assert loaded.method_key == model.method_key and loaded.options == model.options
    _same(_predict(loaded, x, y, x_test), _predict(model, x, y, x_test))


# -- what the pipeline needs about a key, declared on its MethodSpec (methods/<family>/pipeline.py)


@pytest.mark.parametrize("key", sorted(METHODS))
def test_every_key_declares_what_the_pipeline_needs(key):
    """Training defaults for every preset (valid FitConfig fields, and what default_fit_config
    gives), GPU inducing sets and row-sized defaults of declared options, a positive
    dense-memory count or none, a pre-fit of a known kind whose model is another registered
    key, and valid test options."""
    import inspect

    from gpscale.methods.registry import PRESETS, Prefit
    from gpscale.training import FitConfig, default_fit_config
    from gpscale.training.prefit import prefit_hyperparameters

    spec = get_spec(key)
    names = {o.name for o in spec.options}
    assert set(spec.training_defaults) == set(PRESETS), key
    for preset, declared in spec.training_defaults.items():
        assert default_fit_config(key, preset) == FitConfig(**declared)
        assert default_fit_config(key, preset) is default_fit_config(key, preset)
    for name, sizes in spec.gpu_inducing.items():
        cap, divisor = sizes
        assert name in names and "regression" in spec.tasks
        assert isinstance(cap, int) and isinstance(divisor, int) and cap >= 1 and divisor >= 1
    for name, rule in spec.row_sized.items():  # a declared option, a value it takes at any n
        assert name in names
        for n in (2, 1_500, 40_000):
            assert spec.resolve({name: rule(n)})[name] == rule(n)
    assert spec.dense_copies is None or (isinstance(spec.dense_copies, float)
                                         and spec.dense_copies > 0)
    resolved = spec.resolve(dict(spec.test_options))  # valid options
    if spec.prefit is not None:
        policy = spec.prefit
        assert isinstance(policy, Prefit) and policy.kind in Prefit.KINDS
        assert policy.model in METHODS and policy.model != key
        if policy.kind == "subset":
            assert {"prefit", "prefit_size", "prefit_max_lr"} <= names
            assert "regression" in spec.tasks and "regression" in get_spec(policy.model).tasks
        else:  # "kernel": the family's settings are prefit_hyperparameters' keywords
            x = torch.zeros(5, 2, dtype=torch.float64)
            accepted = set(inspect.signature(prefit_hyperparameters).parameters)
            assert set(policy.arguments(resolved, x)) <= accepted - {"x", "y", "task",
                                                                    "num_classes", "method"}
            assert {"lengthscale", "outputscale"} <= set(spec.test_options)  # no pre-fit in tests
    for name in ("training_defaults", "gpu_inducing", "row_sized", "test_options"):
        assert isinstance(getattr(spec, name), dict), name


def test_a_method_defined_in_a_test_file_runs_through_the_harness_on_the_defaults():
    """A key that declares nothing beyond its factory trains with FitConfig(), no GPU sizing,
    no dense check, no pre-fit and every Method hook at its default (nothing probed for)."""
    from dataclasses import dataclass

    from torch import nn

    from gpscale import devices
    from gpscale.distributions import Predictive
    from gpscale.methods.base import Method
    from gpscale.methods.registry import MethodSpec, register
    from gpscale.testing import SMALL_OPTIONS
    from gpscale.training import FitConfig, default_fit_config
    from gpscale.training.harness import train_method

    @dataclass(frozen=True)
    class MeanState:
        y: torch.Tensor

    class ConstantMean(Method):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.mean = nn.Parameter(torch.zeros((), dtype=torch.float64))
            self.log_noise = nn.Parameter(torch.zeros((), dtype=torch.float64))

        def condition(self, x, y):
            return MeanState(y)

        def loss(self, state):
            noise = self.log_noise.exp()
            return 0.5 * (((state.y - self.mean) ** 2) / noise + self.log_noise).mean()

        def predict(self, state, x_test):
            t = x_test.shape[0]
            return Predictive(mean=self.mean.detach().expand(t).clone(),
                              variance=torch.zeros(t, dtype=x_test.dtype),
                              noise=self.log_noise.detach().exp())

    key = "test-constant-mean"
    register(MethodSpec(key=key, tasks=("regression",), summary="a constant",
                        factory=lambda num_dims, **kw: ConstantMean(
                            task=kw["task"], num_classes=kw["num_classes"])))
    try:
        x, y, _ = toy_problem(n=30)
        assert default_fit_config(key) == FitConfig() and SMALL_OPTIONS[key] == {}
        assert devices.inducing_options(key, {}, torch.device("cuda:0"), "regression", 30) == {}
        devices.check_dense_fits(key, 10**6, torch.float64, torch.device("cpu"), (1, "free"))
        config = FitConfig(epochs=3, lr=0.1, progress=False)
        trained = train_method(key, (x, y), task="regression", num_classes=None, options={},
                               config=config, seed=0)
        assert trained.history.epochs == 3 and isinstance(trained.state, MeanState)
        assert trained.model.max_start_lr is None
        assert float(trained.model.mean.detach()) != 0.0  # it trained
    finally:
        METHODS.pop(key)
