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
