"""Resuming from a checkpoint: a change to anything that shapes the result is refused in one line
naming it (old and new value) and saying how to go on; a new budget (epochs, time) is not."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import pytest
import torch

from gpscale.errors import SavedFileError
from gpscale.methods import build
from gpscale.training import FitConfig, fit, resolve_fit_config

N = 24


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(N, 2, generator=g)
    return x, torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(N, generator=g)


def _model(**options):
    return build("svgp", 2, init=_data(), **{"num_inducing": 4, **options})


def _config(path, **changes) -> FitConfig:
    base = FitConfig(lr=0.05, epochs=2, batch_size=12, seed=0, progress=False,
                     checkpoint=str(path))
    return replace(base, **changes)


def _first_run(tmp_path):
    ckpt = tmp_path / "c.pt"
    fit(_model(), None, _data(), _config(ckpt))
    return ckpt, ckpt.read_bytes()


@pytest.mark.parametrize(("options", "settings", "needle"), [
    ({"kernel": "rbf"}, {},
     "-o kernel=matern32; this run uses -o kernel=rbf: pass -o kernel=matern32 to continue"),
    ({"num_inducing": 6}, {},
     "-o num_inducing=4; this run uses -o num_inducing=6: pass -o num_inducing=4"),
    ({}, {"lr": 0.1}, "learning rate 0.05; this run uses 0.1 (--lr): pass --lr 0.05"),
    ({}, {"seed": 3}, "seed 0; this run uses 3 (--seed): pass --seed 0"),
    ({}, {"batch_size": 8}, "batch size 12; this run uses 8 (--batch-size): pass "
                            "--batch-size 12"),
    ({}, {"batch_size": None}, "batch size 12; this run uses full batch (--batch-size)"),
    ({}, {"scheduler": "linear"}, "schedule none; this run uses linear (--scheduler)"),
    ({}, {"grad_clip": 1.0}, "grad_clip none; this run uses 1"),
], ids=["kernel", "inducing", "lr", "seed", "batch-size", "full-batch", "scheduler", "clip"])
def test_resume_refuses_a_changed_setting(options, settings, needle, tmp_path):
    ckpt, before = _first_run(tmp_path)
    with pytest.raises(SavedFileError) as info:
        fit(_model(**options), None, _data(), _config(ckpt, epochs=4, **settings))
    message = str(info.value)
    assert message.startswith(f"{ckpt}: was written by a run with ") and "\n" not in message
    assert needle in message
    assert message.endswith("delete it or pass another checkpoint path to train from the start")
    assert ckpt.read_bytes() == before  # nothing trained over it


def test_resume_refuses_another_preset(tmp_path):
    """The paper preset after the default one: named as the preset, not as one of its fields."""
    ckpt = tmp_path / "c.pt"
    default = replace(resolve_fit_config("svgp", N), epochs=2, max_time=None, progress=False,
                      checkpoint=str(ckpt))
    fit(_model(), None, _data(), default)
    paper = replace(resolve_fit_config("svgp", N, preset="paper"), epochs=4, lr=default.lr,
                    progress=False, checkpoint=str(ckpt))
    with pytest.raises(SavedFileError, match=re.escape(
            "preset default; this run uses paper (--preset): pass --preset default")):
        fit(_model(), None, _data(), paper)


def test_resume_refuses_other_data_of_the_same_shape(tmp_path):
    """Other data with the same rows: named as data, not as the start values the method takes
    from the data (the mean of y)."""
    ckpt, before = _first_run(tmp_path)
    with pytest.raises(SavedFileError, match="other training data of the same shape"):
        fit(_model(), None, _data(seed=1), _config(ckpt, epochs=4))
    assert ckpt.read_bytes() == before


def test_resume_with_a_new_budget_continues(tmp_path, caplog):
    """More epochs and a time limit are a new budget for the same run: it resumes."""
    ckpt, _ = _first_run(tmp_path)
    with caplog.at_level(logging.INFO, logger="gpscale.fit"):
        history = fit(_model(), None, _data(), _config(ckpt, epochs=4, max_time=600.0))
    assert history.column("epoch") == [1, 2, 3, 4]
    assert f"resumed at epoch 3 from {ckpt} (2 epochs" in caplog.text
