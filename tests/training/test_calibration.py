"""Predictive intervals on held-out and test rows (:mod:`gpscale.training.calibration`): the
noise calibration of the grid methods, the rows it holds out, and the warning a run gives when
its test rows contradict its intervals."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gpscale.errors import CalibrationWarning
from gpscale.methods import build
from gpscale.metrics import COVERAGE_BAR, COVERAGE_SLACK, coverage_slack
from gpscale.training import FitConfig
from gpscale.training.calibration import (
    HELDOUT_MAX_ROWS,
    HELDOUT_MIN_ROWS,
    HELDOUT_MIN_TRAIN_ROWS,
    calibrate_noise,
    coverage_message,
    coverage_tolerance,
    heldout_rows,
    interval_coverage,
)
from gpscale.training.harness import train_method

NOISE_STD = 0.1


def _field(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g, dtype=torch.float64) * 4 - 2
    y = torch.sin(3 * x[:, 0]) + NOISE_STD * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def test_heldout_rows_are_a_tenth_within_bounds():
    assert heldout_rows(HELDOUT_MIN_TRAIN_ROWS - 1) == 0
    assert heldout_rows(HELDOUT_MIN_TRAIN_ROWS) == HELDOUT_MIN_ROWS
    assert heldout_rows(15_000) == 1_500
    assert heldout_rows(10**7) == HELDOUT_MAX_ROWS


def test_interval_coverage_counts_points_inside_the_central_interval():
    mean, variance = torch.zeros(4), torch.ones(4)
    assert interval_coverage(mean, variance, torch.tensor([0.0, 1.9, -1.95, 2.0])) == 0.75


def test_coverage_message_only_beyond_the_tolerance():
    assert coverage_tolerance(2_000) == 0.025
    assert coverage_tolerance(50) == pytest.approx(3 * math.sqrt(0.95 * 0.05 / 50))
    assert coverage_message("svgp", 0.96, 2_000) is None
    assert coverage_message("svgp", None, 2_000) is None
    wide = coverage_message("svgp", 0.998, 2_000, stopped="time")
    assert "99.8%" in wide and "too wide" in wide and "--max-time" in wide
    narrow = coverage_message("ggp", 0.51, 4_500, stopped="converged")
    assert "51.0%" in narrow and "too narrow" in narrow and "--max-time" not in narrow
    assert coverage_message("ggp", 0.85, 30) is None  # 30 rows cannot tell 85 % from 95 %


@pytest.mark.parametrize("start", [1.5e-4])
def test_calibrate_noise_recovers_the_noise_from_a_wrong_start(start):
    """GGP with σ² far too large or far too small: on held-out rows the calibration finds σ²
    near the data's 0.01 and intervals that cover about 95 % of new rows."""
    x, y = _field(1_200, seed=0)
    fit, held = (x[:1_000], y[:1_000]), (x[1_000:], y[1_000:])
    model = build("ggp", 1, init=fit, grid_size=128, lengthscale=0.3, noise=start)
    changed = calibrate_noise(model, fit, held, floor=1.1e-4)
    noise = float(model.noise.detach())
    assert changed["noise_trained"] == pytest.approx(start)
    assert changed["noise_calibrated"] == pytest.approx(noise)
    assert NOISE_STD**2 / 2 < noise < NOISE_STD**2 * 2
    assert abs(changed["heldout_coverage"] - 0.95) < 0.05
    x_new, y_new = _field(2_000, seed=1)
    with torch.no_grad():
        pred = model.predict(model.posterior(x, y), x_new)
    assert abs(interval_coverage(pred.mean, pred.observed_variance, y_new) - 0.95) < 0.025


def test_the_harness_holds_rows_out_and_calibrates_a_grid_model():
    """One epoch from a noise 50 times too large: the history's last row records the
    calibration, and the model then predicts new rows with intervals of the right width."""
    x, y = _field(1_500, seed=2)
    trained = train_method("ggp", (x, y), task="regression", num_classes=None,
                           options={"grid_size": 128, "noise": 0.5}, seed=0,
                           config=FitConfig(epochs=1, lr=0.01, eval_every=1, progress=False))
    last = trained.history.rows[-1]
    assert last["heldout_rows"] == heldout_rows(1_500)
    assert last["noise_trained"] > 0.3 and last["noise_calibrated"] < 0.02
    x_new, y_new = _field(2_000, seed=3)
    with torch.no_grad():
        pred = trained.model.predict(trained.state, x_new)
    assert abs(interval_coverage(pred.mean, pred.observed_variance, y_new) - 0.95) < 0.025


@pytest.mark.parametrize("key, options", [
    ("sgpr", {"num_inducing": 6}),
    ("cagp-cg", {"num_actions": 16}),
])
def test_the_bound_keys_calibrate_the_noise_on_held_out_rows(key, options):
    """SGPR with 6 inducing points and CaGP-CG with 16 actions, whose bounds let σ² absorb
    what the approximation leaves out: the noise set on held-out rows gives intervals of the
    right width on new rows, where the trained noise gives intervals too wide."""
    x, y = _field(1_500, seed=4)
    trained = train_method(key, (x, y), task="regression", num_classes=None,
                           options={**options, "noise": 0.5}, seed=0,
                           config=FitConfig(epochs=1, lr=0.01, eval_every=1, progress=False))
    last = trained.history.rows[-1]
    assert last["heldout_rows"] == heldout_rows(1_500)
    assert last["noise_calibrated"] < last["noise_trained"]
    x_new, y_new = _field(2_000, seed=5)
    model = trained.model
    with torch.no_grad():
        pred = model.predict(trained.state, x_new)
        assert abs(interval_coverage(pred.mean, pred.observed_variance, y_new) - 0.95) < 0.025
        model.set_noise(last["noise_trained"])
        wide = model.predict(model.posterior(x, y), x_new)
    assert interval_coverage(wide.mean, wide.observed_variance, y_new) > 0.98


def test_cagp_opt_trains_on_every_row():
    """CaGP-Opt's learned actions belong to the rows they were learned on: no rows held out of
    training; its predictive variance is calibrated after it, on rows left out of the
    posterior (tests/methods/cagp/test_variance_calibration.py)."""
    x, y = _field(1_500, seed=6)
    trained = train_method("cagp-opt", (x, y), task="regression", num_classes=None,
                           options={"num_actions": 8}, seed=0,
                           config=FitConfig(epochs=1, lr=0.01, eval_every=1, progress=False))
    assert not trained.model.heldout_noise
    last = trained.history.rows[-1]
    assert "heldout_rows" not in last
    assert last["left_out_rows"] == 150
    assert float(trained.model.variance_scale) == last["variance_scale"]


def test_a_run_whose_test_rows_contradict_its_intervals_warns(tmp_path):
    """SVGP after one epoch without its closed-form step: intervals far too wide, said in one
    CalibrationWarning naming the coverage; metrics carry test_coverage."""
    from gpscale.run import RunSpec, run

    x, y = _field(1_000, seed=4)
    path = tmp_path / "field.csv"
    rows = "\n".join(f"{a:.6f},{b:.6f}" for a, b in zip(x[:, 0].tolist(), y.tolist(), strict=True))
    path.write_text("x,y\n" + rows + "\n")
    spec = RunSpec(method="svgp", csv=str(path), target="y", epochs=1, progress=False,
                   options={"optimal_q": False, "num_inducing": 16, "noise": 0.5},
                   dataset_options={"test_fraction": 0.5})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = run(spec).metrics
    said = [w for w in caught if issubclass(w.category, CalibrationWarning)]
    assert metrics["test_coverage"] > 0.975
    assert len(said) == 1 and f"{100 * metrics['test_coverage']:.1f}%" in str(said[0].message)
    calibrated = run(RunSpec(method="svgp", csv=str(path), target="y", epochs=1, progress=False,
                             options={"num_inducing": 16, "noise": 0.5},
                             dataset_options={"test_fraction": 0.5})).metrics
    assert abs(calibrated["test_coverage"] - 0.95) < coverage_tolerance(500)


def test_intervals_covering_far_too_many_rows_are_moved_into_the_slack():
    """Held-out errors mostly tiny with 2 % far out: the NLL's σ² matches their variance, which
    the outliers inflate, and its intervals cover nearly every row; the calibrated σ² keeps the
    held-out coverage within 95 % ± coverage_slack. Gaussian errors keep the NLL's σ², and so
    do Student-t errors with 3 degrees of freedom on 4,000 rows, whose intervals at the NLL's
    σ² cover within that slack (a narrower band would cost much density for a fraction of a
    point of coverage)."""
    from gpscale.training.calibration import _best_noise, _coverage_of, _nll_noise

    g = torch.Generator().manual_seed(7)
    rows = 4_000
    slack = coverage_slack(rows)
    latent = torch.full((rows,), 0.01, dtype=torch.float64)
    normal = torch.randn(rows, generator=g, dtype=torch.float64)
    chi2 = (torch.randn(3, rows, generator=g, dtype=torch.float64) ** 2).sum(0)
    far = torch.rand(rows, generator=g, dtype=torch.float64) < 0.02
    contaminated = torch.where(far, 3.0 * normal, 0.01 * normal) ** 2
    small = torch.full((rows,), 1e-6, dtype=torch.float64)
    nll = _nll_noise(contaminated, small, 1e-8)
    assert _coverage_of(contaminated, small, nll) > 0.95 + slack  # what the move corrects
    moved = _best_noise(contaminated, small, floor=1e-8)
    assert moved < nll
    assert abs(_coverage_of(contaminated, small, moved) - 0.95) <= slack + 1 / rows
    for err2 in ((0.3 * normal) ** 2, (0.3 * normal / (chi2 / 3).sqrt()) ** 2):
        kept = _nll_noise(err2, latent, 1e-6)
        assert abs(_coverage_of(err2, latent, kept) - 0.95) <= slack
        assert _best_noise(err2, latent, 1e-6) == pytest.approx(kept)


def test_the_coverage_slack_is_the_bar_less_the_held_out_rows_sampling_error():
    """A few hundred rows: the least slack; many rows: up to the product's bar less two
    binomial standard errors, never past the bar."""
    assert coverage_slack(100) == COVERAGE_SLACK == coverage_slack(800)
    for rows in (2_000, 5_000, 100_000):
        assert coverage_slack(rows) == pytest.approx(
            COVERAGE_BAR - 2 * math.sqrt(0.95 * 0.05 / rows), rel=1e-12)
    values = [coverage_slack(rows) for rows in (500, 2_000, 5_000, 10**6)]
    assert values == sorted(values) and values[-1] < COVERAGE_BAR


def test_a_latent_variance_covering_everything_leaves_the_noise_at_its_floor():
    from gpscale.training.calibration import _best_noise

    err2 = torch.full((200,), 1e-4, dtype=torch.float64)
    assert _best_noise(err2, torch.ones(200, dtype=torch.float64), floor=1e-6) == 1e-6
