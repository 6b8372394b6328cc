"""A prediction does not depend on the other rows of its batch (issue #46, item 4 / finding 6).

An outside probe put one test input at 10⁸, 10²⁰ or 10²⁰⁰ into a batch: with ``exact`` and
``sgpr`` every other row's mean moved (GPyTorch centres distances on the test batch's mean),
with ``svgp`` and ``cagp-opt`` the far row itself came out NaN. For every registered method key
and task (and C = 3 classes where classification is supported), in float64 and float32, on a
model moved off its initial parameters:

- the ordinary rows predict the same (mean, variance, class probabilities, Poisson rate) alone
  and beside far rows, wherever those stand (last, first, in the middle, all together);
- a far row is finite, and all far rows (every magnitude, and for a stationary prior every
  direction) predict the same limit: for all keys but SoftKI the prior, mean = the prior mean
  and latent variance = the kernel's outputscale (SVGP adds its jitter); SoftKI's softmax
  weights tend to softmax(x̂ᵀz/τ) along a direction, so only its magnitudes are compared;
- predicting in chunks of one or four rows equals one call (``cggp``'s variances to its CG
  tolerance: GPyTorch's CG stops on the mean residual of all the columns it solves together).
"""

from __future__ import annotations

import gpytorch
import pytest
import torch

from gpscale.kernels import kernel_hyperparameters
from gpscale.methods import METHODS, build, get_spec
from gpscale.testing import SMALL_OPTIONS, toy_problem

FIELDS = ("mean", "variance", "probs", "rate")
TOLERANCE = {torch.float64: dict(rtol=1e-6, atol=1e-9), torch.float32: dict(rtol=1e-4, atol=1e-4)}
# GPyTorch's CG (cggp) solves the test columns together and stops when their mean residual is
# below eval_cg_tolerance: its variances depend on the batch to that accuracy.
CG_TOLERANCE = dict(rtol=0.05, atol=1e-3)
# 10²⁰⁰ is not a float32; 3·10³⁸ overflows its squares just as 10²⁰⁰ overflows float64's.
FAR = {torch.float64: (1e8, 1e20, 1e200), torch.float32: (1e8, 1e20, 3e38)}
# (key, task, number of classes), every task each key supports; C = 3 beside binary.
CASES = [(key, task, None) for key in sorted(METHODS) for task in get_spec(key).tasks]
CASES += [(key, "classification", 3) for key, task, _ in CASES if task == "classification"]
FASTER = {"ski": {"variance_rank": 16}, "ggp": {"variance_rank": 16}}  # LOVE's Lanczos steps


def _model(key: str, task: str, num_classes: int | None, dtype: torch.dtype):
    """(model, prediction state, ordinary test rows), parameters moved off their start."""
    x, y, x_test = toy_problem(task)
    if num_classes == 3:
        y = torch.bucketize(x[:, 0].contiguous(), torch.tensor([-0.3, 0.3], dtype=x.dtype))
    x, x_test = x.to(dtype), x_test.to(dtype)
    y = y.to(dtype) if y.is_floating_point() else y
    options = {**SMALL_OPTIONS[key], **FASTER.get(key, {})}
    model = build(key, 2, task=task, num_classes=num_classes, init=(x, y), **options)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.03 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return model, model.posterior(x, y), x_test


def _predict(model, state, x: torch.Tensor, **kwargs) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        torch.manual_seed(0)  # any Monte Carlo class probabilities draw the same samples
        pred = model.predict(state, x, **kwargs)
    return {name: getattr(pred, name) for name in FIELDS if getattr(pred, name, None) is not None}


def _rows(pred: dict[str, torch.Tensor], index) -> dict[str, torch.Tensor]:
    return {name: value[index] for name, value in pred.items()}


def _assert_same(actual, expected, dtype, what, tolerance=None):
    assert actual.keys() == expected.keys()
    for name in expected:
        tol = (tolerance or {}).get(name, TOLERANCE[dtype])
        torch.testing.assert_close(actual[name], expected[name], **tol,
                                   msg=lambda m, name=name: f"{what}, {name}: {m}")


def _prior(model) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(prior mean or None where the model holds no constant mean, kernel outputscale)."""
    means = [m.constant for m in model.modules() if isinstance(m, gpytorch.means.ConstantMean)]
    mean = means[0] if len(means) == 1 else getattr(model, "prior_mean", None)
    scale = next(hp.outputscale for m in model.modules()
                 if isinstance(m, gpytorch.kernels.Kernel)
                 and (hp := kernel_hyperparameters(m)) is not None)
    return (None if mean is None else torch.as_tensor(mean).detach()), scale.detach()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize(("key", "task", "num_classes"), CASES,
                         ids=[f"{k}-{t}{'-3' if c else ''}" for k, t, c in CASES])
def test_far_rows_change_no_other_row(key, task, num_classes, dtype):
    model, state, x = _model(key, task, num_classes, dtype)
    alone = _predict(model, state, x)
    t, tol = x.shape[0], TOLERANCE[dtype]
    directions = torch.tensor([[1.0, 1.0], [-1.0, 0.5]], dtype=dtype)
    far = torch.cat([v * directions for v in FAR[dtype]])  # (6, 2): magnitudes × directions
    assert torch.isfinite(far).all()
    places = (("last", lambda r: torch.cat([x, r]), slice(0, t)),
              ("first", lambda r: torch.cat([r, x]), slice(1, t + 1)),
              ("middle", lambda r: torch.cat([x[:4], r, x[4:]]), [*range(4), *range(5, t + 1)]))
    for i, row in enumerate(far):  # each magnitude in two places, each place twice
        where, batch, ordinary = places[i % 3]
        pred = _predict(model, state, batch(row[None]))
        _assert_same(_rows(pred, ordinary), alone, dtype, f"far row {i} {where}")
    mixed = torch.cat([far[:3], x[:5], far[3:], x[5:]])  # every far row at once
    ordinary = [*range(3, 8), *range(11, 11 + t - 5)]
    pred = _predict(model, state, mixed)
    _assert_same(_rows(pred, ordinary), alone, dtype, "all far rows")
    cg = {"variance": CG_TOLERANCE} if key == "cggp" else None
    for size in (1, 4):
        _assert_same(_predict(model, state, mixed, chunk_size=size), pred, dtype,
                     f"chunks of {size}", cg)

    limit = _rows(pred, [0, 1, 2, 8, 9, 10])  # the far rows, in the order of `far`
    for name, value in limit.items():
        assert torch.isfinite(value).all(), f"far rows: {name} not finite"
    # one limit per direction (SoftKI; a convolutional kernel, whose far image (v, v) has
    # equal patches and (−v, v/2) unequal ones) or for all far rows
    per_direction = key == "softki" or get_spec(key).inputs == "images"
    same = [[0, 2, 4], [1, 3, 5]] if per_direction else [[0, 1, 2, 3, 4, 5]]
    for group in same:
        for name, value in limit.items():
            torch.testing.assert_close(value[group], value[group[:1]].expand_as(value[group]),
                                       **tol, msg=lambda m, name=name: f"far limit, {name}: {m}")
    if key == "softki":
        return
    mean, outputscale = _prior(model)
    prior_tol = dict(rtol=1e-5 if dtype == torch.float64 else 1e-3, atol=tol["atol"])
    variance = limit["variance"]
    if get_spec(key).inputs == "images":  # the prior variance depends on the image's patches
        with torch.no_grad():
            outputscale = model.prior_variance(far)[0]
        outputscale = outputscale.reshape(-1, *[1] * (variance.dim() - 1))
    torch.testing.assert_close(variance, outputscale.to(dtype).expand_as(variance), **prior_tol)
    if mean is not None:
        torch.testing.assert_close(limit["mean"], mean.to(dtype).expand_as(limit["mean"]), **tol)
