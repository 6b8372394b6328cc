"""Composed kernels through the methods: which keys take an expression (declared on their
``kernel`` option), each of those builds, trains a step, predicts and round-trips through
save / load with one; the others refuse an expression in one line that says why; and an
expression written in the data's units reaches the model in standardised ones."""

from __future__ import annotations

import json

import gpytorch
import numpy as np
import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.io import load, save
from gpscale.methods import METHODS, build, get_spec
from gpscale.methods.options import OptionError
from gpscale.testing import SMALL_OPTIONS, toy_problem

EXPRESSION = "rbf(0) * periodic(1, period=2) + linear(1)"
COMPOSED = {"exact", "cggp", "sgpr", "svgp", "solvegp", "cagp-cg", "cagp-opt"}


def _kernel_option(key):
    return next((o for o in get_spec(key).options if o.name == "kernel"), None)


def test_the_declarations():
    takes = {key for key in METHODS if (o := _kernel_option(key)) is not None
             and o.kind == "kernel"}
    # ski and ggp take sums over groups of inputs (refusing the rest, with the reason); the
    # Laplace keys take any expression for a fixed or evidence-learned latent kernel
    assert takes == COMPOSED | {"ski", "ggp", "iterncgp", "sod-laplace", "softki"}


@pytest.mark.parametrize("key", sorted(COMPOSED))
def test_a_composed_kernel_trains_predicts_and_round_trips(key, tmp_path):
    x, y, x_test = toy_problem("regression")
    options = {k: v for k, v in SMALL_OPTIONS[key].items() if k not in ("kernel", "ard")}
    model = build(key, 2, init=(x, y), kernel=EXPRESSION, **options)
    kernels = [m for m in model.modules() if isinstance(m, gpytorch.kernels.PeriodicKernel)]
    assert len(kernels) == 1 and kernels[0].period_length.item() == pytest.approx(2.0)
    loss = model.loss(model.condition(x, y))
    loss.backward()
    assert torch.isfinite(loss)
    assert kernels[0].raw_period_length.grad is not None  # the composed kernel is trained
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x_test)
    assert torch.isfinite(pred.mean).all() and (pred.variance >= 0).all()
    save(model, tmp_path / "model.pt", data=(x, y))
    loaded = load(tmp_path / "model.pt")
    assert loaded.options["kernel"] == model.options["kernel"]
    with torch.no_grad():
        again = loaded.predict(loaded.condition(x, y), x_test)
    torch.testing.assert_close(again.mean, pred.mean, rtol=0, atol=0)


@pytest.mark.parametrize("key, why", [("ski", "'linear' is not a function of x − x'"),
                                      ("ggp", "'linear' is not a function of x − x'")])
def test_the_others_refuse_an_expression_saying_why(key, why):
    with pytest.raises(OptionError) as err:
        get_spec(key).resolve({"kernel": EXPRESSION})
    assert why in str(err.value) and "\n" not in str(err.value)


def test_a_syntax_error_is_one_line_naming_the_option():
    with pytest.raises(OptionError, match=r"position 10: unknown kernel 'periodc'"):
        get_spec("exact").resolve({"kernel": "rbf(0) * periodc(2)"})


def test_lengthscale_goes_with_a_named_kernel_only():
    x, y, _ = toy_problem("regression")
    with pytest.raises(ValueError, match="in its expression"):
        build("exact", 2, init=(x, y), kernel=EXPRESSION, lengthscale=1.0)


def test_fit_on_a_file_takes_names_and_units(tmp_path):
    g = np.random.default_rng(0)
    t = np.sort(g.uniform(0, 400, 150))
    u = g.normal(size=150)
    y = np.sin(2 * np.pi * t / 100) + 0.3 * u + 0.05 * g.normal(size=150)
    lines = ["t,flat,u,y"] + [f"{a},1,{b},{c}" for a, b, c in zip(t, u, y, strict=True)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="dropped the input column 'flat'"):
        assert main(["fit", "--data", str(tmp_path / "d.csv"), "--target", "y", "--method",
                     "exact", "-o", "kernel=periodic(t, period=100) + linear(u)", "--epochs",
                     "30", "--out", str(out), "--no-progress"]) == 0
    model = load(out / "model.pt")
    # t is input 0, u input 1 once the constant column is dropped; the period in t's units
    scale = float(np.std(t[:int(0.9 * 150)], ddof=1))
    text = model.options["kernel"]
    assert text.startswith("periodic(0, period=") and text.endswith(" + linear(1)")
    period = float(text.split("period=")[1].split(")")[0])
    assert period == pytest.approx(100 / scale, rel=0.2)  # the training rows' spread
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_rmse"] < 0.3


def test_auto_chooses_among_the_methods_that_take_the_kernel():
    from gpscale.methods import auto

    grid, options = auto.pick("regression", 2_000_000, 2, num_classes=None,
                              options={"kernel": EXPRESSION})
    assert grid.method == "svgp" and "does not take this kernel expression" in grid.reason
    assert options["kernel"] == EXPRESSION
    small, _ = auto.pick("regression", 500, 2, num_classes=None, options={"kernel": EXPRESSION})
    assert small.method == "exact"  # the exact GP takes it: the rule's choice stands
    classes, _ = auto.pick("classification", 500, 2, num_classes=3,
                           options={"kernel": EXPRESSION})
    assert classes.method == "iterncgp"  # it takes expressions: the rule's choice stands
    counts, _ = auto.pick("counts", 500, 2, num_classes=None, options={"kernel": EXPRESSION})
    assert counts.method == "iterncgp"
    additive = "rbf(0) + matern32(1)"
    grid, _ = auto.pick("regression", 2_000_000, 2, num_classes=None,
                        options={"kernel": additive})
    assert grid.method == "ggp"  # an additive expression ggp takes
    wide, _ = auto.pick("regression", 1_000_000, 12, num_classes=None,
                        options={"kernel": "rbf(0) + rbf(1, 2) + matern32(3:6)"})
    assert wide.method == "ggp" and "groups of at most 3 inputs" in wide.reason
    small, _ = auto.pick("regression", 500, 12, num_classes=None,
                         options={"kernel": "rbf(0) + rbf(1, 2)"})
    assert small.method == "exact"  # the exact GP fits: it stays the reference


def test_an_expression_trains_in_float64_unless_told():
    from gpscale.methods.options import composed_dtype
    from gpscale.run import RunSpec, fit_config

    assert composed_dtype({"kernel": EXPRESSION}, None) == "float64"
    assert composed_dtype({"kernel": EXPRESSION}, "float32") == "float32"
    assert composed_dtype({"kernel": "rbf"}, None) is None
    spec = RunSpec(method="svgp", dataset="elevators", options={"kernel": EXPRESSION})
    assert fit_config(spec, 1000)[1] == torch.float64
    named = RunSpec(method="svgp", dataset="elevators")
    assert fit_config(named, 1000)[1] == torch.float32
