"""training.fit: optimisers, schedules, budgets, callbacks, checkpoints and failure handling."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gpscale.errors import NonFiniteLossError
from gpscale.io import read_file
from gpscale.methods.base import Method
from gpscale.training import FitConfig, History, fit


class Quadratic(nn.Module):
    """loss = mean_j (w - y_j)^2 with minimiser w* = mean(y)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))


def quad_loss(model, x, y):
    return ((model.w - y) ** 2).mean()


@pytest.fixture
def data():
    y = torch.arange(10, dtype=torch.float64)  # mean 4.5
    return torch.zeros(10, 1), y


def test_adam_reaches_minimiser(data):
    """Adam on a convex quadratic converges to the sample mean."""
    model = Quadratic()
    hist = fit(model, quad_loss, data, FitConfig(lr=0.2, epochs=300, progress=False))
    torch.testing.assert_close(model.w.detach(), torch.tensor(4.5), atol=1e-3, rtol=0)
    assert hist.epochs == 300 and hist.stopped == "epochs"


def test_lbfgs_reaches_minimiser_in_one_epoch(data):
    """L-BFGS with a Wolfe line search solves a quadratic in one step; loss = variance."""
    model = Quadratic()
    hist = fit(model, quad_loss, data, FitConfig(optimizer="lbfgs", lr=1.0, epochs=1,
                                                   progress=False))
    torch.testing.assert_close(model.w.detach(), torch.tensor(4.5), atol=1e-6, rtol=0)
    # Reported loss is the value at the new parameters: the population variance of 0..9.
    assert hist.rows[0]["loss"] == pytest.approx(8.25, abs=1e-6)


def test_linear_schedule_decays_to_end_factor(data):
    """LinearLR: lr_e = lr * (1 - (1 - f) * (e - 1) / E) for epoch e of E."""
    model = Quadratic()
    cfg = FitConfig(lr=0.1, epochs=5, scheduler="linear", lr_end_factor=0.1, progress=False)
    hist = fit(model, quad_loss, data, cfg)
    expected = [0.1 * (1 - 0.9 * e / 5) for e in range(5)]
    assert hist.column("lr") == pytest.approx(expected)


def test_minibatch_loss_is_mean_over_points(data):
    """Epoch loss = size-weighted mean of batch losses; with w fixed that is the full loss."""
    model = Quadratic()
    model.w.requires_grad_(True)
    cfg = FitConfig(lr=1e-12, epochs=1, batch_size=3, progress=False)  # w does not move
    hist = fit(model, quad_loss, data, cfg)
    assert hist.rows[0]["loss"] == pytest.approx(float((data[1] ** 2).mean()), rel=1e-9)


def test_batches_visit_every_point_once():
    """Each epoch's minibatches partition the data (last batch may be smaller)."""
    seen = []

    def loss(model, x, y):
        seen.append(y.clone())
        return (model.w * 0 + y).sum() * 0 + model.w ** 2

    fit(Quadratic(), loss, (torch.zeros(10, 1), torch.arange(10.0)),
        FitConfig(epochs=1, batch_size=4, progress=False))
    assert [len(s) for s in seen] == [4, 4, 2]
    assert sorted(torch.cat(seen).tolist()) == list(range(10))


def test_wall_clock_budget_stops_early(data):
    """max_time stops after the epoch in which the budget ran out."""
    def slow(model, x, y):
        t = torch.ones(300, 300)
        for _ in range(20):
            t = t @ t / 300
        return quad_loss(model, x, y) + 0 * t.sum()

    hist = fit(Quadratic(), slow, data, FitConfig(epochs=10_000, max_time=0.2, progress=False))
    assert hist.stopped == "time"
    assert hist.epochs < 10_000
    assert hist.train_time >= 0.2


def test_eval_every_k_epochs_and_final(data):
    """Callbacks get every k-th epoch plus the last; their metrics land in the history."""
    calls = []

    class Probe:
        def on_epoch_end(self, model, epoch, row, final=False):
            if epoch % 3 and not final:
                return None
            calls.append(epoch)
            return {"w": float(model.w)}

    hist = fit(Quadratic(), quad_loss, data, FitConfig(epochs=7, progress=False),
               callbacks=[Probe()])
    assert calls == [3, 6, 7]
    assert [r.get("w") is not None for r in hist.rows] == [e in (3, 6, 7) for e in range(1, 8)]


def test_resume_continues_exactly(tmp_path, data):
    """A run killed after epoch 3 and resumed ends with the same parameters and history."""
    cfg = FitConfig(lr=0.05, epochs=6, batch_size=3, scheduler="linear", progress=False,
                    checkpoint=str(tmp_path / "ckpt.pt"))
    ref = Quadratic()
    ref_hist = fit(ref, quad_loss, data, cfg.updated(checkpoint=str(tmp_path / "ref.pt")))

    class Kill:
        def on_epoch_end(self, model, epoch, row, final=False):
            if epoch == 4:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(Quadratic(), quad_loss, data, cfg, callbacks=[Kill()])
    resumed = Quadratic()
    hist = fit(resumed, quad_loss, data, cfg)
    torch.testing.assert_close(resumed.w.detach(), ref.w.detach(), rtol=0, atol=0)
    assert hist.column("loss") == ref_hist.column("loss")
    assert hist.column("epoch") == list(range(1, 7))


def test_numerical_error_in_an_epoch_keeps_the_last_good_state(data):
    """A failing Cholesky in epoch 3 stops training like a NaN loss: epoch-2 parameters kept."""
    from gpscale.errors import NumericalError

    def fails(model, x, y):
        if len(calls) == 2:
            raise NumericalError("Cholesky of G failed")
        return quad_loss(model, x, y)

    calls = []

    class Count:
        def on_epoch_end(self, model, epoch, row, final=False):
            calls.append(float(model.w))

    model = Quadratic()
    with pytest.raises(NonFiniteLossError, match="epoch 3 failed .Cholesky of G") as info:
        fit(model, fails, data, FitConfig(lr=0.1, epochs=10, progress=False), callbacks=[Count()])
    assert info.value.epoch == 3 and info.value.history.epochs == 2
    assert info.value.history.stopped == "numerical-error"
    assert float(model.w) == calls[-1]


@pytest.mark.parametrize("failure", ["numerical-error", "nan"])
def test_lbfgs_line_search_steps_back_from_points_where_the_model_fails(failure, data):
    """Trial points with w > 6 fail; the minimiser 4.5 lies inside, so L-BFGS must still find it.

    lr = 10 makes the first trial step land at w = 90 (gradient −9 at w = 0), in the failing
    region: the search has to retreat instead of ending training there.
    """
    from gpscale.errors import NumericalError

    def fails_beyond_six(model, x, y):
        if float(model.w) > 6.0:
            if failure == "nan":
                return model.w * float("nan")
            raise NumericalError("Cholesky of G failed")
        return quad_loss(model, x, y)

    model = Quadratic()
    hist = fit(model, fails_beyond_six, data, FitConfig(optimizer="lbfgs", lr=10.0, epochs=3,
                                                         progress=False))
    assert hist.stopped == "epochs"
    torch.testing.assert_close(model.w.detach(), torch.tensor(4.5), atol=1e-4, rtol=0)
    assert hist.rows[-1]["loss"] == pytest.approx(8.25, abs=1e-6)


def test_non_finite_loss_stops_and_keeps_last_good_state(tmp_path, data):
    """A NaN loss raises NonFiniteLossError; parameters and checkpoint keep the last good epoch."""
    def blows_up(model, x, y):
        loss = quad_loss(model, x, y)
        return loss if len(calls) < 3 else loss * float("nan")

    calls = []

    class Count:
        def on_epoch_end(self, model, epoch, row, final=False):
            calls.append(float(model.w))

    model = Quadratic()
    ckpt = tmp_path / "c.pt"
    with pytest.raises(NonFiniteLossError, match="epoch 4") as info:
        fit(model, blows_up, data, FitConfig(lr=0.1, epochs=10, progress=False,
                                             checkpoint=str(ckpt)), callbacks=[Count()])
    assert info.value.epoch == 4
    assert info.value.history.epochs == 3
    assert info.value.checkpoint == str(ckpt)
    assert float(model.w) == calls[-1]
    saved = read_file(ckpt, ("checkpoint",))
    assert saved["epoch"] == 3 and float(saved["model"]["w"]) == calls[-1]


def test_history_csv_and_json(tmp_path, data):
    hist = fit(Quadratic(), quad_loss, data, FitConfig(epochs=3, progress=False))
    hist.to_csv(tmp_path / "h.csv")
    hist.to_json(tmp_path / "h.json")
    lines = (tmp_path / "h.csv").read_text().splitlines()
    assert lines[0] == "epoch,time_s,loss,lr" and len(lines) == 4
    loaded = json.loads((tmp_path / "h.json").read_text())
    assert loaded["stopped"] == "epochs"
    assert [r["loss"] for r in loaded["rows"]] == hist.column("loss")
    assert History.from_state_dict(hist.state_dict()).rows == hist.rows


def test_progress_bar_silent_when_not_a_terminal(capfd, data):
    fit(Quadratic(), quad_loss, data, FitConfig(epochs=2))
    assert capfd.readouterr().err == ""


def test_progress_bar_when_asked(capfd, data):
    fit(Quadratic(), quad_loss, data, FitConfig(epochs=2, progress=True))
    assert "fit" in capfd.readouterr().err


@pytest.mark.parametrize("bad, match", [
    (dict(optimizer="sgd"), "optimizer"),
    (dict(lr=0.0), "lr"),
    (dict(epochs=0), "epochs"),
    (dict(batch_size=8, optimizer="lbfgs"), "full batch"),
    (dict(lr_end_factor=0.0), "lr_end_factor"),
], ids=["optimizer", "lr", "epochs", "lbfgs-batch", "end-factor"])
def test_config_rejects_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        FitConfig(**bad)


def test_seeds_make_minibatch_runs_reproducible(data):
    runs = []
    for _ in range(2):
        m = Quadratic()
        fit(m, quad_loss, data, FitConfig(lr=0.1, epochs=3, batch_size=3, seed=7,
                                         progress=False))
        runs.append(float(m.w))
    assert runs[0] == runs[1]


def test_fit_config_device_names_and_availability():
    """``device`` accepts cpu / cuda[:N] / auto; a malformed name or a GPU torch cannot see is a
    ValueError naming it, raised when the config is made (before any data is touched)."""
    assert FitConfig().torch_device == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert FitConfig(device="auto").torch_device.type == expected
    for bad in ("gpu0", "mps", ""):
        with pytest.raises(ValueError, match="device must be 'cpu', 'cuda', 'cuda:N' or 'auto'"):
            FitConfig(device=bad)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=rf"device 'cuda:{count}': torch sees {count} CUDA"):
        FitConfig(device=f"cuda:{count}")


class TwoWeights(Method):
    """loss = mean_j (u - y_j)² + mean_j (w - y_j)²; from a pre-fitted start (``max_start_lr``
    set) its ``prefit_lr_scales`` put ``slow.u`` at a share of the rate."""

    def __init__(self, scale: float):
        super().__init__()
        self.slow = nn.Module()
        self.slow.u = nn.Parameter(torch.zeros(()))
        self.w = nn.Parameter(torch.zeros(()))
        self.prefit_lr_scales = {"slow.": scale}
        self.max_start_lr = 1.0

    def condition(self, x, y):
        return y

    def loss(self, state):
        return two_loss(self, None, state)

    def predict(self, state, x_test):
        raise NotImplementedError


def two_loss(model, x, y):
    return ((model.slow.u - y) ** 2).mean() + ((model.w - y) ** 2).mean()


@pytest.mark.parametrize(("scheduler", "epochs", "rel"), [("none", 1, 1e-6), ("linear", 3, 2e-3)])
def test_a_declared_lr_scale_moves_its_parameters_at_that_share_of_the_rate(
        data, scheduler, epochs, rel):
    """Adam's first step moves each weight by its group's rate (|m̂/√v̂| = 1 up to ε), later
    steps by nearly as much while the gradient keeps its sign: ``slow.u`` by 0.25 of ``w``'s
    step, also under a schedule that changes the rate; the history records the base rate."""
    model = TwoWeights(0.25)
    cfg = FitConfig(lr=0.1, epochs=epochs, scheduler=scheduler, lr_end_factor=0.5,
                    progress=False)
    hist = fit(model, two_loss, data, cfg)
    moved_w, moved_u = float(model.w.detach()), float(model.slow.u.detach())
    assert hist.column("lr")[0] == pytest.approx(0.1)
    assert moved_w == pytest.approx(sum(hist.column("lr")), rel=rel)
    assert moved_u == pytest.approx(0.25 * moved_w, rel=rel)
