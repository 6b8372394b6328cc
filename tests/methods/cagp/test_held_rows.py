"""CaGP-Opt's calibration rows held out of training: their action entries stay zero, the ELBO
skips them, the calibration predicts them as new rows, and ``auto``'s grown actions hold rows
the race never trained on."""

from __future__ import annotations

import torch

from gpscale.kernels import kernel_matrix
from gpscale.methods.cagp import calibration
from gpscale.training.race import warm_parameters

from ._dense import TOL, opt_model, toy_data
from .test_cagp_training import _dense_negative_elbo


def test_held_rows_leave_the_actions_and_the_elbo():
    """With ``calibrate='heldout'`` on 1,100 rows a tenth is held: the loss and its gradients
    are the dense ELBO of the other rows with their actions (float64), and no gradient
    reaches a held entry; ``calibrate='off'`` holds none."""
    x, y = toy_data(1100, seed=5)
    model = opt_model(x, y, 20)
    held = model.policy.held_rows()
    assert held.numel() == 110 and not opt_model(x, y, 20, calibrate="off").policy.held.any()
    fitted = torch.ones(1100, dtype=torch.bool).index_fill(0, held, False)
    model.loss(model.condition(x, y)).backward()
    fast = {k: p.grad.clone() for k, p in model.named_parameters()}
    assert (fast["policy.values"][model.policy.held] == 0).all()
    assert (fast["policy.values"][~model.policy.held] != 0).any()
    model.zero_grad()
    S = model.policy().to_dense()
    xt = x[fitted]
    dense = _dense_negative_elbo(kernel_matrix(model.kernel, xt, xt), S[fitted],
                                 model.mean(xt), y[fitted], model.noise)
    dense.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(fast[name], p.grad, rtol=1e-7, atol=1e-10, msg=name)
    assert (S[held] == 0).all()


def test_the_calibration_predicts_the_held_rows_as_new_rows():
    """The rows the calibration predicts are the held ones, and its prediction of them is the
    posterior's own predictive there (no row of theirs is in the actions: the left-out fixed
    point reduces to it), before any factor."""
    x, y = toy_data(1100, seed=6)
    model = opt_model(x, y, 20)
    with torch.no_grad():
        model.policy.values.add_(0.2 * torch.randn(1100, dtype=torch.float64))
        state = model.condition(x, y)
        positions = torch.nonzero(model.policy.held).flatten()
        err2, latent, noise = calibration.left_out_predictive(model, x, y, positions, state)
        rows = model.policy.index[positions]
        plain = model.predict(state, x[rows])
    torch.testing.assert_close(err2, (y[rows] - plain.mean).square(), **TOL)
    torch.testing.assert_close(latent, plain.variance, **TOL)
    assert noise == float(model.noise.detach())
    found = calibration.calibrate_scale(model, x, y, state=state)
    assert found is not None and found["left_out_rows"] == 110.0


def test_grown_actions_hold_rows_the_race_held_out():
    """Growing a race's trained actions to every row: the held positions are added rows
    (a tenth of the rows, as many as there are up to that), the race's own held entries start
    at zero, and the learned entries stay; with ``calibrate='off'`` none is held."""
    x, y = toy_data(1400, seed=7)
    perm = torch.randperm(1400, generator=torch.Generator().manual_seed(2))
    kept, added = perm[:1150].sort().values, perm[1150:].sort().values
    small = opt_model(x[kept], y[kept], 40)
    with torch.no_grad():
        small.policy.values.add_(0.3)
    trained = warm_parameters(small)
    raced_held = set(kept[small.policy.held_rows()].tolist())
    warm = small.warm_for_rows(trained, x, kept, added, {"num_actions": 40})
    held, index, values = warm["policy.held"], warm["policy.index"], warm["policy.values"]
    assert int(held.sum()) == 140
    assert set(index[held].tolist()) <= set(added.tolist())
    for position, row in enumerate(index.tolist()):
        if row in raced_held:
            assert values[position] == 0
    learned = ~small.policy.held
    kept_rows = kept[small.policy.index[learned]].tolist()
    grown = dict(zip(index.tolist(), values.tolist(), strict=True))
    torch.testing.assert_close(torch.tensor([grown[r] for r in kept_rows], dtype=torch.float64),
                               small.policy.values[learned].detach(), **TOL)
    off = opt_model(x[kept], y[kept], 40, calibrate="off")
    grown_off = off.warm_for_rows(warm_parameters(off), x, kept, added, {"num_actions": 40})
    assert not grown_off["policy.held"].any()


def test_several_processes_train_every_row():
    """A data-parallel plan (no calibration there) holds no row out."""
    x, y = toy_data(1100, seed=8)
    model = opt_model(x, y, 20)
    assert model.policy.held.any()
    model.shard_plan(x, y, start=0, num_points=1100)
    assert not model.policy.held.any()
