"""CaGP-Opt's latent variance calibrated on rows left out of its posterior
(:mod:`gpscale.methods.cagp.calibration`, ``CaGP.finalize``) and the scale search it uses
(:func:`gpscale.metrics.best_latent_scale`)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from gpscale.linalg.operators.block_sparse import BlockLayout, BlockSparseActions
from gpscale.methods.cagp import calibration
from gpscale.metrics import covering_scale_range
from gpscale.training import FitConfig, fit
from gpscale.training.harness import train_built

from ._dense import TOL, Dense, opt_model, toy_data

Z = 1.959963984540054


def _share_inside(err2, latent, noise, scale):
    return float((err2 <= Z**2 * (scale * latent + noise)).double().mean())


@pytest.mark.parametrize(("n", "i", "count"), [(1000, 97, 100), (1000, 500, 600), (50, 50, 5)])
def test_left_out_rows_spare_each_blocks_first_row(n, i, count):
    """At most ``count`` positions, distinct, never a block's first: every block keeps a row
    ((1000, 500) has 500 spare rows for 600 asked; (50, 50) has none)."""
    layout = BlockLayout(n, i)
    positions = calibration.held_rows(layout, count, seed=3)
    assert positions.numel() == min(count, n - i)
    assert positions.unique().numel() == positions.numel()
    ids = layout.block_ids()
    starts = torch.cat([torch.tensor([0]), torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1])
    assert not bool(torch.isin(positions, starts).any())
    kept = torch.ones(n, dtype=torch.bool)
    kept[positions] = False
    assert torch.bincount(ids[kept], minlength=i).min() >= 1
    torch.testing.assert_close(positions, calibration.held_rows(layout, count, seed=3))


def test_zeroed_entries_leave_their_rows_out_of_the_posterior():
    """With the left-out rows' entries at zero, the posterior on every row predicts what the
    dense float64 CaGP posterior on the other rows alone, with those rows' actions, does."""
    x, y = toy_data(60, seed=1)
    model = opt_model(x, y, 12)
    policy = model.policy
    positions = calibration.held_rows(policy.layout, 15, seed=0)
    values = policy.values.detach().clone()
    values[positions] = 0
    actions = BlockSparseActions(values, policy.index, num_blocks=12)
    x_test = torch.rand(7, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        pred = model.predict(model.condition(x, y, actions=actions), x_test)
    out = torch.ones(60, dtype=torch.bool)
    out[policy.index[positions]] = False
    S = actions.to_dense()[out]
    dense = Dense(model, x[out], y[out], x_test)
    mean, var = dense.posterior(dense.C(S))
    torch.testing.assert_close(pred.mean, mean, **TOL)
    torch.testing.assert_close(pred.variance, var, **TOL)


def test_left_out_rows_are_predicted_by_the_fixed_point_with_whole_actions():
    """``left_out_predictive`` against dense float64: r̂_H = (I − A_HH)⁻¹ A_HT r_T with
    A = K_HX C, C = S (SᵀK̂S)⁻¹ Sᵀ, and its latent variance k_hh − 2 B K_Th + B K̂_TT Bᵀ for
    B = (I − A_HH)⁻¹ A_HT."""
    x, y = toy_data(80, seed=3)
    model = opt_model(x, y, 16)
    positions = calibration.held_rows(model.policy.layout, 20, seed=1)
    err2, latent, noise = calibration.left_out_predictive(model, x, y, positions)
    rows = model.policy.index[positions]
    kept = torch.ones(80, dtype=torch.bool)
    kept[rows] = False
    dense = Dense(model, x, y)
    S = model.policy().to_dense()
    A = dense.K[rows] @ dense.C(S)
    B = torch.linalg.solve(torch.eye(20, dtype=torch.float64) - A[:, rows], A[:, kept])
    r_hat = B @ dense.r[kept]
    var = (dense.K.diagonal()[rows] - 2 * (B * dense.K[rows][:, kept]).sum(1)
           + (B @ dense.Kh[kept][:, kept] * B).sum(1))
    torch.testing.assert_close(err2, (dense.r[rows] - r_hat).square(), **TOL)
    torch.testing.assert_close(latent, var, **TOL)
    assert noise == pytest.approx(dense.noise)


def test_for_the_exact_gp_the_fixed_point_is_the_leave_out_posterior():
    """The module's claim, in dense float64: with S = I (A = K K̂⁻¹) the fixed point's weights
    B are the exact GP's on the other rows, K_HT K̂_TT⁻¹, and so its variance is theirs."""
    x, y = toy_data(40, seed=5)
    dense = Dense(opt_model(x, y, 4), x, y)
    held = torch.zeros(40, dtype=torch.bool)
    held[::7] = True
    A = dense.K[held] @ torch.linalg.inv(dense.Kh)
    B = torch.linalg.solve(torch.eye(int(held.sum()), dtype=torch.float64) - A[:, held],
                           A[:, ~held])
    exact = dense.K[held][:, ~held] @ torch.linalg.inv(dense.Kh[~held][:, ~held])
    torch.testing.assert_close(B, exact, **TOL)


@pytest.mark.parametrize(("true_scale", "true_factor"), [(0.02, 1.0), (1.0, 0.2), (30.0, 3.0)])
def test_the_factors_found_are_those_the_errors_have(true_scale, true_factor):
    """Errors drawn with variance c₀ · latent + b₀ · σ² (latents spread over two decades, so
    the two parts can be told apart): the search returns c₀ and b₀ within their sampling error,
    and the rows' 95 % intervals at them cover 95 % ± 1 % (one row of rounding)."""
    g = torch.Generator().manual_seed(int(true_scale * 100))
    latent = 10 ** (2 * torch.rand(8000, generator=g, dtype=torch.float64) - 1)
    noise = 0.5
    variance = true_scale * latent + true_factor * noise
    err2 = (torch.randn(8000, generator=g, dtype=torch.float64) * variance.sqrt()).square()
    scale, factor = calibration.fit_factors(err2, latent, noise)
    assert math.isclose(scale, true_scale, rel_tol=0.1)
    assert math.isclose(factor, true_factor, rel_tol=0.25)
    inside = _share_inside(err2, latent, factor * noise, scale)
    assert abs(inside - 0.95) <= 0.01 + 1 / 8000
    lo, hi = covering_scale_range(err2, latent, factor * noise, 0.01)
    assert lo <= scale <= hi
    assert _share_inside(err2, latent, factor * noise, lo) >= 0.94 - 1 / 8000


def test_the_factors_move_into_the_covering_range_where_the_tails_are_heavy():
    """Student-t errors (3 degrees of freedom, unit variance): the NLL's factor lets too many
    rows outside; the search moves it up until 94 % of them are inside."""
    torch.manual_seed(0)
    latent = torch.ones(5000, dtype=torch.float64)
    err2 = (torch.distributions.StudentT(3.0).sample((5000,)).double() / math.sqrt(3.0)).square()
    scale, factor = calibration.fit_factors(err2, latent, 1e-4)
    assert _share_inside(err2, latent, factor * 1e-4, scale) >= 0.94 - 1 / 5000


def test_where_the_latent_factor_cannot_reach_the_coverage_the_noise_moves():
    """Errors far below the noise floor with no latent variance (a noiseless function at the
    likelihood's floor of σ²): c alone cannot narrow the intervals, so b goes below 1."""
    g = torch.Generator().manual_seed(1)
    latent = torch.zeros(2000, dtype=torch.float64)
    err2 = (1e-3 * torch.randn(2000, generator=g, dtype=torch.float64)).square()
    scale, factor = calibration.fit_factors(err2, latent, 1e-4)
    assert math.isclose(factor * 1e-4, 1e-6, rel_tol=0.15)
    assert abs(_share_inside(err2, latent, factor * 1e-4, scale) - 0.95) <= 0.01 + 1 / 2000


def _trained(n=1200, noise=1e-4, seed=0, epochs=100, **kw):
    """CaGP-Opt with 40 actions trained for ``epochs`` on a smooth 2-D function plus noise of
    variance ``noise`` (the calibration is for trained actions: random ones predict new rows
    otherwise than rows of their own blocks)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64)
    y = torch.sin(5 * x[:, 0]) * torch.cos(3 * x[:, 1]) + math.sqrt(noise) * torch.randn(
        n, generator=g, dtype=torch.float64)
    model = opt_model(x, y, 40, lengthscale=0.3, outputscale=1.0, noise=noise, **kw)
    if epochs:
        fit(model, None, (x, y), FitConfig(epochs=epochs, lr=0.05, progress=False))
    return model, x, y


def test_finalize_scales_the_predictive_variance_not_the_mean():
    """finalize fits c and b on the left-out rows; the predictive on every row is the
    uncalibrated one with its latent variance times c and its noise times b, the same mean;
    the model's σ² (what its posterior conditions with) is unchanged."""
    model, x, y = _trained()
    x_test = torch.rand(50, 2, dtype=torch.float64)
    with torch.no_grad():
        before = model.predict(model.condition(x, y), x_test)
        found = model.finalize(x, y)
        after = model.predict(model.condition(x, y), x_test)
    scale, factor = found["variance_scale"], found["noise_scale"]
    assert (float(model.variance_scale), float(model.noise_scale)) == (scale, factor)
    assert found["left_out_rows"] == 120 and scale != 1.0
    torch.testing.assert_close(after.mean, before.mean, **TOL)
    torch.testing.assert_close(after.variance, scale * before.variance, **TOL)
    torch.testing.assert_close(after.noise, factor * before.noise, **TOL)
    assert float(model.noise.detach()) == pytest.approx(float(before.noise), rel=1e-12)
    assert abs(found["left_out_coverage"] - 0.95) <= 0.01 + 1 / 120


def test_a_near_noiseless_fit_gets_narrower_intervals_that_cover_new_rows():
    """Near-noiseless data, 40 trained actions on 1,200 rows: the uncalibrated intervals cover
    almost every new row; the calibrated ones, fitted on training rows predicted from the
    others, cover 95 % ± 3 % of 2,000 new rows and give them a lower negative log density."""
    model, x, y = _trained(noise=1e-4)
    g = torch.Generator().manual_seed(9)
    x_new = torch.rand(2000, 2, generator=g, dtype=torch.float64)
    y_new = torch.sin(5 * x_new[:, 0]) * torch.cos(3 * x_new[:, 1]) + 1e-2 * torch.randn(
        2000, generator=g, dtype=torch.float64)  # the training rows' noise
    with torch.no_grad():
        plain = model.predict(model.condition(x, y), x_new)
        model.finalize(x, y)
        scaled = model.predict(model.condition(x, y), x_new)
    cover = [float(((y_new - p.mean).abs() <= Z * p.observed_variance.sqrt()).double().mean())
             for p in (plain, scaled)]
    assert cover[0] > 0.99
    assert float(model.variance_scale) < 0.5
    assert abs(cover[1] - 0.95) <= 0.03
    nll = [0.5 * float((torch.log(2 * math.pi * p.observed_variance)
                        + (y_new - p.mean).square() / p.observed_variance).mean())
           for p in (plain, scaled)]
    assert nll[1] < nll[0]


def test_the_harness_hands_its_posterior_to_the_calibration(monkeypatch):
    """After training, ``train_built`` conditions CaGP-Opt once on every row and the
    calibration starts from that posterior (its rows were held out of training, their entries
    zero: no further conditioning), not three times; the factors and the state are those of a
    separate calibration and conditioning."""
    model, x, y = _trained(epochs=0)
    with torch.no_grad():
        reference = copy.deepcopy(model)
        expected = reference.finalize(x, y)
        expected_state = reference.condition(x, y)
    calls = []
    original = type(model).condition

    def counted(self, *args, **kwargs):
        calls.append(kwargs.get("actions") is None)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "condition", counted)
    history, state = train_built(model, (x, y), FitConfig(epochs=1, lr=1e-12, progress=False))
    # the one epoch's and the harness's posterior, which the calibration reuses
    assert model.policy.held.any() and calls == [True, True], calls
    found = history.rows[-1]
    assert found["variance_scale"] == pytest.approx(expected["variance_scale"], rel=1e-6)
    assert found["noise_scale"] == pytest.approx(expected["noise_scale"], rel=1e-6)
    torch.testing.assert_close(state.repr_weights_proj, expected_state.repr_weights_proj,
                               rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("case", ["off", "few rows", "several processes"])
def test_no_calibration_leaves_the_factor_at_one(case):
    """``calibrate='off'``, fewer than MIN_ROWS rows, or a data-parallel run (``reduce``):
    finalize changes nothing, and the factors stay 1."""
    model, x, y = _trained(n=500 if case == "few rows" else 1200,
                           **({"calibrate": "off"} if case == "off" else {}))
    reduce = (lambda t: t) if case == "several processes" else None
    assert model.finalize(x, y, reduce) is None
    assert float(model.variance_scale) == float(model.noise_scale) == 1.0


def test_a_state_without_the_factors_loads_with_one():
    """A state dict saved before the factors existed loads (strict) with the factors 1; saved
    factors come back."""
    model, x, y = _trained()
    names = ("variance_scale", "noise_scale")
    state = {k: v for k, v in model.state_dict().items() if k not in names}
    model.variance_scale.fill_(0.3)
    model.noise_scale.fill_(0.2)
    model.load_state_dict(state)
    assert float(model.variance_scale) == float(model.noise_scale) == 1.0
    model.variance_scale.fill_(0.3)
    model.noise_scale.fill_(0.2)
    other, _, _ = _trained()
    other.load_state_dict(model.state_dict())
    assert (float(other.variance_scale), float(other.noise_scale)) == (0.3, 0.2)


def test_an_unknown_calibration_is_refused():
    x, y = toy_data()
    with pytest.raises(ValueError, match="calibrate"):
        opt_model(x, y, 8, calibrate="sometimes")
