"""The ``noise`` option's declaration holds GPyTorch's floor where GPyTorch's likelihood takes it
(issue #46, finding 10): ``noise=1e-5`` is refused up front naming the floor, or accepted and
honoured by a method whose noise is its own."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from gpscale.methods import METHODS, build, get_spec
from gpscale.methods.options import GPYTORCH_NOISE_FLOOR, OptionError
from gpscale.testing import SMALL_OPTIONS, toy_problem

NOISY = sorted(k for k, spec in METHODS.items()
               if "regression" in spec.tasks and any(o.name == "noise" for o in spec.options))


def _likelihood(model: torch.nn.Module) -> gpytorch.likelihoods.GaussianLikelihood | None:
    found = [m for m in model.modules() if isinstance(m, gpytorch.likelihoods.GaussianLikelihood)]
    return found[0] if found else None


def test_the_floor_is_gpytorchs():
    constraint = gpytorch.likelihoods.GaussianLikelihood().noise_covar.raw_noise_constraint
    assert float(constraint.lower_bound) == GPYTORCH_NOISE_FLOOR


@pytest.mark.parametrize("key", NOISY)
def test_noise_below_the_floor_is_refused_or_honoured(key):
    """A method with GPyTorch's likelihood declares the floor (and builds at it, or 1 % above
    it); any other takes 1e-5 and keeps it."""
    x, y, _ = toy_problem("regression", n=40)
    options = SMALL_OPTIONS.get(key, {})
    model = build(key, 2, init=(x, y), **options, noise=GPYTORCH_NOISE_FLOOR)
    likelihood = _likelihood(model)
    if likelihood is not None:
        assert float(likelihood.noise.detach()) == pytest.approx(GPYTORCH_NOISE_FLOOR, rel=0.02)
        with pytest.raises(OptionError, match=r"noise=1e-05 is invalid: must be ≥ 0\.0001, "
                                              r"the floor of GPyTorch's Gaussian likelihood"):
            get_spec(key).resolve({"noise": 1e-5})
        with pytest.raises(OptionError, match="GPyTorch"):
            build(key, 2, init=(x, y), **options, noise="1e-5")
    else:
        model = build(key, 2, init=(x, y), **options, noise=1e-5)
        assert float(model.noise.detach()) == pytest.approx(1e-5)



@pytest.mark.parametrize("key", NOISY)
def test_a_start_at_the_floor_trains_and_saves(key, tmp_path):
    """A model built at the floor itself (a pre-fit that ended there) holds a finite raw noise
    in float32 and float64, gets a gradient in it, and its state dict loads into a fresh
    model: at −∞ no optimiser step moved σ² and no saved model loaded."""
    x, y, _ = toy_problem("regression", n=40)
    options = SMALL_OPTIONS.get(key, {})
    for dtype in (torch.float32, torch.float64):
        model = build(key, 2, init=(x.to(dtype), y.to(dtype)), **options,
                      noise=GPYTORCH_NOISE_FLOOR)
        likelihood = _likelihood(model)
        if likelihood is None:
            return
        raw = likelihood.noise_covar.raw_noise
        assert bool(torch.isfinite(raw).all())
        likelihood.noise.sum().backward()
        assert float(raw.grad.abs().sum()) > 0
        path = tmp_path / f"{key}.pt"
        torch.save(model.state_dict(), path)
        again = build(key, 2, init=(x.to(dtype), y.to(dtype)), **options)
        again.load_state_dict(torch.load(path))
        assert float(_likelihood(again).noise.detach()) == pytest.approx(GPYTORCH_NOISE_FLOOR,
                                                                         rel=0.02)
