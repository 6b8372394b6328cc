"""CaGP-Opt's learned actions grown from some training rows to all of them
(``grow_blocks``, ``CaGP.warm_for_rows``): what ``auto``'s race hands its final run."""

from __future__ import annotations

import pytest
import torch

from gpscale.linalg.operators.block_sparse import BlockLayout
from gpscale.linalg.policies.block_sparse import grow_blocks, local_assignment
from gpscale.methods import build
from gpscale.training.harness import load_warm
from gpscale.training.race import warm_parameters

from ._dense import TOL, opt_model, toy_data


def _blocks(index, values, layout):
    """[(rows, entries)] per block of ``layout``."""
    out, start = [], 0
    for size in layout.sizes():
        out.append((index[start:start + size].tolist(), values[start:start + size]))
        start += size
    return out


@pytest.mark.parametrize(("n", "m", "i"), [(1000, 180, 97), (500, 200, 64), (64, 5, 30),
                                           (300, 1, 300)])
def test_grown_blocks_keep_every_learned_block_and_take_the_new_rows(n, m, i):
    """A permutation of the n + m rows under BlockLayout(n + m, i); every grown block holds
    exactly one old block's rows, in their order and with their entries, then new rows at 0.
    (64, 5, 30) and (300, 1, 300) keep k = ⌊N/i⌋ the old k: blocks of k + 1 stay large."""
    g = torch.Generator().manual_seed(n + m + i)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64)
    new = torch.rand(m, 2, generator=g, dtype=torch.float64)
    old_layout = BlockLayout(n, i)
    index = local_assignment(x, old_layout)
    values = torch.randn(n, generator=g, dtype=torch.float64)
    rows, grown = grow_blocks(x, index, values, i, new)
    layout = BlockLayout(n + m, i)
    assert sorted(rows.tolist()) == list(range(n + m))
    old = {tuple(r): v for r, v in _blocks(index, values, old_layout)}
    for block_rows, entries in _blocks(rows, grown, layout):
        kept = [r for r in block_rows if r < n]
        assert block_rows[:len(kept)] == kept  # old rows first, in their order
        assert tuple(kept) in old  # one whole old block
        torch.testing.assert_close(entries[:len(kept)], old.pop(tuple(kept)), rtol=0, atol=0)
        assert bool((entries[len(kept):] == 0).all())
    assert not old  # every old block is in one grown block


def test_new_rows_join_blocks_near_them():
    """Two far-apart clusters, blocks in each: every new row joins a block of its own cluster,
    and the blocks' rows stay compact (a new row lies within its block's old extent, widened
    by a cell)."""
    g = torch.Generator().manual_seed(0)
    left, right = torch.rand(400, 2, generator=g), torch.rand(400, 2, generator=g) + 10.0
    x = torch.cat([left, right]).double()
    new = torch.cat([torch.rand(60, 2, generator=g), torch.rand(60, 2, generator=g) + 10]).double()
    i = 80
    index = local_assignment(x, BlockLayout(800, i))
    rows, _ = grow_blocks(x, index, torch.ones(800, dtype=torch.float64), i, new)
    for block_rows, _ in _blocks(rows, torch.ones(920), BlockLayout(920, i)):
        side = {int(r >= 400) if r < 800 else int(r >= 860) for r in block_rows}
        assert len(side) == 1


def test_grow_blocks_refuses_mismatched_shapes():
    x = torch.rand(10, 2)
    with pytest.raises(ValueError, match="width 2"):
        grow_blocks(x, torch.arange(10), torch.ones(10), 3, torch.rand(4, 3))
    with pytest.raises(ValueError, match=r"shape \(10,\)"):
        grow_blocks(x, torch.arange(9), torch.ones(10), 3, torch.rand(4, 2))


def test_grown_actions_give_the_kept_rows_posterior_on_every_row():
    """Zero entries on the added rows: the model on every row, started from the grown
    actions, predicts what the model on the kept rows did (Eq. 5: S's rows on the added
    points are zero, so SᵀK̂S, Sᵀr and K(x*, X) S are the kept rows'), in float64."""
    x, y = toy_data(90, seed=3)
    x_test, _ = toy_data(25, seed=4)
    perm = torch.randperm(90, generator=torch.Generator().manual_seed(1))
    kept, added = perm[:70].sort().values, perm[70:].sort().values
    small = opt_model(x[kept], y[kept], 12)
    with torch.no_grad():  # as training would have moved them
        small.policy.values.add_(0.3 * torch.randn(70, dtype=torch.float64))
    options = {"num_actions": 12}
    warm = small.warm_for_rows(warm_parameters(small), x, kept, added, options)
    assert warm["policy.index"].shape == (90,) and warm["policy.values"].shape == (90,)
    big = opt_model(x, y, 12)
    copied = load_warm(big, warm)
    assert {"policy.values", "policy.index"} <= set(copied)
    with torch.no_grad():
        want = small.predict(small.condition(x[kept], y[kept]), x_test)
        got = big.predict(big.condition(x, y), x_test)
    torch.testing.assert_close(got.mean, want.mean, **TOL)
    torch.testing.assert_close(got.variance, want.variance, **TOL)
    # the added rows' entries are trainable: the ELBO on every row has a gradient in them
    big.loss(big.condition(x, y)).backward()
    position = torch.argsort(warm["policy.index"])[added]
    assert float(big.policy.values.grad[position].abs().max()) > 0


def test_actions_are_not_grown_where_the_default_number_of_actions_changes():
    """Below 1,024 rows the default number of actions is n/2: the race's model on fewer rows
    has fewer, and the final run starts from its own start (``None``); a given number
    carries over. Methods without per-row parameters hand their parameters on as they are."""
    x, y = toy_data(300)
    kept, added = torch.arange(200), torch.arange(200, 300)
    model = build("cagp-opt", 2, init=(x[kept], y[kept]))
    trained = warm_parameters(model)
    assert model.warm_for_rows(trained, x, kept, added, {}) is None
    given = build("cagp-opt", 2, init=(x[kept], y[kept]), num_actions=40)
    assert given.warm_for_rows(warm_parameters(given), x, kept, added,
                               {"num_actions": 40}) is not None
    svgp = build("svgp", 2, init=(x[kept], y[kept]), num_inducing=16)
    params = warm_parameters(svgp)
    assert svgp.warm_for_rows(params, x, kept, added, {}).keys() == params.keys()
