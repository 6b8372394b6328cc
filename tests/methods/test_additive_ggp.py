"""Additive GGP (``ggp`` with a sum of kernels on groups of inputs, one grid per group): its
statistics are the stacked interpolation's, its likelihood is the SKI model's on the same grids
(dense n × n, float64) and close to the exact additive GP's, its solvers agree, its predictive
matches the exact GP's, and what it cannot take is refused in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpscale.linalg.additive import accumulate_gram, additive_rows, mirror_blocks
from gpscale.methods import build, get_spec
from gpscale.methods.options import OptionError
from gpscale.methods.ski.additive import AdditiveGGP, additive_statistics

KERNEL = "rbf(0) + rbf(1, 2) + matern32(3)"
_F64 = torch.float64


def _problem(n=400, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, dtype=_F64, generator=g)
    f = torch.sin(2 * x[:, 0]) + torch.cos(x[:, 1] * x[:, 2]) + 0.5 * x[:, 3].tanh()
    return x, f + 0.1 * torch.randn(n, dtype=_F64, generator=g)


PRODUCTS = "rbf(0) * rbf(1) + matern32(2) * matern32(3)"
"""Products of one profile on disjoint inputs: a Kronecker product on each group's grid."""
MIXED = "rbf(0) * periodic(1, period=4) + rq(2) + matern32(3)"
"""Stationary kernels with no profile of their own on the grid: built from their values."""
SHARED = "rbf(0) + rbf(0) * periodic(0, period=3) + rq(0) + matern32(1, 2) + rbf(3)"
"""Three terms on input 0, which share one grid (their sum's values), beside two groups."""


def _model(x, y, kernel=KERNEL, **options) -> AdditiveGGP:
    model = build("ggp", x.shape[1], init=(x, y), kernel=kernel, **options)
    assert isinstance(model, AdditiveGGP)
    return model.double()


def _stacked_dense_w(model, x):
    return torch.cat([r.to_dense() for r in additive_rows(model.grids, model.columns, x).groups],
                     1)


def test_the_statistics_are_the_stacked_rows_gram_and_do_not_depend_on_chunks():
    x, y = _problem()
    model = _model(x, y)
    W = _stacked_dense_w(model, x)
    one = additive_statistics((x, y), model.grids, model.columns, num_probes=0)
    torch.testing.assert_close(one.gram, W.T @ W, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(one.wt_y, W.T @ y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(one.wt_one, W.sum(0), rtol=1e-12, atol=1e-12)
    chunked = additive_statistics((x, y), model.grids, model.columns, num_probes=0,
                                  chunk_size=37)
    torch.testing.assert_close(chunked.gram, one.gram, rtol=1e-12, atol=1e-12)
    # the row blocks of the scatter do not matter either
    gram = torch.zeros_like(one.gram)
    accumulate_gram(gram, additive_rows(model.grids, model.columns, x), block_rows=5)
    mirror_blocks(gram, [g.num_points for g in model.grids])
    torch.testing.assert_close(gram, one.gram, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", [KERNEL, PRODUCTS, MIXED, SHARED])
def test_the_likelihood_is_ski_on_the_same_grids_and_near_the_exact_additive_gp(kernel):
    x, y = _problem()
    model = _model(x, y, kernel=kernel, solver="dense")
    n = x.shape[0]
    state = model.condition(x, y)
    with torch.no_grad():
        # SKI with the same grids, dense: W K_B Wᵀ + σ²I
        W = _stacked_dense_w(model, x)
        K_B = model._block_kernel(model.grids).to_dense()
        ski = W @ K_B @ W.T + model.noise * torch.eye(n, dtype=_F64)
        r = y - model.mean.constant
        nll_ski = -torch.distributions.MultivariateNormal(
            torch.zeros(n, dtype=_F64), ski).log_prob(r) / n
        exact = model.kernel(x, x).to_dense() + model.noise * torch.eye(n, dtype=_F64)
        nll_exact = -torch.distributions.MultivariateNormal(
            torch.zeros(n, dtype=_F64), exact).log_prob(r) / n
    assert float(model.loss(state).detach()) == pytest.approx(float(nll_ski), rel=1e-10, abs=1e-12)
    # the grid's interpolation error: small against the likelihood's own scale
    assert abs(float(model.loss(state)) - float(nll_exact)) < 2e-3


def test_the_solvers_agree_with_the_dense_reference():
    x, y = _problem()
    dense = _model(x, y, solver="dense")
    ref = dense.condition(x, y)
    ref_loss = dense.loss(ref)
    ref_loss.backward()
    ref_grads = {k: p.grad.clone() for k, p in dense.named_parameters() if p.grad is not None}
    for solver in ("preconditioned", "iterative"):
        model = _model(x, y, solver=solver, rtol=1e-10, num_probes=256)
        state = model.condition(x, y)
        # rᵀK̃⁻¹r is solved exactly; log det K̃ is a 256-probe estimate
        assert float(state.quad) == pytest.approx(float(ref.quad), rel=1e-7)
        assert float(state.logdet) == pytest.approx(float(ref.logdet), abs=0.02 * x.shape[0])
        torch.testing.assert_close(state.mean_weights, ref.mean_weights, rtol=1e-6, atol=1e-8)
        model.loss(state).backward()
        grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
        assert grads.keys() == ref_grads.keys()
        # the mean's gradient is exact; the others carry the trace estimate's noise
        key = next(k for k in grads if "mean" in k)
        torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-6, atol=1e-9)
        for k in grads:
            assert torch.allclose(grads[k], ref_grads[k], rtol=0.2, atol=0.02), k


@pytest.mark.parametrize("variance, kernel, grid", [
    ("auto", KERNEL, None), ("exact", KERNEL, None), ("lanczos", KERNEL, None),
    ("auto", PRODUCTS, 64),  # Matérn-3/2 factors: a finer grid for the same interpolation error
    ("auto", MIXED, 40),  # grid kernels from the kernel's values: the factorized CG
    ("auto", SHARED, None),
])
def test_the_predictive_matches_the_exact_additive_gp(variance, kernel, grid):
    x, y = _problem()
    model = _model(x, y, kernel=kernel, variance=variance, rtol=1e-10, variance_rank=400,
                   grid_size=grid)
    g = torch.Generator().manual_seed(1)
    x_test = torch.randn(60, 4, dtype=_F64, generator=g)
    x_test[:10, 3] = 1e4  # beyond the reach of the last group's grid: its prior there
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x_test)
        n = x.shape[0]
        K = model.kernel(x, x).to_dense() + model.noise * torch.eye(n, dtype=_F64)
        Ks = model.kernel(x_test, x).to_dense()
        mean = model.mean.constant + Ks @ torch.linalg.solve(K, y - model.mean.constant)
        var = (model.kernel(x_test, x_test, diag=True)
               - (Ks * torch.linalg.solve(K, Ks.T).T).sum(1))
    scale = float(y.std())
    assert float((pred.mean - mean).abs().max()) < 0.01 * scale
    assert float((pred.variance - var).abs().max()) < 2e-3 * scale**2
    far_scale = model._terms()[-1].outputscale
    assert bool((pred.variance[:10] >= far_scale * (1 - 1e-9)).all())


def test_what_ggp_cannot_interpolate_is_refused_in_one_line():
    spec = get_spec("ggp")
    for text in ("rbf(0) * matern32(1)", "rbf(0) + periodic(1)", "rbf(0) + rq(1)",
                 "matern32(0, 1) * matern32(2)", "rbf(0) * periodic(0) + rbf(1)"):
        assert spec.resolve({"kernel": text})["kernel"] == text  # stationary: taken
    for text, why in [("rbf(0) + linear(1)", "'linear' is not a function of x − x'"),
                      ("rbf(0) * poly(1)", "'poly' is not a function of x − x'"),
                      ("rbf(0) + constant", "'constant' has no inputs to put on a grid")]:
        with pytest.raises(OptionError) as err:
            spec.resolve({"kernel": text})
        assert why in str(err.value) and "\n" not in str(err.value)
    x, y = _problem(n=50)
    with pytest.raises(ValueError, match="on 4 inputs; a grid takes at most 3"):
        build("ggp", 4, init=(x, y), kernel="rbf(0:4)")
    with pytest.raises(ValueError, match="on 4 inputs, every input .*; a grid takes at most 3"):
        build("ggp", 4, init=(x, y), kernel="rbf(0) + matern52")
    with pytest.raises(ValueError, match="dense WᵀW needs"):
        build("ggp", 4, init=(x, y), kernel="rbf(0, 1) + rbf(2, 3)", grid_size=100)
    with pytest.raises(ValueError, match="one per input of each group"):
        build("ggp", 4, init=(x, y), kernel=KERNEL, grid_size=[10, 10])


def test_more_than_three_inputs_in_groups_through_the_cli(tmp_path):
    """``gpscale fit`` with an additive kernel on 5 inputs (one grid over all would be
    m^5), then ``predict`` from the saved model, which holds the statistics."""
    from gpscale.cli.__main__ import main

    g = np.random.default_rng(0)
    x = g.uniform(0, 1, (800, 5))
    y = (np.sin(2 * math.pi * x[:, 0]) + np.cos(3 * x[:, 1] * x[:, 2])
         + x[:, 3] ** 2 + 0.05 * g.normal(size=800))
    rows = ["a,b,c,d,e,y"] + [",".join(f"{v:.6f}" for v in (*xi, yi))
                               for xi, yi in zip(x, y, strict=True)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    assert main(["fit", "--data", str(tmp_path / "d.csv"), "--target", "y", "--method", "ggp",
                 "-o", "kernel=rbf(a) + rbf(b, c) + rbf(d) + rbf(e)", "-o", "grid_size=24",
                 "--epochs", "40",
                 "--lr", "0.1", "--out", str(out), "--no-progress"]) == 0
    import json

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_rmse_data_units"] < 0.1  # the noise is 0.05
    assert 0.85 <= metrics["test_coverage"] <= 1.0
    assert main(["predict", "--model", str(out / "model.pt"), "--data",
                 str(tmp_path / "d.csv"), "--out", str(tmp_path / "p.csv")]) == 0
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert len(lines) == 801


def test_a_product_of_one_kind_is_the_kronecker_kernel_on_its_grid():
    """K_G of ``matern32(2) * matern32(3)`` equals GPyTorch's product kernel at the grid's
    nodes (a per-input Kronecker product, not Matérn of the joint distance)."""
    x, y = _problem(n=50)
    model = _model(x, y, kernel=PRODUCTS, grid_size=6)
    grid = model.grids[1]
    nodes = grid.points()
    K_G = model._block_kernel(model.grids).kernels[1].to_dense()
    term = model._terms()[1]
    full = torch.zeros(len(nodes), 4, dtype=_F64)
    full[:, 2:] = nodes
    with torch.no_grad():
        torch.testing.assert_close(K_G, term(full, full).to_dense(), rtol=1e-10, atol=1e-12)



def test_terms_on_the_same_inputs_share_one_grid_of_their_sum():
    x, y = _problem(n=60)
    model = _model(x, y, kernel=SHARED, grid_size=6)
    assert [g.terms for g in model.groups] == [(0, 1, 2), (3,), (4,)]
    assert [g.columns for g in model.groups] == [(0,), (1, 2), (3,)]
    assert model.groups[0].profile is None and len(model.grids) == 3
    nodes = model.grids[0].points()
    full = torch.zeros(len(nodes), 4, dtype=_F64)
    full[:, [0]] = nodes
    with torch.no_grad():
        K_G = model._block_kernel(model.grids).kernels[0].to_dense()
        ref = sum(model._terms()[t](full, full).to_dense() for t in (0, 1, 2))
    torch.testing.assert_close(K_G, ref, rtol=1e-10, atol=1e-12)
    # one value per input of each group: the shared grid counts once
    with pytest.raises(ValueError, match="4 for groups of \\[1, 2, 1\\] inputs"):
        _model(x, y, kernel=SHARED, grid_size=[8, 8])


def test_on_one_input_a_sum_without_inputs_is_one_grid_of_a_single_grids_size():
    g = torch.Generator().manual_seed(3)
    x = 6 * torch.rand(300, 1, dtype=_F64, generator=g)
    y = torch.sin(2 * x[:, 0]) + 0.1 * x[:, 0] + 0.05 * torch.randn(300, dtype=_F64, generator=g)
    model = _model(x, y, kernel="rbf + rbf * periodic(period=3)", solver="dense")
    assert len(model.groups) == 1 and model.grids[0].num_points == 1024
    with torch.no_grad():
        loss = model.loss(model.condition(x, y))
        K = model.kernel(x, x).to_dense() + model.noise * torch.eye(300, dtype=_F64)
        exact = -torch.distributions.MultivariateNormal(
            torch.zeros(300, dtype=_F64), K).log_prob(y - model.mean.constant) / 300
    assert abs(float(loss) - float(exact)) < 1e-3


@pytest.mark.parametrize("text, group, dims", [
    ("rbf(0) + periodic(1, period=2)", 1, [1]),  # one input: a Toeplitz factor
    ("rq(0, 1, alpha=0.5) + rbf(2)", 0, [0, 1]),  # joint distance, heavy tails
    ("rbf(0) * periodic(1, period=2) * matern52(3)", 0, [0, 1, 3]),  # three kinds, 3-D
    ("matern32(0, 1) * matern12(2)", 0, [0, 1, 2]),  # a Matérn of two inputs times one
    ("rbf(0) * periodic(0, period=2) + rbf(1)", 0, [0]),  # locally periodic: factors share
    ("rbf(0, 1) * rq(1) + rbf(2)", 0, [0, 1]),
])
def test_a_kernel_built_from_its_values_is_the_gpytorch_kernel_on_its_grid(text, group, dims):
    """K_G of a group with no profile of its own equals the GPyTorch kernel at the grid's
    nodes, in float64, and its gradients reach the kernel's hyperparameters."""
    x, y = _problem(n=60)
    model = _model(x, y, kernel=text, grid_size=6)
    assert model.groups[group].profile is None
    grid = model.grids[group]
    nodes = grid.points()
    full = torch.zeros(len(nodes), 4, dtype=_F64)
    full[:, dims] = nodes
    term = model._terms()[group]
    K_G = model._block_kernel(model.grids).kernels[group]
    assert K_G.structure == ("kron" if len(dims) == 1 else "bttb")
    torch.testing.assert_close(K_G.to_dense(), term(full, full).to_dense().detach(),
                               rtol=1e-10, atol=1e-12)
    # the local values w_*ᵀ K_G w_* reads: the kernel at the offsets of a point's nodes
    deltas = torch.arange(2 * grid.support - 1, dtype=_F64) - (grid.support - 1)
    offsets = torch.cartesian_prod(*[deltas * h for h in grid.spacing]).reshape(-1, len(dims))
    at = torch.zeros(len(offsets), 4, dtype=_F64)
    at[:, dims] = offsets
    zero = torch.zeros(1, 4, dtype=_F64)
    torch.testing.assert_close(K_G.local.detach(), term(at, zero).to_dense()[:, 0].detach(),
                               rtol=1e-12, atol=1e-14)
    v = torch.randn(K_G.num_grid, dtype=_F64, generator=torch.Generator().manual_seed(0))
    K_G.matmul(v).square().sum().backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0)
               for p in term.parameters()), "every hyperparameter of the group gets a gradient"


def test_a_periodic_group_keeps_every_test_point_in_reach():
    """A periodic factor repeats: a test point off its group's grid is an error naming the
    grid, never that group's prior; times a decaying factor (locally periodic) the point
    leaves the group's reach where that factor's lengthscales say so."""
    x, y = _problem(n=80)
    x = x[:, :2]
    model = _model(x, y, kernel="rbf(0) * periodic(0, period=2) + periodic(1, period=2)",
                   grid_size=16)
    state = model.condition(x, y)
    x_test = torch.zeros(2, 2, dtype=_F64)
    x_test[0, 0] = 1e4  # beyond the locally periodic group's reach: its prior
    pred = model.predict(state, x_test)
    first = model._terms()[0].outputscale.detach()
    assert float(pred.variance[0]) >= float(first) * (1 - 1e-9)
    assert float(pred.variance[1]) < float(first)
    x_test[1, 1] = 1e4
    with pytest.raises(ValueError, match="grid"):
        model.predict(state, x_test)
