"""The budget's anneal of the plateau schedule (``FitConfig.budget_anneal``): a minibatch run
has lowered its learning rate at least once, twice and three times by 50, 75 and 90 % of its
budget, whichever of epochs and time runs out first."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from torch import nn

from gpscale.run import plan_text
from gpscale.training import FitConfig, fit, resolve_fit_config
from gpscale.training.schedules import ANNEAL_AT, WINDOW_STEPS, Schedule

BASE = FitConfig(lr=1.0, epochs=20, scheduler="plateau", patience=50, lr_end_factor=0.01,
                 plateau_factor=0.3, budget_anneal=True)


def _schedule(config: FitConfig = BASE, steps_per_epoch: int = 10) -> Schedule:
    optimizer = torch.optim.Adam([nn.Parameter(torch.zeros(()))], lr=config.lr)
    return Schedule(optimizer, config, steps_per_epoch)


def _falling(t: int) -> float:
    """A loss that improves by far more than min_delta every epoch: no plateau ever."""
    return 10.0 - 0.5 * t


def test_an_epoch_budget_lowers_the_rate_at_half_three_quarters_and_nine_tenths():
    schedule = _schedule()
    lrs = []
    for t in range(1, 21):
        assert schedule.epoch_end(t, _falling(t), clock=0.0) is None  # never stops the run
        lrs.append(schedule.optimizer.param_groups[0]["lr"])
    # epochs 10, 15 and 18 of 20 are the first at 0.5, 0.75 and 0.9 of the budget
    assert lrs == pytest.approx([1.0] * 9 + [0.3] * 5 + [0.09] * 3 + [0.027] * 3)
    assert schedule.reductions == 3 and ANNEAL_AT == (0.5, 0.75, 0.9)


def test_a_time_budget_anneals_on_the_clock():
    schedule = _schedule(replace(BASE, epochs=1000, max_time=100.0))
    schedule.epoch_end(1, _falling(1), clock=49.0)
    assert schedule.lr == 1.0
    schedule.epoch_end(2, _falling(2), clock=51.0)
    assert schedule.lr == pytest.approx(0.3)
    schedule.epoch_end(3, _falling(3), clock=95.0)  # past 0.75 and 0.9 at once: two steps
    assert schedule.lr == pytest.approx(0.027) and schedule.reductions == 3


def test_the_anneal_never_goes_below_the_rate_floor():
    """lr_end_factor 0.05: 0.3 and 0.09 are allowed, 0.027 is not; the run is not ended."""
    schedule = _schedule(replace(BASE, lr_end_factor=0.05))
    results = [schedule.epoch_end(t, _falling(t), 0.0) for t in range(1, 21)]
    assert "converged" not in results
    assert schedule.lr == pytest.approx(0.09) and schedule.reductions == 2


def test_a_rate_the_plateaus_lowered_already_is_kept():
    """Two plateaus before half the budget: lr 0.09 is below what 0.5 and 0.75 ask for."""
    schedule = _schedule(replace(BASE, epochs=100), steps_per_epoch=50)
    for t in range(1, 7):  # a flat loss: plateaus (2 epochs' patience) at epochs 3 and 5
        schedule.epoch_end(t, 20.0, 0.0)
    assert schedule.lr == pytest.approx(0.09)
    reductions = schedule.reductions
    for t in range(8, 80):
        schedule.epoch_end(t, _falling(t), 0.0)
    assert schedule.lr == pytest.approx(0.09) and schedule.reductions == reductions
    schedule.epoch_end(90, _falling(90), 0.0)
    assert schedule.lr == pytest.approx(0.027)


@pytest.mark.parametrize("config, steps", [
    (BASE, 1),  # full batch: no gradient noise to anneal
    (replace(BASE, budget_anneal=False), 10),  # switched off
    (replace(BASE, scheduler="none", patience=None), 10),  # another schedule
])
def test_no_anneal_outside_minibatch_plateau_runs(config, steps):
    schedule = _schedule(config, steps)
    for t in range(1, 21):
        schedule.epoch_end(t, _falling(t), clock=0.0)
    assert schedule.lr == 1.0 and schedule.reductions == 0


def test_every_method_default_anneals_and_the_plan_says_so():
    config = resolve_fit_config("svgp", 100_000)
    assert config.budget_anneal and config.batch_size is not None
    assert "and at 50/75/90% of the budget" in plan_text("svgp", config)
    full = resolve_fit_config("cagp-opt", 10_000)
    assert full.budget_anneal and full.batch_size is None
    assert "of the budget" not in plan_text("cagp-opt", full)
    paper = resolve_fit_config("svgp", 100_000, preset="paper")
    assert not paper.budget_anneal


class Line(nn.Module):
    """loss = p: a constant gradient, so each Adam step moves p by (almost exactly) lr."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.zeros(()))


def test_a_windowed_epoch_anneals_within_the_epoch(monkeypatch):
    """2,000 one-row steps an epoch (judged in windows of WINDOW_STEPS) and a time budget of
    10 s on a simulated clock that advances 0.01 s a step: the rate falls at the first window
    ends past 5 s (step 600) and 7.5 s (step 800), and the budget ends the epoch at step 1,000.
    On a constant gradient each Adam step moves p by the rate it used."""
    assert WINDOW_STEPS == 200
    steps = []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.01 * len(steps))

    def loss(model, x, y):
        steps.append(float(model.p.detach()))
        return model.p

    data = (torch.zeros(2000, 1), torch.zeros(2000))
    config = replace(BASE, lr=0.1, lr_end_factor=0.001, epochs=5, batch_size=1, max_time=10.0,
                     progress=False)
    history = fit(Line(), loss, data, config)
    assert history.stopped == "time" and history.epochs == 1 and len(steps) == 1000
    moves = -torch.tensor(steps, dtype=torch.float64).diff()  # moves[i]: step i + 1's
    for (first, last), lr in {(0, 599): 0.1, (600, 799): 0.03, (800, 998): 0.009}.items():
        assert moves[first:last + 1].tolist() == pytest.approx([lr] * (last - first + 1),
                                                               rel=1e-3), (first, last)
