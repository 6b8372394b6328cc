"""The exact-GP pre-fit that starts CaGP-Opt's hyperparameters (``prefit='exact'``, the default),
its precision check and the learning-rate cap that follows it."""

from __future__ import annotations

import logging
import math
import warnings

import pytest
import torch

from gpscale.errors import NumericalError
from gpscale.kernels import kernel_hyperparameters
from gpscale.methods import cagp
from gpscale.testing import toy_problem
from gpscale.training import METHOD_DEFAULTS
from gpscale.training import prefit as prefit_module
from gpscale.training.harness import build_method, train_built, train_method
from gpscale.training.prefit import (
    AUTO_PREFIT_MIN_POINTS,
    RESOLVABLE_ULPS,
    VALIDATION_MIN_GAIN,
    exact_prefit,
    fill_prefit_options,
    fill_start_options,
    prefit_lr_cap,
    validated_noise,
)

KERNEL = {"kernel": "matern32", "ard": True}
EXACT = {"method": "exact", **KERNEL}  # the pre-fit's GP, as CaGP declares it


def _data(n: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    x, y, _ = toy_problem(n=n, seed=seed)  # y = sin 3x₁ · cos 2x₂ + N(0, 0.1²)
    return x, y


def test_whole_data_prefit_is_the_exact_gp_with_its_defaults():
    """n ≤ prefit_size: the pre-fit is the exact key's default training on all points, and it
    finds the generating noise variance 0.01."""
    x, y = _data(150)
    found = exact_prefit(x, y, **EXACT, size=1000, seed=0)
    trained = train_method("exact", (x, y), task="regression", num_classes=None,
                           options=dict(KERNEL), config=METHOD_DEFAULTS["exact"].updated(
                               progress=False, max_time=60.0), seed=0)
    hp = kernel_hyperparameters(trained.model.kernel)
    assert found["lengthscale"] == pytest.approx(hp.lengthscale.reshape(-1).tolist(), rel=1e-6)
    assert found["outputscale"] == pytest.approx(float(hp.outputscale.detach()), rel=1e-6)
    assert found["noise"] == pytest.approx(float(trained.model.likelihood.noise.detach()), rel=1e-6)
    assert len(found["lengthscale"]) == 2 and 0.004 < found["noise"] < 0.025


def test_subset_prefit_uses_random_rows_seeded():
    """The subset is the first ``size`` rows of a seeded permutation; with more rows than that
    the noise is then moved along the grid fitted × 10^(k/4), k = −4…12 (validated_noise)."""
    x, y = _data(400)
    a = exact_prefit(x, y, **EXACT, size=100, seed=1)
    assert exact_prefit(x, y, **EXACT, size=100, seed=1) == a
    rows = torch.randperm(400, generator=torch.Generator().manual_seed(1))[:100]
    b = exact_prefit(x[rows], y[rows], **EXACT, size=100, seed=1)  # n = size: not validated
    assert b["lengthscale"] == pytest.approx(a["lengthscale"], rel=1e-6)
    assert b["outputscale"] == pytest.approx(a["outputscale"])
    k = 4 * math.log10(a["noise"] / b["noise"])
    assert k == pytest.approx(round(k), abs=1e-6) and -4 <= round(k) <= 12
    assert exact_prefit(x, y, **EXACT, size=100, seed=2)["noise"] != a["noise"]


def _held_out_nll(model, train, held) -> float:
    with torch.no_grad():
        pred = model.predict(model.condition(*train), held[0])
        var = pred.observed_variance
        return float((torch.log(2 * math.pi * var) + (held[1] - pred.mean) ** 2 / var).mean())


@pytest.mark.parametrize("noise_std, lowest, highest", [(0.1, 0.003, 0.03), (1e-3, 1e-4, 3.2e-4)])
def test_validated_noise_picks_the_best_held_out_noise(noise_std, lowest, highest):
    """From the floor (as relevant32's subset fit ends), held-out points lead back to the
    generating noise variance (0.01); on nearly noise-free data (10⁻⁶) they keep the floor."""
    x, _, _ = toy_problem(n=400, seed=5)
    f = torch.sin(3 * x[:, 0]) * torch.cos(2 * x[:, 1])
    y = f + noise_std * torch.randn(400, generator=torch.Generator().manual_seed(0),
                                    dtype=x.dtype)
    train, held = (x[:250], y[:250]), (x[250:], y[250:])
    trained = train_method("exact", train, task="regression", num_classes=None,
                           options=dict(KERNEL), config=METHOD_DEFAULTS["exact"].updated(
                               progress=False, max_time=60.0), seed=0)
    model = trained.model.eval()
    grid = [1e-4 * 10.0 ** (k / 4) for k in range(0, 13)]  # from the floor: lower is not tried
    nlls = []
    for noise in grid:
        model.likelihood.noise = noise
        nlls.append(_held_out_nll(model, train, held))
    model.likelihood.noise = 1e-4
    chosen = validated_noise(model, train, held)
    best = grid[nlls.index(min(nlls))] if min(nlls) < nlls[0] - VALIDATION_MIN_GAIN else 1e-4
    assert chosen == pytest.approx(best, rel=1e-6)
    assert lowest <= chosen <= highest
    assert float(model.likelihood.noise.detach()) == pytest.approx(chosen)  # left at the choice


@pytest.mark.parametrize("method", ["cagp-opt", "cagp-cg"])
def test_fill_prefit_options_fills_only_what_is_missing(monkeypatch, method):
    x, y = _data(120)
    calls = []

    def fake(*args, **kwargs):
        calls.append(kwargs)
        return {"lengthscale": [0.3, 0.4], "outputscale": 2.0, "noise": 0.02}

    monkeypatch.setattr(prefit_module, "exact_prefit", fake)
    fill = lambda **o: fill_prefit_options(method, (x, y), task="regression",  # noqa: E731
                                           num_classes=None, options=o)
    assert fill(prefit="exact", lengthscale=[1.0, 2.0]) == {
        "prefit": "exact", "lengthscale": [1.0, 2.0], "outputscale": 2.0, "noise": 0.02}
    assert calls[-1]["size"] == 2000 and calls[-1]["seed"] == 0
    assert fill() == {} and fill(prefit="off") == {"prefit": "off"}  # auto: n ≤ 10,000
    monkeypatch.setattr(prefit_module, "AUTO_PREFIT_MIN_POINTS", 119)
    assert fill()["noise"] == 0.02 and len(calls) == 2  # auto: n = 120 > 119
    assert fill(prefit="off") == {"prefit": "off"} and len(calls) == 2
    given = {"prefit": "exact", "lengthscale": 1.0, "outputscale": 1.0, "noise": 0.1}
    assert fill(**given) == given and len(calls) == 2  # nothing missing: no pre-fit
    assert fill_prefit_options("sgpr", (x, y), task="regression", num_classes=None,
                               options={}) == {}  # a method without the option


@pytest.mark.parametrize("method", ["cagp-opt", "cagp-cg"])
def test_built_model_starts_at_the_prefit_values(method):
    x, y = _data(200)
    config = METHOD_DEFAULTS[method].updated(progress=False)
    model, _ = build_method(method, (x, y), task="regression", num_classes=None,
                            options={"num_actions": 8, "prefit": "exact", "prefit_size": 100},
                            config=config,
                            seed=0)
    found = exact_prefit(x.float(), y.float(), **EXACT, size=100, seed=0)
    hp = kernel_hyperparameters(model.kernel)
    assert hp.lengthscale.reshape(-1).tolist() == pytest.approx(found["lengthscale"], rel=1e-5)
    assert float(model.likelihood.noise.detach()) == pytest.approx(found["noise"], rel=1e-5)
    assert model.options["prefit"] == "exact" and model.options["prefit_size"] == 100


def test_failed_prefit_warns_and_starts_from_the_defaults(monkeypatch):
    x, y = _data(120)

    def broken(*args, **kwargs):
        raise NumericalError("Cholesky of the 120 × 120 kernel matrix failed")

    monkeypatch.setattr(prefit_module, "exact_prefit", broken)
    config = METHOD_DEFAULTS["cagp-opt"].updated(progress=False)
    with pytest.warns(UserWarning, match=r"pre-fit of the hyperparameters failed \(Cholesky"):
        model, _ = build_method("cagp-opt", (x, y), task="regression", num_classes=None,
                                options={"num_actions": 8, "prefit": "exact"}, config=config,
                                seed=0)
    assert float(model.likelihood.noise) == pytest.approx(0.1 * float(y.var()), rel=1e-4)


@pytest.mark.parametrize("dtype, accepted", [(torch.float32, False), (torch.float64, True)])
def test_a_start_the_training_dtype_cannot_resolve_is_not_used(monkeypatch, dtype, accepted):
    """Bike's subset fit: outputscale 1,960, noise 1e-4 — below 10 rounding units of the
    outputscale in float32 (2.3e-3), well above them in float64."""
    x, y = _data(120)
    found = {"lengthscale": [5.0, 16.0], "outputscale": 1960.0, "noise": 1e-4}
    monkeypatch.setattr(prefit_module, "exact_prefit", lambda *a, **k: dict(found))
    floor = RESOLVABLE_ULPS * torch.finfo(dtype).eps * 1960.0
    assert (1e-4 >= floor) == accepted
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filled = fill_prefit_options("cagp-opt", (x.to(dtype), y.to(dtype)), task="regression",
                                     num_classes=None, options={"prefit": "exact"})
    if accepted:
        assert filled == {"prefit": "exact", **found} and not caught
    else:
        assert filled == {"prefit": "exact"}
        assert len(caught) == 1 and "pre-fitted noise 0.0001 is below 10 rounding units of " \
            "the outputscale 1.96e+03 in float32" in str(caught[0].message)
        assert prefit_lr_cap("cagp-opt", {"prefit": "exact"}, filled, 120) is None  # default lr


def test_lr_cap_only_after_a_prefit_that_supplied_values():
    """The cap holds where start values were supplied and the method's own rule pre-fits
    those rows: above AUTO_PREFIT_MIN_POINTS, or with prefit=exact; below, a start shared by
    the race is trained at the full rate."""
    filled = {"lengthscale": [0.3, 0.4], "outputscale": 2.0, "noise": 0.02}
    many, few = AUTO_PREFIT_MIN_POINTS + 1, AUTO_PREFIT_MIN_POINTS
    assert prefit_lr_cap("cagp-opt", {}, filled, many) == 0.1
    assert prefit_lr_cap("cagp-opt", {}, filled, few) is None
    assert prefit_lr_cap("cagp-opt", {"prefit": "exact"}, {**filled, "prefit": "exact"},
                         few) == 0.1
    assert prefit_lr_cap("cagp-opt", {"prefit_max_lr": 0.03}, {**filled, "prefit_max_lr": 0.03},
                         many) == 0.03
    assert prefit_lr_cap("cagp-opt", {"prefit": "off"}, {"prefit": "off"}, many) is None
    assert prefit_lr_cap("cagp-opt", filled, filled, many) is None  # all given: no pre-fit
    assert prefit_lr_cap("sgpr", {}, {}, many) is None


@pytest.mark.parametrize("lr, trained_at", [(1.0, 0.1), (0.05, 0.05)])
def test_training_from_a_prefitted_start_is_capped_at_prefit_max_lr(lr, trained_at):
    """The default lr 1.0 throws a pre-fitted start away; a smaller --lr is kept."""
    x, y = _data(200)
    config = METHOD_DEFAULTS["cagp-opt"].updated(progress=False, lr=lr, epochs=3, max_time=None)
    model, _ = build_method("cagp-opt", (x.float(), y.float()), task="regression",
                            num_classes=None, options={"num_actions": 8, "prefit": "exact",
                                                       "prefit_size": 100},
                            config=config, seed=0)
    assert model.max_start_lr == 0.1
    history, _ = train_built(model, (x.float(), y.float()), config)
    assert history.rows[0]["lr"] == pytest.approx(trained_at)
    model, _ = build_method("cagp-opt", (x.float(), y.float()), task="regression",
                            num_classes=None, options={"num_actions": 8, "prefit": "off"},
                            config=config, seed=0)
    history, _ = train_built(model, (x.float(), y.float()), config)
    assert model.max_start_lr is None and history.rows[0]["lr"] == pytest.approx(lr)


def test_plan_line_names_the_prefit_learning_rate_only_when_a_prefit_runs():
    from gpscale.run import plan_text

    config = METHOD_DEFAULTS["cagp-opt"]
    above = plan_text("cagp-opt", config, {}, prefit_module.AUTO_PREFIT_MIN_POINTS + 1)
    assert "lr 1 lowered" in above and "lr 0.1 from an exact-GP pre-fit" in above
    assert "pre-fit" not in plan_text("cagp-opt", config, {}, 5000)
    assert "pre-fit" in plan_text("cagp-opt", config, {"prefit": "exact"}, 5000)
    assert "pre-fit" not in plan_text("cagp-opt", config.updated(lr=0.05), {"prefit": "exact"},
                                      5000)  # --lr below the cap: nothing changes


@pytest.mark.parametrize("method, noise, accepted", [
    ("cagp-cg", 1e-4, False),  # √(28.4 / 1e-4) = 533 > 60 actions (n = 120: i = n / 2)
    ("cagp-cg", 0.01, True),   # √2840 = 53 ≤ 60
    ("cagp-opt", 1e-4, True),  # learned actions: no CG reach check
])
def test_cagp_cg_rejects_a_start_its_cg_actions_cannot_solve(monkeypatch, method, noise,
                                                             accepted):
    x, y = _data(120)
    found = {"lengthscale": [5.0, 16.0], "outputscale": 28.4, "noise": noise}
    monkeypatch.setattr(prefit_module, "exact_prefit", lambda *a, **k: dict(found))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filled = fill_prefit_options(method, (x.float(), y.float()), task="regression",
                                     num_classes=None, options={"prefit": "exact"})
    assert (filled == {"prefit": "exact", **found}) == accepted
    assert (not caught) == accepted
    if not accepted:
        assert "√(outputscale / noise) = √(28.4 / 0.0001) = 533 exceeds the 60 CG actions" in \
            str(caught[0].message)


def test_prefit_stops_at_its_epoch_cap_and_announces_itself_to_gpscale_fit(caplog):
    """The epoch cap, not the clock, ends a long pre-fit (a result independent of the machine's
    load), and both its lines reach the ``gpscale.fit`` logger that ``gpscale fit`` shows."""
    x, y = _data(400)
    with caplog.at_level(logging.INFO, logger="gpscale.fit"):
        capped = exact_prefit(x, y, **EXACT, size=100, seed=1, max_epochs=1)
    lines = [r.getMessage() for r in caplog.records if r.name == "gpscale.fit.prefit"]
    assert len(lines) == 2
    assert "exact GP on 100 of 400 training points" in lines[0] and "at most 1 epochs" in lines[0]
    assert "after 1 epochs (at its epoch cap)" in lines[1]
    assert f"noise {capped['noise']:.3g}" in lines[1]
    assert capped["lengthscale"] != exact_prefit(x, y, **EXACT, size=100, seed=1)["lengthscale"]


def test_a_start_whose_gram_the_training_dtype_cannot_factor_is_not_used(monkeypatch):
    """A pre-fitted start that passes the rounding-unit check but whose float32 SᵀK̂S is not
    positive definite (KEGGu: ``CaGP.resolves`` false) warns; the model is rebuilt at the
    default start and trains at the default lr."""
    x, y = _data(200)
    found = {"lengthscale": [0.5, 0.7], "outputscale": 3.0, "noise": 0.02}
    monkeypatch.setattr(prefit_module, "exact_prefit", lambda *a, **k: dict(found))
    checked = []

    def resolves(self, xr, yr):
        checked.append((float(self.likelihood.noise), xr.dtype))
        return False

    monkeypatch.setattr(cagp.CaGP, "resolves", resolves)
    config = METHOD_DEFAULTS["cagp-opt"].updated(progress=False)
    with pytest.warns(UserWarning, match="float32 kernel products do not resolve the noise"):
        model, _ = build_method("cagp-opt", (x, y), task="regression", num_classes=None,
                                options={"num_actions": 8, "prefit": "exact"}, config=config,
                                seed=0)
    assert checked == [(pytest.approx(0.02), torch.float32)]
    assert float(model.likelihood.noise) == pytest.approx(0.1 * float(y.float().var()), rel=1e-4)
    assert model.max_start_lr is None


def test_a_prefit_at_the_noise_floor_gives_a_noise_the_options_accept(monkeypatch):
    """At GPyTorch's floor the noise can read back a hair below it (the constraint's bound is
    a float32 buffer: 9.9999997e-05 plus the softplus's remainder); the pre-fit returns the
    floor itself, so the method's noise option (minimum 1e-4) takes it. Kin40k's CaGP-Opt run
    failed there with "option noise=9.999999747415857e-05 is invalid"."""
    from gpscale.methods.options import GPYTORCH_NOISE_FLOOR
    from gpscale.methods.registry import get_spec

    observed = 9.999999747415857e-05  # what Kin40k's held-out choice returned
    monkeypatch.setattr(prefit_module, "validated_noise", lambda *_: observed)
    g = torch.Generator().manual_seed(5)
    x = torch.rand(600, 3, generator=g, dtype=torch.float64)
    y = torch.sin(3 * x[:, 0]) + x[:, 1] * x[:, 2]
    found = exact_prefit(x, y, method="exact", kernel="matern32", ard=True, size=300, seed=0)
    assert found["noise"] >= GPYTORCH_NOISE_FLOOR
    assert math.isfinite(found["heldout_mse"])
    get_spec("cagp-opt").resolve({"noise": found["noise"]})


FOUND = {"lengthscale": [0.5, 40.0], "outputscale": 900.0, "noise": 1e-4}


def test_a_shared_start_fills_what_the_user_left_out_with_a_resolvable_noise():
    """``auto``'s race starts every candidate from one pre-fit: the lengthscales with the
    outputscale and noise they were fitted with, the noise raised to what the training dtype
    resolves at that outputscale; what the user gave stays."""
    filled = fill_start_options("svgp", {}, FOUND, torch.float32)
    assert filled["lengthscale"] == FOUND["lengthscale"] and filled["outputscale"] == 900.0
    floor = RESOLVABLE_ULPS * torch.finfo(torch.float32).eps * 900.0
    assert filled["noise"] == pytest.approx(floor) and floor > FOUND["noise"]
    assert fill_start_options("exact", {}, FOUND, torch.float64)["noise"] == FOUND["noise"]
    given = fill_start_options("cagp-opt", {"lengthscale": 2.0, "noise": 0.3}, FOUND,
                               torch.float32)
    assert given["lengthscale"] == 2.0 and given["noise"] == 0.3
    assert given["outputscale"] == 900.0


def test_a_method_with_a_fixed_noise_takes_no_shared_start():
    """SoftKI's noise is a fixed interpolation noise, not one the pre-fit's lengthscales and
    outputscale were fitted against: it starts from its own defaults."""
    assert fill_start_options("softki", {"num_inducing": 64}, FOUND, torch.float32) == {
        "num_inducing": 64}


@pytest.mark.parametrize("kernel", ["rbf(0) + matern32(1)", object()])
def test_a_kernel_expression_or_object_takes_no_shared_start(kernel):
    assert fill_start_options("svgp", {"kernel": kernel}, FOUND, torch.float32) == {
        "kernel": kernel}
    named = fill_start_options("svgp", {"kernel": "rbf"}, FOUND, torch.float32)
    assert named["lengthscale"] == FOUND["lengthscale"]


@pytest.mark.parametrize("method, options, capped", [
    ("cagp-opt", {"prefit": "exact"}, True), ("cagp-opt", {}, False), ("svgp", {}, False)])
def test_a_shared_start_is_treated_as_the_methods_own_prefit(method, options, capped):
    """Built from a shared start, CaGP-Opt skips its own pre-fit, and trains at its
    ``prefit_max_lr`` where its own rule would pre-fit these rows (prefit=exact; the default
    'auto' does not on 600 rows: full rate); SVGP starts at the values and keeps its
    learning rate."""
    x, y = _data(600)
    start = {"lengthscale": [0.7, 0.9], "outputscale": 1.3, "noise": 0.02}
    model, _ = build_method(method, (x, y), task="regression", num_classes=None,
                            options=options, seed=0, start=start,
                            config=METHOD_DEFAULTS[method].updated(progress=False))
    hp = kernel_hyperparameters(model.kernel if method == "cagp-opt"
                                else model.gp.covar_module)
    torch.testing.assert_close(hp.lengthscale.reshape(-1).double(),
                               torch.tensor(start["lengthscale"], dtype=torch.float64),
                               rtol=1e-5, atol=0)
    assert float(hp.outputscale) == pytest.approx(1.3, rel=1e-5)
    assert (model.max_start_lr is not None) == capped
