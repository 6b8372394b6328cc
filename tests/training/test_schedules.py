"""Learning-rate schedules, stopping on convergence and backing off after a failed step."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from gpscale.errors import NonFiniteLossError, NumericalError
from gpscale.training import FitConfig, fit, resolve_fit_config
from gpscale.training.schedules import LOSS_SD, Schedule, patience_epochs


class Quadratic(nn.Module):
    """loss = (p - target)² with one parameter p starting at 0."""

    def __init__(self, target: float = 3.0):
        super().__init__()
        self.p = nn.Parameter(torch.zeros(()))
        self.target = target


def quadratic_loss(model, x, y):
    return (model.p - model.target) ** 2


def constant_loss(model, x, y):
    return 0.0 * model.p + 1.0


DATA = (torch.zeros(8, 1), torch.zeros(8))


def _optimizer():
    return torch.optim.Adam([nn.Parameter(torch.zeros(()))], lr=1.0)


def test_linear_matches_pytorch_linear_lr():
    config = FitConfig(lr=0.5, epochs=7, scheduler="linear", lr_end_factor=0.1)
    opt_ours, opt_torch = _optimizer(), _optimizer()
    opt_torch.step()  # (no gradients: a no-op that keeps LinearLR from warning)
    for group in opt_ours.param_groups + opt_torch.param_groups:
        group["lr"] = 0.5
    ours = Schedule(opt_ours, config, 1)
    theirs = torch.optim.lr_scheduler.LinearLR(opt_torch, 1.0, 0.1, total_iters=7)
    for epoch in range(1, 10):
        ours.epoch_end(epoch, 1.0, 0.0)
        theirs.step()
        assert math.isclose(opt_ours.param_groups[0]["lr"], opt_torch.param_groups[0]["lr"],
                            rel_tol=1e-12)


def test_budget_schedule_decays_with_the_clock():
    config = FitConfig(lr=1.0, epochs=1000, max_time=10.0, scheduler="budget",
                       lr_end_factor=0.1)
    opt = _optimizer()
    schedule = Schedule(opt, config, 1)
    schedule.epoch_end(1, 1.0, clock=5.0)  # half the time budget, a tenth of a percent of epochs
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0 - 0.9 * 0.5)
    schedule.epoch_end(2, 1.0, clock=20.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


def test_patience_is_counted_in_optimizer_steps():
    assert patience_epochs(50, 1) == 50  # full batch: one step an epoch
    assert patience_epochs(50, 15) == 4  # 15 minibatches an epoch
    assert patience_epochs(50, 1000) == 2  # at least two epochs


def test_plateau_lowers_the_rate_then_stops_as_converged():
    """A constant loss: after each 2-epoch plateau lr × 0.3 (1 → 0.3 → 0.09 → 0.027); the next
    would fall below 1% of the start, so the run stops in epoch 9, converged."""
    model = Quadratic()
    config = FitConfig(lr=1.0, epochs=100, scheduler="plateau", patience=2, plateau_factor=0.3,
                       lr_end_factor=0.01, progress=False)
    history = fit(model, constant_loss, DATA, config)
    assert history.stopped == "converged" and history.epochs == 9
    lrs = [row["lr"] for row in history.rows]
    assert lrs == pytest.approx([1.0, 1.0, 1.0, 0.3, 0.3, 0.09, 0.09, 0.027, 0.027])


def test_plateau_run_converges_on_a_quadratic_without_tuning():
    model = Quadratic(target=3.0)
    config = FitConfig(lr=1.0, epochs=2000, scheduler="plateau", patience=10,
                       lr_end_factor=1e-3, progress=False)
    history = fit(model, quadratic_loss, DATA, config)
    assert history.stopped == "converged" and history.epochs < 2000
    assert abs(float(model.p.detach()) - 3.0) < 1e-2


def test_patience_with_a_constant_rate_stops_on_a_plateau():
    config = FitConfig(lr=0.1, epochs=100, scheduler="none", patience=3, progress=False)
    history = fit(Quadratic(), constant_loss, DATA, config)
    assert history.stopped == "converged" and history.epochs == 4


class Fragile(Quadratic):
    """A loss that breaks down (NaN, or a failed factorisation) where p > 0.8."""


def _fragile_loss(kind):
    def loss(model, x, y):
        if float(model.p.detach()) > 0.8:
            if kind == "error":
                raise NumericalError("Cholesky failed")
            return model.p * math.nan
        return (model.p - 0.5) ** 2
    return loss


@pytest.mark.parametrize("kind", ["nan", "error"])
def test_plateau_backs_off_from_a_step_that_broke_the_model(kind):
    """Adam's first step moves p by lr = 1: p = 1 breaks the loss. The run warns, goes back to
    where that step started, retries at lr 0.3 (lower again if needed) and converges."""
    model = Fragile()
    config = FitConfig(lr=1.0, epochs=300, scheduler="plateau", patience=10,
                       lr_end_factor=1e-3, progress=False)
    with pytest.warns(RuntimeWarning, match="retrying it from its start at learning rate 0.3"):
        history = fit(model, _fragile_loss(kind), DATA, config)
    assert all(math.isfinite(row["loss"]) for row in history.rows)
    assert abs(float(model.p.detach()) - 0.5) < 0.02


def test_without_plateau_a_broken_step_still_stops_training():
    config = FitConfig(lr=1.0, epochs=50, scheduler="none", progress=False)
    with pytest.raises(NonFiniteLossError):
        fit(Fragile(), _fragile_loss("nan"), DATA, config)


def test_default_config_has_a_budget_that_explicit_epochs_replace():
    config = resolve_fit_config("svgp", 10_000)
    assert (config.scheduler, config.max_time, config.epochs) == ("plateau", 300.0, 1000)
    assert resolve_fit_config("svgp", 10_000, epochs=20).max_time is None
    assert resolve_fit_config("svgp", 10_000, epochs=20, max_time=5).max_time == 5
    paper = resolve_fit_config("svgp", 10_000, preset="paper")
    assert (paper.scheduler, paper.epochs, paper.lr, paper.max_time) == ("none", 50, 0.01, None)
    with pytest.raises(ValueError, match="unknown preset"):
        resolve_fit_config("svgp", 10, preset="fast")
    with pytest.raises(ValueError, match="needs a patience"):
        FitConfig(scheduler="plateau")


def _counting(loss):
    calls = []

    def fn(model, x, y):
        calls.append(x.shape[0])
        return loss(model, x, y)
    return fn, calls


def test_long_epochs_are_judged_in_windows_and_converge_within_one():
    """2,000 steps per epoch (> WINDOW_STEPS): a flat loss lowers the lr every 2 windows and
    converges inside the first epoch, after the steps that took — not after whole epochs."""
    from gpscale.training.schedules import WINDOW_STEPS

    data = (torch.zeros(2000, 1), torch.zeros(2000))
    config = FitConfig(lr=0.1, epochs=50, batch_size=1, scheduler="plateau", patience=50,
                       lr_end_factor=0.01, plateau_factor=0.3, min_delta=1e-3)
    loss, calls = _counting(constant_loss)
    history = fit(Quadratic(), loss, data, config)
    assert history.stopped == "converged" and history.epochs == 1
    # best at window 1, 2 windows without improvement per reduction: 0.1 → 0.03 → 0.009 →
    # 0.0027 → (0.00081 < 0.001: converged) = 1 + 2·4 windows
    assert len(calls) == 9 * WINDOW_STEPS


def test_short_epochs_keep_the_test_per_epoch():
    data = (torch.zeros(100, 1), torch.zeros(100))
    config = FitConfig(lr=0.1, epochs=50, batch_size=1, scheduler="plateau", patience=50,
                       lr_end_factor=0.01, plateau_factor=0.3, min_delta=1e-3)
    history = fit(Quadratic(), constant_loss, data, config)
    assert history.stopped == "converged" and history.epochs == 9


@pytest.mark.parametrize("rows", [5000, 150])  # longer and shorter than a window
def test_the_budget_ends_an_epoch_at_the_step_that_passes_it(rows):
    """Not at the next window's end: on 10^6 rows of SVGP, on a loaded machine, the run took
    362 s of its 300."""
    data = (torch.zeros(rows, 1), torch.zeros(rows))
    config = FitConfig(lr=0.1, epochs=50, batch_size=1, scheduler="none", max_time=1e-6)
    loss, calls = _counting(quadratic_loss)
    history = fit(Quadratic(), loss, data, config)
    assert history.stopped == "time" and history.epochs == 1
    assert len(calls) == 1
    assert math.isfinite(history.last("loss"))


def _cliff_loss(model, x, y):
    """(p − 1)² up to p = 1.5, then flat at 0.25 with no gradient: momentum carries Adam past
    the minimum onto a plateau it cannot leave."""
    p = model.p
    return torch.where(p < 1.5, (p - 1) ** 2, 0.25 + 0.0 * p)


def test_full_batch_plateau_restores_the_best_parameters():
    config = FitConfig(lr=0.5, epochs=200, scheduler="plateau", patience=5, lr_end_factor=0.01,
                       plateau_factor=0.3, min_delta=1e-3)
    model = Quadratic()
    history = fit(model, _cliff_loss, DATA, config)
    assert history.stopped == "converged"
    assert max(r["loss"] for r in history.rows[1:6]) >= 0.25  # it did fall onto the plateau
    assert float(_cliff_loss(model, None, None)) < 0.05  # and ends at the best point seen
    # without the restore it would stay on the plateau (checked with a minibatch-like config
    # that disables it: the same landscape, batches of 4 of the 8 rows)
    stuck = Quadratic()
    fit(stuck, _cliff_loss, DATA, FitConfig(**{**config.__dict__, "batch_size": 4}))
    assert float(_cliff_loss(stuck, None, None)) == 0.25


def _noise_schedule(num_train: int, steps_per_epoch: int = 1, noise_plateau: bool = True):
    config = FitConfig(lr=1.0, epochs=1000, scheduler="plateau", patience=50,
                       lr_end_factor=0.01, noise_plateau=noise_plateau)
    return Schedule(_optimizer(), config, steps_per_epoch, num_train)


def test_noise_floor_is_the_standard_error_of_a_per_datum_loss():
    schedule = _noise_schedule(5000)
    assert schedule.floor == pytest.approx(LOSS_SD / math.sqrt(5000))
    assert schedule.floor == pytest.approx(0.0100, abs=1e-4)
    # the sd of a standard normal's ½ z², which LOSS_SD stands for
    z = torch.randn(400_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert float((0.5 * z.square()).std()) == pytest.approx(LOSS_SD, rel=0.01)
    assert _noise_schedule(5000, steps_per_epoch=15).floor == 0.0  # minibatch epochs: no floor
    assert _noise_schedule(5000, noise_plateau=False).floor == 0.0


def test_a_steady_descent_below_the_noise_floor_converges_at_its_first_plateau():
    """1e-4 per epoch at n = 5,000 (floor 0.01): no improvement that counts within 50 epochs,
    and no rise at all, so the run has converged; the learning rate was never lowered. Without
    the noise test the same losses improve by 1e-3 every 10 epochs and never plateau."""
    losses = [1.0 - 1e-4 * t for t in range(400)]
    schedule, plain = _noise_schedule(5000), _noise_schedule(5000, noise_plateau=False)
    stops = [t for t, loss in enumerate(losses, 1)
             if schedule.epoch_end(t, loss, 0.0) == "converged"]
    assert stops[0] == 51 and schedule.lr == 1.0 and schedule.steady
    assert all(plain.epoch_end(t, loss, 0.0) is None for t, loss in enumerate(losses, 1))
    assert plain.lr == 1.0


def test_an_oscillating_plateau_lowers_the_rate_instead():
    """Losses that swing by 0.02 about a flat level: the rises exceed the margin, so the
    plateau is the step size's, and the rate falls (1 → 0.3) rather than the run stopping."""
    schedule = _noise_schedule(5000)
    results = [schedule.epoch_end(t, 1.0 + 0.02 * (t % 2), 0.0) for t in range(1, 54)]
    assert "converged" not in results and not schedule.steady
    assert schedule.lr == pytest.approx(0.3) and schedule.reductions == 1


def test_the_noise_window_survives_a_checkpoint():
    schedule = _noise_schedule(5000)
    for t in range(1, 30):
        schedule.epoch_end(t, 1.0 - 1e-4 * t, 0.0)
    again = _noise_schedule(5000)
    again.load_state_dict(schedule.state_dict())
    assert again.recent == schedule.recent and len(again.recent) == 29
    for t in range(30, 52):  # the resumed schedule stops where the uninterrupted one does
        assert again.epoch_end(t, 1.0 - 1e-4 * t, 0.0) == schedule.epoch_end(
            t, 1.0 - 1e-4 * t, 0.0)
    assert again.steady and schedule.steady


def test_default_full_batch_training_stops_on_a_steady_plateau():
    """Through ``fit`` with a method's default settings: a loss that creeps down by 1e-6 per
    step (far below 0.71/√8) ends as converged after the patience window, at lr unchanged."""
    model = Quadratic(target=1e6)
    config = replace(resolve_fit_config("cagp-opt", 8), lr=1e-6, max_time=None,
                     progress=False)
    assert config.noise_plateau and config.batch_size is None

    def creeping(model, x, y):
        return 1.0 + 1e-6 * (model.p - model.target).abs() / model.target

    history = fit(model, creeping, DATA, config)
    assert history.stopped == "converged" and history.epochs == 51
    assert {row["lr"] for row in history.rows} == {1e-6}


def test_the_optimum_preset_is_the_default_without_the_noise_stop():
    from gpscale.methods.registry import METHODS
    from gpscale.training.config import METHOD_DEFAULTS, OPTIMUM_CHANGES, OPTIMUM_DEFAULTS

    assert set(OPTIMUM_DEFAULTS) == set(METHOD_DEFAULTS) and len(OPTIMUM_DEFAULTS) == len(METHODS)
    for key, default in METHOD_DEFAULTS.items():
        assert OPTIMUM_DEFAULTS[key] == replace(default, **OPTIMUM_CHANGES), key
        assert OPTIMUM_DEFAULTS[key] is OPTIMUM_DEFAULTS[key]  # built once
    config = resolve_fit_config("exact", 1_000, preset="optimum", lr=0.5)
    assert (config.noise_plateau, config.min_delta, config.lr) == (False, 1e-6, 0.5)
    assert config.optimizer == resolve_fit_config("exact", 1_000).optimizer == "lbfgs"


def _periodic_data(n: int = 240):
    g = torch.Generator().manual_seed(3)
    x = torch.rand(n, 1, generator=g, dtype=torch.float64) * 6
    y = (torch.sin(2 * math.pi * x[:, 0]) + 0.6 * torch.sin(6 * math.pi * x[:, 0])
         + torch.cos(0.8 * x[:, 0])) + 0.1 * torch.randn(
        n, generator=g, dtype=torch.float64)
    return x.numpy(), y.numpy()


def test_the_optimum_preset_reaches_the_likelihoods_optimum():
    # The default stops where a step gains less than the loss's noise; the optimum preset goes
    # on until a further L-BFGS run to its own tolerance finds (almost) nothing left to gain.
    from gpscale.estimators import GPRegressor

    x, y = _periodic_data()
    kernel = "rbf(lengthscale=3) + periodic(period=1, lengthscale=1)"

    def fitted(preset):
        reg = GPRegressor(method="exact", kernel=kernel, preset=preset).fit(x, y)
        xs = reg.transform_.transform_x(torch.as_tensor(x))
        ys = reg.transform_.transform_y(torch.as_tensor(y))
        return reg.model_, reg.model_.condition(xs, ys)

    def polished(model, state) -> tuple[float, float]:
        start = float(model.loss(state).detach())
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.LBFGS(params, max_iter=400, line_search_fn="strong_wolfe",
                                tolerance_grad=1e-10, tolerance_change=1e-14)

        def closure():
            opt.zero_grad()
            loss = model.loss(state)
            loss.backward()
            return loss

        opt.step(closure)
        return start, float(model.loss(state).detach())

    start, best = polished(*fitted("optimum"))
    assert start - best < 1e-5  # per datum: under 0.0024 nats over the 240 points
    default_start, default_best = polished(*fitted("default"))
    assert default_best == pytest.approx(best, abs=1e-6)  # the same optimum
    assert default_start - default_best > 10 * (start - best)  # which the default stops short of


def test_the_estimator_checks_its_preset():
    from gpscale.estimators import GPRegressor

    x, y = _periodic_data(20)
    with pytest.raises(ValueError, match="preset"):
        GPRegressor(method="exact", preset="fast").fit(x, y)
    assert GPRegressor(preset="optimum").get_params()["preset"] == "optimum"
