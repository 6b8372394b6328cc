"""The Method contract for every baseline key: registry entries, state-dict rebuilds, a module
that ``condition``/``loss``/``predict`` never change, mode independence, and input errors."""

from __future__ import annotations

import json

import pytest
import torch

from gpscale.methods import build, get_spec
from gpscale.methods.baselines import build_cggp, build_exact, build_sgpr, build_svgp
from gpscale.training import METHOD_DEFAULTS, default_fit_config

CASES = {
    "exact": ("exact", "regression", {}),
    "cggp": ("cggp", "regression", {}),
    "sgpr": ("sgpr", "regression", {"num_inducing": 8}),
    "svgp": ("svgp", "regression", {"num_inducing": 8}),
    "svgp-binary": ("svgp", "binary", {"num_inducing": 8}),
    "svgp-3class": ("svgp", "3class", {"num_inducing": 8, "num_likelihood_samples": 16}),
}


def _data(kind, toy_regression):
    x, y = toy_regression
    if kind == "binary":
        return x, (y > y.median()).double()
    if kind == "3class":
        return x, torch.bucketize(y.contiguous(), torch.tensor([-0.5, 0.5]))
    return x, y


@pytest.fixture(params=list(CASES), ids=list(CASES))
def case(request, toy_regression):
    """(model, x, y, x_test) with every parameter moved off its initial value."""
    key, kind, options = CASES[request.param]
    x, y = _data(kind, toy_regression)
    task = "regression" if kind == "regression" else "classification"
    model = build(key, 2, task=task, init=(x, y), **options)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    x_test = torch.rand(11, 2, generator=g) * 4 - 2
    return model, x, y, x_test


def _assert_same_predictive(a, b, tol=0.0):
    for name in ("mean", "variance", "noise", "probs"):
        va, vb = getattr(a, name), getattr(b, name)
        assert (va is None) == (vb is None), name
        if va is not None:
            torch.testing.assert_close(va, vb, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("key", ["exact", "cggp", "sgpr", "svgp"])
def test_registry_entry(key):
    """Each key is registered, with training defaults the training loop reads."""
    spec = get_spec(key)
    config = default_fit_config(key)
    assert config is METHOD_DEFAULTS[key]
    assert (config.batch_size, config.dtype) == ((1024, "float32") if key == "svgp"
                                                 else (None, "float64"))
    assert spec.tasks == (("regression", "classification") if key == "svgp" else ("regression",))


def test_state_dict_rebuild_predicts_identically(case):
    """build(init=None, **options) + load_state_dict reproduces predictions exactly."""
    model, x, y, x_test = case
    json.dumps(model.options)  # options are JSON-like
    rebuilt = build(model.method_key, model.num_dims, task=model.task,
                    num_classes=model.num_classes, init=None, **model.options)
    rebuilt.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = model.predict(model.condition(x, y), x_test)
        actual = rebuilt.predict(rebuilt.condition(x, y), x_test)
    _assert_same_predictive(actual, expected)


def test_condition_loss_predict_leave_the_module_unchanged(case):
    """No parameter, buffer or train/eval flag changes (the state is returned, not stored)."""
    model, x, y, x_test = case
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = model.condition(x, y)
    after_condition = model.state_dict()
    model.loss(state).backward()
    model.predict(state, x_test)
    for name, value in before.items():
        torch.testing.assert_close(after_condition[name], value, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0, msg=name)
    assert not any(m.training for m in model.modules())


def test_results_do_not_depend_on_train_or_eval_mode(case):
    """GPyTorch switches on .training; the wrappers choose the mode per computation."""
    model, x, y, x_test = case
    results = []
    for mode in (True, False):
        model.train(mode)
        torch.manual_seed(0)  # the softmax loss draws Monte Carlo samples
        state = model.condition(x, y)
        results.append((model.loss(state).detach(), model.predict(state, x_test)))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-12)
    _assert_same_predictive(results[0][1], results[1][1], tol=1e-12)


def test_no_stale_gpytorch_caches_after_an_update_in_eval_mode(case):
    """A parameter changed in eval mode shows up in the next prediction (no eval-mode memo)."""
    model, x, y, x_test = case
    model.eval()
    model.predict(model.condition(x, y), x_test)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.1)
    updated = model.predict(model.condition(x, y), x_test)
    rebuilt = build(model.method_key, model.num_dims, task=model.task,
                    num_classes=model.num_classes, init=None, **model.options)
    rebuilt.load_state_dict(model.state_dict())
    _assert_same_predictive(updated, rebuilt.predict(rebuilt.condition(x, y), x_test))


@pytest.mark.parametrize(("key", "task"), [("exact", "classification"), ("cggp", "counts"),
                                           ("sgpr", "classification"), ("svgp", "counts")])
def test_unsupported_task_raises(key, task, toy_regression):
    with pytest.raises(ValueError, match="does not support task"):
        build(key, 2, task=task, init=toy_regression)


@pytest.mark.parametrize("factory", [build_exact, build_cggp, build_sgpr, build_svgp])
def test_factory_rejects_unsupported_task_directly(factory, toy_regression):
    with pytest.raises(ValueError, match="does not support task"):
        factory(2, task="counts", init=toy_regression)


def test_wrong_feature_count_or_nan_raises(case):
    model, x, y, x_test = case
    state = model.condition(x, y)
    with pytest.raises(ValueError, match="features"):
        model.predict(state, x_test[:, :1])
    x_bad = x.clone()
    x_bad[3, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        model.condition(x_bad, y)
