"""Ctrl-C under ``graceful_interrupt``: the first stops training after its step and keeps what
was trained (history ``stopped: interrupted``, checkpoint written); the second raises at once;
outside the context Ctrl-C is the usual KeyboardInterrupt. SIGTERM inside the context does the
same as Ctrl-C."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn

from gpscale.io import read_file
from gpscale.training import FitConfig, fit
from gpscale.training.interrupt import graceful_interrupt, received, requested


class Line(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))


def _loss(model, x, y):
    return ((x[:, 0] * model.w - y) ** 2).mean()


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, generator=g)
    return x, 3 * x[:, 0]


class CtrlC:
    """Sends this process ``signum`` (SIGINT: Ctrl-C) at the end of epoch ``at``."""

    def __init__(self, at: int, signum: int = signal.SIGINT):
        self.at = at
        self.signum = signum

    def on_epoch_end(self, model, epoch, row, final=False):
        if epoch == self.at:
            os.kill(os.getpid(), self.signum)


def test_first_ctrl_c_ends_training_after_the_step_with_a_checkpoint(tmp_path):
    ckpt = tmp_path / "c.pt"
    config = FitConfig(lr=0.05, epochs=50, batch_size=8, scheduler="none", progress=False,
                       checkpoint=str(ckpt))
    model = Line()
    with graceful_interrupt():
        history = fit(model, _loss, _data(), config, callbacks=[CtrlC(at=2)])
        assert requested()
    assert not requested()  # cleared with the context
    # the signal arrived after epoch 2's callbacks: epoch 3 stopped after its first step
    assert history.stopped == "interrupted" and history.epochs == 3
    saved = read_file(ckpt, ("checkpoint",))
    assert saved["epoch"] == 3
    torch.testing.assert_close(saved["model"]["w"], model.w.detach())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_second_ctrl_c_raises_at_once():
    with graceful_interrupt():
        os.kill(os.getpid(), signal.SIGINT)
        assert requested()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10 ** 6):  # the handler runs between bytecodes
                pass


def test_outside_the_context_ctrl_c_is_a_keyboard_interrupt():
    config = FitConfig(lr=0.05, epochs=50, scheduler="none", progress=False)
    with pytest.raises(KeyboardInterrupt):
        fit(Line(), _loss, _data(), config, callbacks=[CtrlC(at=2)])
    assert not requested()


def test_sigterm_ends_training_after_the_step_like_ctrl_c(tmp_path):
    """A job scheduler's stop (SIGTERM) keeps what was trained, as Ctrl-C does, and is named."""
    ckpt = tmp_path / "c.pt"
    config = FitConfig(lr=0.05, epochs=50, batch_size=8, scheduler="none", progress=False,
                       checkpoint=str(ckpt))
    with graceful_interrupt():
        # without the handler SIGTERM would end this test process: check it before sending
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        history = fit(Line(), _loss, _data(), config,
                      callbacks=[CtrlC(at=2, signum=signal.SIGTERM)])
        assert requested() and received() == "SIGTERM"
    assert received() is None
    assert history.stopped == "interrupted" and history.epochs == 3
    assert read_file(ckpt, ("checkpoint",))["epoch"] == 3
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_second_signal_after_sigterm_raises_naming_it():
    with graceful_interrupt():
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGTERM)
        assert received() == "SIGTERM"
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10 ** 6):  # the handler runs between bytecodes
                pass
