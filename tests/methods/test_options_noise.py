"""The ``noise`` option's declaration holds GPyTorch's floor where GPyTorch's likelihood takes it
(issue #46, finding 10): ``noise=1e-5`` is refused up front naming the floor, or accepted and
honoured by a method whose noise is its own."""

from __future__ import annotations

import gpytorch
import pytest
import torch

from gpscale.io import load, save
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
    """A method with GPyTorch's likelihood declares the floor (and builds at it); any other
    takes 1e-5 and keeps it."""
    x, y, _ = toy_problem("regression", n=40)
    options = SMALL_OPTIONS.get(key, {})
    model = build(key, 2, init=(x, y), **options, noise=GPYTORCH_NOISE_FLOOR)
    likelihood = _likelihood(model)
    if likelihood is not None:
        assert float(likelihood.noise.detach()) == pytest.approx(GPYTORCH_NOISE_FLOOR)
        with pytest.raises(OptionError, match=r"noise=1e-05 is invalid: must be ≥ 0\.0001, "
                                              r"the floor of GPyTorch's Gaussian likelihood"):
            get_spec(key).resolve({"noise": 1e-5})
        with pytest.raises(OptionError, match="GPyTorch"):
            build(key, 2, init=(x, y), **options, noise="1e-5")
    else:
        model = build(key, 2, init=(x, y), **options, noise=1e-5)
        assert float(model.noise.detach()) == pytest.approx(1e-5)



@pytest.mark.parametrize("key", NOISY)
def test_a_model_at_the_floor_saves_and_loads(key, tmp_path):
    """A model built at the floor itself (a pre-fit that ended there): GPyTorch's raw noise is
    −∞, which maps to the floor, so σ² stays there while it trains. ``gpscale.save`` and
    ``gpscale.load`` keep it and it predicts the same (a saved model at the floor used to be
    refused as holding inf)."""
    x, y, _ = toy_problem("regression", n=40)
    model = build(key, 2, init=(x, y), **SMALL_OPTIONS.get(key, {}), noise=GPYTORCH_NOISE_FLOOR)
    likelihood = _likelihood(model)
    if likelihood is None:
        return
    assert float(likelihood.noise.detach()) == pytest.approx(GPYTORCH_NOISE_FLOOR)
    path = save(model, tmp_path / "m.pt", data=(x, y))
    again = load(path)
    model.eval()
    again.eval()
    with torch.no_grad():
        expected = model.predict(model.posterior(x, y), x[:5])
        got = again.predict(again.posterior(x, y), x[:5])
    torch.testing.assert_close(got.mean, expected.mean)
    torch.testing.assert_close(got.observed_variance, expected.observed_variance)
