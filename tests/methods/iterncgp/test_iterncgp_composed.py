"""IterNCGP and SoD-Laplace with a kernel expression (:mod:`gpscale.methods.iterncgp.composed`):
both keys build, condition and predict with one for every task, shared or one per class; at
full computation the posterior is the dense Laplace posterior under the same GPyTorch kernel
matrix; the evidence's gradient reaches a periodic leaf's period; the harness starts an
expression from its own start values (no pre-fit) and the saved model predicts the same; what an
expression leaves no room for is refused in one line; and ``gpscale fit`` takes one."""

from __future__ import annotations

import csv
import math

import gpytorch
import numpy as np
import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.io import load, save
from gpscale.methods import build
from gpscale.methods.iterncgp.held_distances import held_distance_matmul
from gpscale.methods.options import OptionError
from gpscale.training import FitConfig
from gpscale.training.harness import build_method, train_built
from gpscale.training.prefit import median_distance_start

EXPRESSION = "rbf(0) * periodic(1, period=1.5) + matern52(outputscale=0.5)"
TASKS = {"binary": ("classification", 2), "three-classes": ("classification", 3),
         "counts": ("counts", None)}
FIXED = {"iterncgp": dict(learn_kernel=False, inference="laplace"),
         "sod-laplace": dict(num_subset=12)}


def _problem(task: str, n: int, generator: torch.Generator):
    """x (n, 2) in [-1, 1]², targets of ``task`` (a key of TASKS) and 4 test inputs."""
    x = torch.rand(n, 2, generator=generator) * 2 - 1
    signal = torch.sin(3 * x[:, 0]) + torch.cos(4 * x[:, 1])
    if task == "binary":
        y = (signal + 0.3 * torch.randn(n, generator=generator) > 0).long()
    elif task == "three-classes":
        y = torch.bucketize(signal.contiguous(), torch.tensor([-0.4, 0.6]))
    else:
        y = torch.poisson(torch.exp(0.8 * signal), generator=generator)
    return x, y, torch.rand(4, 2, generator=generator) * 2 - 1


def _periodic(model) -> gpytorch.kernels.PeriodicKernel:
    (kernel,) = [m for m in model.kernel.modules()
                 if isinstance(m, gpytorch.kernels.PeriodicKernel)]
    return kernel


@pytest.mark.parametrize("key", ["iterncgp", "sod-laplace"])
@pytest.mark.parametrize("task", list(TASKS))
def test_both_keys_condition_and_predict_with_an_expression(key, task, generator):
    """The expression is built as written (its period, its canonical text in the options),
    frozen, and gives a finite predictive: probabilities or rates."""
    x, y, x_test = _problem(task, 16, generator)
    kind, _ = TASKS[task]
    model = build(key, 2, task=kind, init=(x, y), kernel=EXPRESSION, **FIXED[key])
    assert model.options["kernel"] == EXPRESSION
    assert _periodic(model).period_length.item() == pytest.approx(1.5)
    assert not any(p.requires_grad for p in model.parameters())
    with torch.no_grad():
        pred = model.predict(model.condition(x, y), x_test)
    assert torch.isfinite(pred.mean).all() and (pred.variance >= 0).all()
    if kind == "counts":
        assert (pred.rate > 0).all()
    else:
        torch.testing.assert_close(pred.probs.sum(-1), torch.ones(4), rtol=0, atol=1e-12)


def test_one_kernel_per_class_is_a_batch_of_the_expression(generator):
    """``shared_kernel=False``: the composition with batch shape (C,), and the predictive mean
    is the dense per-class m + K⋄ᵀ v."""
    x, y, x_test = _problem("three-classes", 15, generator)
    model = build("iterncgp", 2, task="classification", init=(x, y), kernel=EXPRESSION,
                  shared_kernel=False, **FIXED["iterncgp"])
    assert tuple(model.kernel.batch_shape) == (3,)
    assert tuple(_periodic(model).period_length.shape) == (3, 1, 1)
    state = model.condition(x, y)
    K_xs = torch.block_diag(*model.kernel(x, x_test).to_dense())  # (3 n, 3 t)
    pred = model.predict(state, x_test)
    torch.testing.assert_close(pred.mean.T.reshape(-1), K_xs.T @ state.v.reshape(-1),
                               rtol=1e-10, atol=1e-12)


def test_the_options_fill_what_the_expression_leaves_unset(generator):
    """``lengthscale`` starts the stationary leaves without one at ℓ √(k/d) (k of the d inputs),
    ``outputscale`` is shared by the terms without one; the expression's own values stay, and
    the periodic leaf's unitless lengthscale is its own."""
    x, y, _ = _problem("binary", 10, generator)
    text = "rbf(0) * periodic(1) + matern52(lengthscale=0.7) + rq(0:)"
    model = build("sod-laplace", 2, task="classification", init=(x, y), kernel=text,
                  lengthscale=2.0, outputscale=3.0)
    rbf, periodic = model.kernel.kernels[0].base_kernel.kernels
    torch.testing.assert_close(rbf.lengthscale, torch.full((1, 1), 2.0 * math.sqrt(1 / 2)))
    torch.testing.assert_close(periodic.lengthscale, torch.ones(1, 1))
    torch.testing.assert_close(model.kernel.kernels[1].base_kernel.lengthscale,
                               torch.full((1, 2), 0.7))
    torch.testing.assert_close(model.kernel.kernels[2].base_kernel.lengthscale,
                               torch.full((1, 2), 2.0))  # on all inputs: ℓ itself
    scales = [float(term.outputscale) for term in model.kernel.kernels]
    assert scales == pytest.approx([1.0, 1.0, 1.0])  # 3.0 shared by the three terms
    default = build("sod-laplace", 2, task="classification", init=(x, y), kernel=text)
    rbf = default.kernel.kernels[0].base_kernel.kernels[0]
    torch.testing.assert_close(rbf.lengthscale, torch.ones(1, 1))  # build_kernel's √k


def _dense_laplace(K, K_s, k_ss, y, task):
    """Newton to convergence on Ψ(f) = log p(y | f) − ½ fᵀK⁻¹f (R&W Alg. 3.1), then the Laplace
    predictive: mean K⋄ᵀ ∇log p(y | f̂), variance k⋄⋄ − K⋄ᵀ (K + W⁻¹)⁻¹ K⋄ (R&W Eqs. 3.21, 3.24)."""
    def grad_and_W(f):
        if task == "binary":
            p = torch.sigmoid(f)
            return y.double() - p, p * (1 - p)
        rate = torch.exp(f)
        return y - rate, rate

    f = torch.zeros(K.shape[0])
    n = K.shape[0]
    for _ in range(100):
        g, W = grad_and_W(f)
        f_new = K @ torch.linalg.solve(torch.eye(n) + W[:, None] * K, W * f + g)
        if (f_new - f).abs().max() < 1e-14:
            f = f_new
            break
        f = f_new
    g, W = grad_and_W(f)
    mean = K_s.T @ g
    var = k_ss - (K_s * torch.linalg.solve(K + torch.diag(1 / W), K_s)).sum(0)
    return mean, var


@pytest.mark.parametrize("key", ["iterncgp", "sod-laplace"])
@pytest.mark.parametrize("task", ["binary", "counts"])
def test_full_computation_is_the_dense_laplace_posterior(key, task, generator):
    """Limit identity (STYLE §9.3): with exact inner solves (n unit-vector actions per Newton
    step, no recycling) and Newton run to convergence, IterNCGP's latent mean and variance
    (Eqs. 8–9) are the dense Laplace posterior's under the same GPyTorch kernel matrix; so are
    SoD-Laplace's on all points."""
    x, y, x_test = _problem(task, 10, generator)
    kind, _ = TASKS[task]
    if key == "iterncgp":
        options = dict(policy="chol", max_iterations=10, atol=0.0, rtol=0.0, recycle=False,
                       outer_rtol=1e-12, **FIXED[key])
    else:
        options = dict(num_subset=10, outer_rtol=1e-12, max_newton_steps=100)
    model = build(key, 2, task=kind, init=(x, y), kernel=EXPRESSION, **options)
    with torch.no_grad():
        state = model.condition(x, y)
        pred = model.predict(state, x_test)
        K, K_s = model.kernel(x, x).to_dense(), model.kernel(x, x_test).to_dense()
        k_ss = model.kernel(x_test, x_test, diag=True)
    mean, var = _dense_laplace(K, K_s, k_ss, y, task)
    torch.testing.assert_close(pred.mean, mean, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(pred.variance, var, rtol=1e-8, atol=1e-10)


def test_the_evidence_gradient_reaches_the_period(generator):
    """Kernel learning steps every hyperparameter of the composition: the Laplace evidence's
    derivative in the periodic leaf's raw period matches a central difference."""
    x, y, _ = _problem("binary", 12, generator)
    model = build("iterncgp", 2, task="classification", init=(x, y), kernel=EXPRESSION,
                  inference="laplace", kernel_objective="elbo")
    with torch.no_grad():
        problem = model.evidence_problem(model.condition(x, y))
    raw = _periodic(model).raw_period_length
    model.kernel.requires_grad_(True)
    model.learning_objective(problem).backward()
    model.kernel.requires_grad_(False)
    assert raw.grad is not None and float(raw.grad.abs()) > 0

    def objective(shift: float) -> float:
        with torch.no_grad():
            raw.add_(shift)
            value = float(model.learning_objective(problem))
            raw.sub_(shift)
        return value

    h = 1e-5
    central = (objective(h) - objective(-h)) / (2 * h)
    assert float(raw.grad) == pytest.approx(central, rel=1e-5, abs=1e-9)


def test_held_distances_are_not_used_for_an_expression(generator):
    """The one-lengthscale fast path declines a composition, and the learning products are the
    plain ones: K V with K from GPyTorch."""
    x, y, _ = _problem("binary", 12, generator)
    model = build("iterncgp", 2, task="classification", init=(x, y), kernel=EXPRESSION)
    assert held_distance_matmul(model.kernel, x) is None
    V = torch.randn(1, 12, 3, generator=generator)
    product = model.latent_kernel.learning_matmul(x)(V)
    torch.testing.assert_close(product[0], model.kernel(x, x).to_dense() @ V[0],
                               rtol=1e-12, atol=1e-12)


def _harness(key, task, generator, **options):
    x, y, x_test = _problem(task, 30, generator)
    model, _ = build_method(key, (x, y), task=TASKS[task][0], num_classes=TASKS[task][1],
                            options={"kernel": EXPRESSION, **options}, config=FitConfig(),
                            seed=0)
    return model, x, y, x_test


@pytest.mark.parametrize(("key", "task", "options"), [
    ("iterncgp", "binary", {"kernel_rounds": 2}),
    ("iterncgp", "counts", {"kernel_rounds": 2, "inference": "laplace"}),
    ("sod-laplace", "three-classes", {})], ids=["learned-binary", "learned-counts", "fixed"])
def test_the_harness_starts_from_the_expression_and_a_saved_model_predicts_the_same(
        key, task, options, generator, tmp_path):
    """No SVGP pre-fit for an expression: the harness's start (median distance, outputscale 1)
    fills what the expression leaves unset; after training (kernel rounds or none) the saved
    options and state dict rebuild the expression exactly: the same predictions to the bit."""
    model, x, y, x_test = _harness(key, task, generator, **options)
    assert model.options["lengthscale"] == pytest.approx(median_distance_start(x))
    assert model.options["outputscale"] == 1.0
    config = FitConfig(seed=0, progress=False)
    history, state = train_built(model, (x, y), config)
    assert len(history.rows) >= (1 if key == "iterncgp" else 0)
    with torch.no_grad():
        pred = model.predict(state, x_test)
    save(model, tmp_path / "model.pt", data=(x, y))
    loaded = load(tmp_path / "model.pt")
    assert loaded.options["kernel"] == EXPRESSION
    with torch.no_grad():
        again = loaded.predict(loaded.condition(x, y), x_test)
    torch.testing.assert_close(again.mean, pred.mean, rtol=0, atol=0)
    torch.testing.assert_close(again.variance, pred.variance, rtol=0, atol=0)


@pytest.mark.parametrize(("options", "message"), [
    ({"lengthscale": [0.5, 0.7]}, "lengthscale takes one number"),
    ({"outputscale": [1.0, 2.0, 3.0], "shared_kernel": False}, "outputscale takes one number"),
    ({"backend": "fused"}, "backend 'fused' evaluates the four named kernels only"),
    ({"kernel": "rbf(0) * periodic(5)"}, "input 5 is outside 0..1"),
    ({"kernel": "rbf(0) * periodc(1)"}, "position 10: unknown kernel 'periodc'"),
], ids=["lengthscales", "per-class-outputscales", "fused-backend", "column", "syntax"])
def test_what_an_expression_leaves_no_room_for_is_refused_in_one_line(options, message,
                                                                       generator):
    x, y, _ = _problem("three-classes", 12, generator)
    with pytest.raises((ValueError, OptionError)) as err:
        build("iterncgp", 2, task="classification", init=(x, y),
              **{"kernel": EXPRESSION, **options})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_fit_and_predict_from_a_file_with_an_expression(tmp_path):
    """``gpscale fit --task classification --method iterncgp -o kernel=...`` on a CSV: columns
    by name become input indices, the kernel rounds learn the composition, and ``gpscale
    predict`` rebuilds it from the saved file."""
    g = np.random.default_rng(0)
    t, u = g.uniform(0, 10, 60), g.normal(size=60)
    label = (np.sin(2 * np.pi * t / 3) + 0.5 * u + 0.3 * g.normal(size=60) > 0).astype(int)
    rows = ["t,u,y"] + [f"{a},{b},{c}" for a, b, c in zip(t, u, label, strict=True)]
    data = tmp_path / "d.csv"
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    assert main(["fit", "--data", str(data), "--target", "y", "--task", "classification",
                 "--method", "iterncgp", "-o", "kernel=rbf(t) * periodic(t, period=3) + "
                 "linear(u)", "-o", "kernel_rounds=2", "-o", "inference=laplace", "--out",
                 str(out), "--no-progress"]) == 0
    model = load(out / "model.pt")
    text = model.options["kernel"]
    assert text.startswith("rbf(0) * periodic(0, period=") and text.endswith(" + linear(1)")
    assert main(["predict", "--model", str(out / "model.pt"), "--data", str(data), "--out",
                 str(tmp_path / "pred.csv")]) == 0
    with open(tmp_path / "pred.csv") as handle:
        predictions = list(csv.DictReader(handle))
    assert len(predictions) == 60
