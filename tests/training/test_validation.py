"""training.validation: the held-out split, the best epoch kept and restored, and the stop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpscale.training import FitConfig, fit
from gpscale.training.validation import Validation, split_holdout


class Quadratic(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))


def quad_loss(model, x, y):
    return ((model.w - y) ** 2).mean()


def test_split_is_a_seeded_partition():
    x = torch.arange(50.0)[:, None]
    y = torch.arange(50.0)
    (xf, yf), (xh, yh) = split_holdout(x, y, 12, seed=3)
    assert xh.shape[0] == 12 and xf.shape[0] == 38
    assert sorted(torch.cat([yf, yh]).tolist()) == list(range(50))
    torch.testing.assert_close(xf[:, 0], yf)  # rows stay paired
    again = split_holdout(x, y, 12, seed=3)[1][1]
    other = split_holdout(x, y, 12, seed=4)[1][1]
    torch.testing.assert_close(again, yh)
    assert not torch.equal(other, yh)
    for rows in (0, 50):
        with pytest.raises(ValueError, match="hold out"):
            split_holdout(x, y, rows, seed=0)


def test_fit_keeps_the_best_heldout_epoch_and_stops_without_improvement():
    """Training pulls w from 0 to 10; the held-out score is best at w = 3, which the run passes:
    it stops ``patience`` epochs after the best, restores that epoch's w, and reports it."""
    x, y = torch.zeros(20, 1), torch.full((20,), 10.0)
    model = Quadratic()
    validation = Validation(lambda m: {"heldout": float((m.w - 3.0) ** 2), "w": float(m.w)},
                            patience=4)
    history = fit(model, quad_loss, (x, y), FitConfig(lr=0.5, epochs=200, progress=False,
                                                       scheduler="none"),
                  validation=validation)
    rows = history.rows
    scores = [row["heldout"] for row in rows]
    best = min(range(len(rows)), key=scores.__getitem__)
    assert history.stopped == "no-improvement"
    assert len(rows) < 200 and len(rows) - 1 - best >= 4
    assert rows[-1]["restored_epoch"] == rows[best]["epoch"]
    assert float(model.w.detach()) == pytest.approx(rows[best]["w"])
    assert abs(float(model.w.detach()) - 3.0) < 1.0
    assert all(b["time_s"] > a["time_s"] for a, b in zip(rows, rows[1:], strict=False))


def test_an_improving_score_keeps_the_last_epoch():
    x, y = torch.zeros(20, 1), torch.full((20,), 10.0)
    model = Quadratic()
    validation = Validation(lambda m: {"heldout": float((m.w - 10.0) ** 2)})
    history = fit(model, quad_loss, (x, y), FitConfig(lr=0.1, epochs=15, progress=False,
                                                       scheduler="none"),
                  validation=validation)
    assert history.stopped == "epochs" and "restored_epoch" not in history.rows[-1]
    assert validation.best_epoch == 15
    with pytest.raises(ValueError, match="patience"):
        Validation(lambda m: {"s": 0.0}, patience=0)


def test_patience_holds_a_minimum_of_optimiser_steps():
    from gpscale.training.validation import (
        VALIDATION_MIN_STEPS,
        VALIDATION_PATIENCE,
        validation_patience,
    )

    # many steps per epoch: the epoch count rules; few: enough epochs for the step minimum
    assert validation_patience(200_000, 1024) == VALIDATION_PATIENCE
    assert validation_patience(1_350, 1024) == VALIDATION_MIN_STEPS // 2
    assert validation_patience(1_350, None) == VALIDATION_MIN_STEPS
    epochs = validation_patience(9_000, 1024)
    assert epochs * 9 >= VALIDATION_MIN_STEPS > (epochs - 1) * 9
