"""Typed method options: one declaration per key, checked at every entry point."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.estimators import GPClassifier, GPRegressor
from gpscale.methods import METHODS, build, get_spec
from gpscale.methods.options import Option, OptionError, coerce, resolve_options
from gpscale.testing import SMALL_OPTIONS, toy_problem
from gpscale.training import METHOD_DEFAULTS, FitConfig, default_fit_config, resolve_fit_config

KEYS = sorted(METHODS)


@pytest.mark.parametrize("text, expected", [
    ("true", True), ("False", False), ("1", True), ("0", False), ("YES", True), ("off", False),
    (True, True), (np.bool_(False), False), (1, True)])
def test_bool_option_parses_text_and_bools(text, expected):
    assert coerce(Option("ard", "bool", True, ""), text) is expected


@pytest.mark.parametrize("value", ["maybe", "", 2, 0.5, None])
def test_bool_option_rejects_other_values(value):
    with pytest.raises(OptionError, match=r"ard=.* expected true or false|cannot be none"):
        coerce(Option("ard", "bool", True, ""), value)


def test_int_option_takes_integers_only():
    opt = Option("num_inducing", "int", 512, "", minimum=1)
    assert coerce(opt, "32") == 32 and coerce(opt, np.int64(7)) == 7
    for bad in ("32.5", 32.5, "abc", True, "[1]"):
        with pytest.raises(OptionError, match="num_inducing=.*expected an integer"):
            coerce(opt, bad)
    with pytest.raises(OptionError, match="must be ≥ 1"):
        coerce(opt, "0")


def test_float_option_range_and_none():
    opt = Option("noise", "float", None, "", minimum=0, exclusive=True)
    assert coerce(opt, "1e-3") == 1e-3 and coerce(opt, 2) == 2.0
    assert coerce(opt, "none") is None and coerce(opt, None) is None
    with pytest.raises(OptionError, match="must be > 0"):
        coerce(opt, 0.0)
    with pytest.raises(OptionError, match="finite"):
        coerce(opt, "inf")
    with pytest.raises(OptionError, match="cannot be none"):
        coerce(Option("lr", "float", 0.1, ""), "none")


def test_list_options_take_scalars_lists_and_nested_lists():
    floats = Option("lengthscale", "floats", None, "", minimum=0, exclusive=True)
    assert coerce(floats, "0.5") == 0.5
    assert coerce(floats, "[0.5, 2]") == [0.5, 2.0] == coerce(floats, "0.5,2")
    assert coerce(floats, [[1, 2], [3, 4]]) == [[1.0, 2.0], [3.0, 4.0]]
    assert coerce(floats, np.array([1.0, 2.0])) == [1.0, 2.0]
    with pytest.raises(OptionError, match="must be > 0"):
        coerce(floats, [1.0, -2.0])
    ints = Option("grid_size", "ints", None, "", minimum=2)
    assert coerce(ints, "[16, 32]") == [16, 32] and coerce(ints, "64") == 64
    with pytest.raises(OptionError, match="expected an integer"):
        coerce(ints, "[16, 3.5]")


def test_bounds_and_choices():
    bounds = Option("grid_bounds", "bounds", None, "")
    assert coerce(bounds, "[[0, 0], [1, 2]]") == ([0.0, 0.0], [1.0, 2.0])
    assert coerce(bounds, ([0.0], [1.0])) == ([0.0], [1.0])
    for bad in ("[[0, 0], [1]]", "[[1], [0]]", "[0, 1]", "x"):
        with pytest.raises(OptionError, match="grid_bounds"):
            coerce(bounds, bad)
    kernel = Option("kernel", "str", "rbf", "", choices=("rbf", "matern32"))
    with pytest.raises(OptionError, match="valid: rbf, matern32"):
        coerce(kernel, "gauss")


def test_unknown_option_lists_the_valid_ones_and_suggests():
    declared = (Option("num_inducing", "int", 512, ""), Option("seed", "int", 0, ""))
    with pytest.raises(OptionError) as info:
        resolve_options("svgp", declared, {"num_inducng": 64})
    message = str(info.value)
    assert "'num_inducng'" in message and "did you mean 'num_inducing'" in message
    assert "num_inducing (int, default 512); seed (int, default 0)" in message
    assert resolve_options("svgp", declared, {"seed": "3"}) == {"num_inducing": 512, "seed": 3}
    assert resolve_options("svgp", declared, {"seed": "3"}, fill_defaults=False) == {"seed": 3}


@pytest.mark.parametrize("key", KEYS)
def test_declaration_matches_the_factory(key):
    """Every keyword a factory names is declared with the same default (no second source)."""
    spec = get_spec(key)
    declared = {o.name: o for o in spec.options}
    assert declared, key
    for name, param in inspect.signature(spec.factory).parameters.items():
        if name in ("num_dims", "task", "num_classes", "init") or param.kind in (
                param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        assert name in declared, (key, name)
        assert declared[name].default == param.default, (key, name)
    for option in spec.options:  # each default is valid for its own declaration
        assert coerce(option, option.default) == option.default, (key, option.name)


@pytest.mark.parametrize("key", KEYS)
def test_build_rejects_unknown_and_ill_typed_options(key):
    spec = get_spec(key)
    with pytest.raises(ValueError, match=f"unknown option 'bogus' for method '{key}'"):
        build(key, 2, task=spec.tasks[0], num_classes=2 if spec.tasks[0] != "regression"
              else None, bogus=3)
    first_int = next(o for o in spec.options if o.kind == "int" and not o.hidden)
    with pytest.raises(ValueError, match=f"{first_int.name}=.*expected an integer"):
        build(key, 2, task=spec.tasks[0], init=None, **{first_int.name: "abc"})


def test_every_saved_option_is_declared():
    """model.options (what save/load rebuild from) only holds declared keys."""
    for key in KEYS:
        spec = get_spec(key)
        task = spec.tasks[0]
        x, target, _ = toy_problem(task)
        model = build(key, 2, task=task, init=(x, target), **SMALL_OPTIONS[key])
        declared = {o.name for o in spec.options}
        assert set(model.options) <= declared, (key, set(model.options) - declared)
        json.dumps(model.options)
        spec.resolve(model.options)  # the stored values pass their own declaration


def test_method_training_defaults_are_fit_configs():
    assert set(METHOD_DEFAULTS) == set(KEYS)
    assert all(isinstance(c, FitConfig) for c in METHOD_DEFAULTS.values())
    config = resolve_fit_config("svgp", 500, lr=None, epochs=3, dtype="float64")
    assert (config.lr, config.epochs, config.dtype, config.batch_size) == (0.1, 3, "float64",
                                                                           None)
    assert config.torch_dtype == torch.float64
    assert default_fit_config("not-a-key") == FitConfig()
    with pytest.raises(ValueError, match="unknown training options"):
        resolve_fit_config("svgp", 10, epoch=3)
    with pytest.raises(ValueError, match="dtype"):
        FitConfig(dtype="float16")


def test_estimators_check_options_when_made_and_when_fitted():
    with pytest.raises(ValueError, match="unknown option 'num_inducng' for method 'svgp'"):
        GPRegressor(method="svgp", num_inducng=64)
    # the default method, auto: checked against every method auto can pick
    with pytest.raises(ValueError, match="unknown option 'num_inducng' for method 'auto' .*"
                                         "did you mean 'num_inducing'"):
        GPRegressor(num_inducng=64)
    with pytest.raises(ValueError, match="ard='False'|ard=.*expected"):
        GPRegressor(method="exact", ard="perhaps")
    reg = GPRegressor(method="exact", epochs=2, ard="False")  # text is typed, not truthy
    X = np.random.default_rng(0).random((40, 3))
    reg.fit(X, X[:, 0])
    assert reg.model_.options["ard"] is False
    reg.set_params(num_inducing=8)  # accepted (scikit-learn), reported by fit
    with pytest.raises(ValueError, match="unknown option 'num_inducing' for method 'exact'"):
        reg.fit(X, X[:, 0])
    with pytest.raises(ValueError, match="unknown method"):
        GPClassifier(method="nope").fit(X, X[:, 0] > 0.5)


def _cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("option, fragment", [
    ("num_inducng=64", "unknown option 'num_inducng' for method 'svgp' (did you mean "
                       "'num_inducing'?)"),
    ("num_inducing=32.5", "option num_inducing='32.5' is invalid: expected an integer"),
    ("num_inducing=abc", "option num_inducing='abc' is invalid: expected an integer"),
    ("ard=maybe", "option ard='maybe' is invalid: expected true or false"),
    ("kernel=gauss", "option kernel='gauss' is invalid: kernel 'gauss', position 1: unknown "
                     "kernel 'gauss'; valid: rbf"),
    ("kernel=rbf(0)*periodc(1)", "position 8: unknown kernel 'periodc'"),
])
def test_cli_bad_option_is_one_line_exit_2(capsys, option, fragment):
    rc, out, err = _cli(capsys, "fit", "--dataset", "elevators", "--method", "svgp", "-o", option)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("gpscale fit: error: ")
    assert fragment in err and "Traceback" not in err


def test_cli_wrong_number_of_lengthscales_is_one_line_exit_2(capsys, tmp_path):
    rc, out, err = _cli(capsys, "fit", "--dataset", "relevant32", "--data-option", "n=300",
                        "--method", "svgp", "-o", "lengthscale=1,2", "--epochs", "1",
                        "--out", str(tmp_path / "run"))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "lengthscale takes one value, or one per input dimension with ard=true (32 here); " \
           "got 2 values" in err


def test_cli_option_for_another_method(capsys):
    rc, _, err = _cli(capsys, "fit", "--dataset", "elevators", "--method", "exact",
                      "-o", "num_inducing=8")
    assert rc == 2 and "unknown option 'num_inducing' for method 'exact'" in err


def test_cli_methods_key_lists_options_and_defaults(capsys):
    rc, out, _ = _cli(capsys, "methods", "svgp")
    assert rc == 0
    assert ("training defaults: optimizer=adam lr=0.1 epochs=1000 batch_size=1024 "
            "scheduler=plateau dtype=float32 max_time=300.0") in out
    row = next(line for line in out.splitlines() if line.startswith("num_inducing "))
    assert row.split()[1:7] == ["int", "≥", "1", "or", "none", "None"]
    assert "min(512, n/2)" in row
    assert "num_data" not in out  # hidden: set on rebuild, not by users
    rc, _, err = _cli(capsys, "methods", "svpg")
    assert rc == 2 and "unknown method 'svpg'" in err


def test_cli_version_and_verbose_anywhere(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("gpscale 0.")
    assert main(["methods", "-v"]) == 0 and main(["-v", "methods"]) == 0


@pytest.mark.parametrize("key, name, expected", [
    ("svgp", "num_inducing", 30), ("sgpr", "num_inducing", 30), ("softki", "num_inducing", 30),
    ("solvegp", "num_inducing", 15), ("solvegp", "num_orthogonal", 15),
    ("cagp-opt", "num_actions", 30), ("cagp-cg", "num_actions", 30)])
def test_default_sizes_scale_with_small_data(key, name, expected):
    """With no options a 60-point set fits (a fixed 512 would exceed n) and the size is
    min(cap, n / divisor); a given size is kept."""
    torch.manual_seed(0)
    x = torch.rand(60, 2, dtype=torch.float64)
    y = torch.sin(6 * x[:, 0])
    assert build(key, 2, init=(x, y)).options[name] == expected
    assert build(key, 2, init=(x, y), **{name: 7}).options[name] == 7


_LENGTHSCALE_KEYS = sorted(k for k, spec in METHODS.items()
                           if "regression" in spec.tasks
                           and (spec.prefit is None or spec.prefit.kind != "kernel")
                           and any(o.name == "lengthscale" for o in spec.options)
                           and any(o.name == "ard" for o in spec.options))


def _lengthscales(model: torch.nn.Module) -> list[float]:
    ells = [m.lengthscale for m in model.modules()
            if isinstance(getattr(m, "lengthscale", None), torch.Tensor)]
    assert ells, f"{type(model).__name__} has no kernel with lengthscales"
    return ells[0].detach().reshape(-1).tolist()


@pytest.mark.parametrize("key", _LENGTHSCALE_KEYS)
def test_one_initial_lengthscale_per_input(key):
    """``-o lengthscale=a,b`` sets one ARD lengthscale per input (it raised a TypeError from
    ``float(list)`` before commit 893716b (2026-11-26)); a wrong count is a ValueError naming d."""
    x, y, _ = toy_problem(n=64)
    options = SMALL_OPTIONS.get(key, {})
    model = build(key, 2, init=(x, y), **options, lengthscale=[0.5, 2.0])
    assert _lengthscales(model) == pytest.approx([0.5, 2.0], rel=1e-6)
    assert build(key, 2, init=(x, y), **options, lengthscale=[0.7]).options["lengthscale"] == 0.7
    with pytest.raises(ValueError, match=r"one per input dimension with ard=true \(2 here\)"):
        build(key, 2, init=(x, y), **options, lengthscale=[0.5, 1.0, 2.0])
    with pytest.raises(ValueError, match="got 2 values with ard=False"):
        build(key, 2, init=(x, y), **options, ard=False, lengthscale=[0.5, 2.0])
