"""``method="auto"``: the rules, their reasons, and the CLI / estimator paths that use them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from gpscale import GPClassifier, GPRegressor
from gpscale.cli.__main__ import main
from gpscale.methods import METHODS
from gpscale.methods.auto import (
    CAGP_MAX_N,
    EXACT_MAX_N,
    ITERNCGP_MAX_NC,
    PROBE_RATIO_MIN,
    RULES,
    Probe,
    choose_method,
    needs_probe,
    pick,
)
from gpscale.methods.options import AUTO_PREFIT_MIN_POINTS

GIB = 2**30


@pytest.mark.parametrize("task, n, d, classes, expected", [
    ("regression", 500, 8, None, "exact"),
    ("regression", EXACT_MAX_N, 30, None, "exact"),
    ("regression", EXACT_MAX_N + 1, 2, None, "ggp"),
    ("regression", 10**8, 3, None, "ggp"),
    ("regression", EXACT_MAX_N + 1, 4, None, "cagp-opt"),
    ("regression", CAGP_MAX_N, 32, None, "cagp-opt"),
    ("regression", CAGP_MAX_N + 1, 4, None, "solvegp"),
    ("regression", 2 * 10**6, 8, None, "solvegp"),
    ("classification", 8000, 784, 10, "iterncgp"),
    ("classification", ITERNCGP_MAX_NC, 5, 2, "iterncgp"),   # binary: one latent function
    ("classification", ITERNCGP_MAX_NC // 10 + 1, 5, 10, "svgp"),
    ("counts", 10**6, 1, None, "iterncgp"),
])
def test_rules_pick_the_documented_key(task, n, d, classes, expected):
    choice = choose_method(task, n, d, num_classes=classes, memory=64 * GIB)
    assert choice.method == expected
    assert choice.method in METHODS and task in METHODS[choice.method].tasks
    assert f"{n:,}" in choice.reason or task == "counts"  # the reason names the size


def test_exact_is_skipped_when_its_dense_matrices_do_not_fit():
    n = 1500  # 4 dense n×n float64 arrays: 72 MB
    assert choose_method("regression", n, 2, memory=1 * GIB).method == "exact"
    low = choose_method("regression", n, 2, memory=100 * 2**20)
    assert low.method == "ggp" and "do not fit" in low.reason
    assert choose_method("regression", n, 6, memory=100 * 2**20).method == "cagp-opt"


def test_every_rule_row_is_reachable_and_names_a_key_for_its_task():
    """RULES (what `gpscale methods auto` prints) and choose_method agree row by row."""
    noisy = Probe(noise=0.3, outputscale=1.0, residual=0.3, num_inducing=512, points=1000,
                  seconds=2.0, error=0.35)
    examples = {
        ("regression", "exact"): (100, 5, None, None),
        ("regression", "ggp"): (50_000, 2, None, None),
        ("regression", "svgp"): (5000, 9, None, noisy),
        ("regression", "cagp-opt"): (5000, 9, None, None),
        ("regression", "solvegp"): (60_000, 9, None, noisy),
        ("classification", "iterncgp"): (1000, 3, 3, None),
        ("classification", "svgp"): (10**6, 3, 3, None),
        ("counts", "iterncgp"): (10, 1, None, None),
    }
    for task, _condition, key in RULES:
        assert task in METHODS[key].tasks
        n, d, c, probe = examples[task, key]
        assert choose_method(task, n, d, num_classes=c, memory=64 * GIB,
                             probe=probe).method == key


def test_readme_table_lists_every_auto_choice():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## Which method when", 1)[1].split("\n## ", 1)[0]
    for _task, _condition, key in RULES:
        assert f"`{key}`" in section


@pytest.mark.parametrize("task, n, d", [("regression", 0, 3), ("regression", 10, 0),
                                         ("ranking", 10, 3)])
def test_bad_requests_are_value_errors(task, n, d):
    with pytest.raises(ValueError, match="auto|task"):
        choose_method(task, n, d)


def test_regressor_defaults_to_auto_and_says_why(caplog):
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 2))
    y = np.sin(4 * X[:, 0]) + 0.05 * rng.normal(size=60)
    with caplog.at_level(logging.INFO, logger="gpscale.fit"):
        reg = GPRegressor(epochs=3).fit(X, y)
    assert reg.method == "auto" and reg.method_ == "exact"
    assert "n = 60" in reg.method_reason_
    assert any("method auto: n = 60" in r.getMessage() for r in caplog.records)
    # and the budget line, as `gpscale fit` prints it (docs/guide/options.md, "Training defaults")
    assert any(r.getMessage().startswith("exact: training for at most 3 epochs")
               for r in caplog.records)
    # the fitted key is what was trained; options are checked against it at fit
    assert reg.model_.method_key == "exact"
    assert np.sqrt(np.mean((reg.predict(X) - y) ** 2)) < 0.2
    # num_inducing is an option of methods auto can pick, so the estimator is made; fit
    # says that auto chose exact, which has none
    with pytest.raises(ValueError, match="auto' chose 'exact' .*unknown option 'num_inducing'"):
        GPRegressor(epochs=1, num_inducing=8).fit(X, y)
    with pytest.raises(ValueError, match="num_inducing=.*invalid"):
        GPRegressor(num_inducing="many")


def test_saved_auto_estimator_remembers_the_fitted_key(tmp_path):
    import gpscale

    rng = np.random.default_rng(1)
    X = rng.uniform(size=(40, 3))
    y = X.sum(1)
    reg = GPRegressor(epochs=2).fit(X, y)
    gpscale.save(reg, tmp_path / "m.pt")
    back = gpscale.load(tmp_path / "m.pt")
    assert back.method == "auto" and back.method_ == "exact"
    np.testing.assert_allclose(back.predict(X), reg.predict(X))


def test_classifier_auto_picks_iterncgp():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(80, 2))
    y = (X[:, 0] + 0.3 * rng.normal(size=80) > 0).astype(int)
    clf = GPClassifier(epochs=2).fit(X, y)
    assert clf.method_ == "iterncgp"
    assert (clf.predict(X) == y).mean() > 0.8


def test_cli_fit_without_method_chooses_and_prints_the_reason(tmp_path, capsys, caplog):
    rng = np.random.default_rng(3)
    x = rng.uniform(size=(120, 5))
    path = tmp_path / "five.csv"
    np.savetxt(path, np.column_stack([x, x @ np.arange(1, 6)]), delimiter=",",
               header="a,b,c,d,e,y", comments="")
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="gpscale.fit"):
        assert main(["fit", "--data", str(path), "--target", "y", "--epochs", "2",
                     "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert any(r.getMessage().startswith("method auto: n = 108 ≤ 2,000")
               for r in caplog.records)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["method"] == "exact"
    assert json.loads(captured.out)["method"] == "exact"


def test_cli_methods_auto_prints_the_rules(capsys):
    assert main(["methods", "auto"]) == 0
    text = capsys.readouterr().out
    for _task, condition, key in RULES:
        assert condition in text and key in text
    assert main(["methods"]) == 0
    assert "auto" in capsys.readouterr().out


def test_cli_auto_with_a_misspelt_option_is_a_one_line_error(tmp_path, capsys):
    code = main(["fit", "--dataset", "yacht", "-o", "num_inducng=64", "--out",
                 str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "unknown option 'num_inducng' for method 'auto'" in err
    assert "did you mean 'num_inducing'" in err


def test_cagp_choice_above_the_prefit_threshold_names_the_faster_alternative():
    """Between the pre-fit threshold and CAGP_MAX_N the reason says CaGP-Opt may take its whole
    budget after a pre-fit and that svgp converges sooner; below it, it does not."""
    above = choose_method("regression", AUTO_PREFIT_MIN_POINTS + 1, 9, memory=64 * GIB)
    below = choose_method("regression", AUTO_PREFIT_MIN_POINTS, 9, memory=64 * GIB)
    assert above.method == below.method == "cagp-opt"
    assert "--method svgp converges sooner" in above.reason
    assert "svgp" not in below.reason


@pytest.mark.parametrize(("n", "d", "key"), [
    (35_000, 8, "exact"), (60_000, 8, "cagp-opt"), (200_000, 8, "cagp-opt"),
    (200_001, 8, "solvegp"), (60_000, 2, "ggp"), (1_000, 8, "exact")])
def test_on_a_gpu_exact_goes_as_far_as_it_fits_and_cagp_opt_further(n, d, key):
    gpu = torch.device("cuda:0")
    choice = choose_method("regression", n, d, memory=80 * GIB, device=gpu)
    assert choice.method == key and "cuda:0" in choice.reason
    # the exact GP's limit is the card's memory: 35,000 points do not fit in 30 GiB
    if n == 35_000:
        assert choose_method("regression", n, d, memory=30 * GIB, device=gpu).method == "cagp-opt"
        assert choose_method("regression", n, d, memory=80 * GIB).method == "cagp-opt"  # CPU


def test_classification_and_counts_choose_the_same_on_a_gpu():
    gpu = torch.device("cuda:0")
    for task, n, c in (("classification", 8_000, 10), ("classification", 10**6, 2),
                       ("counts", 5_000, None)):
        assert (choose_method(task, n, 5, num_classes=c, memory=80 * GIB, device=gpu)
                == choose_method(task, n, 5, num_classes=c, memory=80 * GIB))


def _probe(ratio: float) -> Probe:
    return Probe(noise=1e-4, outputscale=1.0, residual=0.1 * ratio, num_inducing=512,
                 points=1000, seconds=3.0, error=0.1)


@pytest.mark.parametrize("ratio, key", [(0.05, "svgp"), (PROBE_RATIO_MIN * 0.99, "svgp"),
                                        (PROBE_RATIO_MIN, "cagp-opt"), (1.86, "cagp-opt"),
                                        (270.0, "cagp-opt"), (1.42, "svgp")])
def test_the_probe_decides_between_svgp_and_cagp_opt(ratio, key):
    """Where the size rules give CaGP-Opt, a probe whose ratio of inducing-point residual to
    the small exact GP's held-out error is below PROBE_RATIO_MIN gives SVGP; the reason names
    ρ and the gain's scale."""
    probe = _probe(ratio)
    choice = choose_method("regression", 15_000, 18, memory=64 * GIB, probe=probe)
    assert choice.method == key
    assert f"ρ = {ratio:.3g}" in choice.reason and "1,000 points" in choice.reason
    if key == "svgp":
        assert "svgp (minibatch, it converged in 1–2.5 minutes" in choice.reason
        assert f"~{np.sqrt(1 + ratio) - 1:.0%}" in choice.reason
    else:
        assert "inducing points' error would dominate" in choice.reason
    assert probe.gain == pytest.approx(np.sqrt(1 + ratio) - 1)


@pytest.mark.parametrize("task, n, d, on_gpu", [
    ("regression", 1500, 8, False), ("regression", 40_000, 3, False),
    ("regression", CAGP_MAX_N + 1, 8, False), ("classification", 5000, 8, False),
    ("regression", 30_000, 8, True)])
def test_outside_cagp_opt_s_band_the_probe_is_neither_run_nor_used(task, n, d, on_gpu):
    device = torch.device("cuda:0") if on_gpu else None
    memory = 80 * GIB
    assert not needs_probe(task, n, d, memory=memory, device=device)
    plain = choose_method(task, n, d, memory=memory, device=device)
    assert choose_method(task, n, d, memory=memory, device=device, probe=_probe(0.01)) == plain

    def never() -> Probe:
        raise AssertionError("the probe ran outside its band")

    if not on_gpu:  # pick reads the CPU's memory itself
        assert pick(task, n, d, num_classes=None, options={}, probe=never)[0] == plain


def test_a_failing_probe_warns_and_the_size_rules_decide():
    def broken() -> Probe:
        raise RuntimeError("cholesky failed")

    assert needs_probe("regression", 12_000, 9)
    with pytest.warns(UserWarning, match="probe of the data failed .cholesky failed"):
        choice, _ = pick("regression", 12_000, 9, num_classes=None, options={}, probe=broken)
    assert choice.method == "cagp-opt"
    choice, _ = pick("regression", 12_000, 9, num_classes=None, options={},
                     probe=lambda: _probe(0.2))
    assert choice.method == "svgp"


@pytest.mark.slow
def test_cli_auto_probes_noisy_data_and_picks_svgp(tmp_path, caplog):
    """`gpscale fit -o auto=rules` without --method on 2,500 noisy rows of a smooth 5-D
    function: the probe runs (its time in metrics.json), finds ρ far below PROBE_RATIO_MIN and
    SVGP trains."""
    rng = np.random.default_rng(4)
    x = rng.uniform(size=(2800, 5))
    y = np.sin(2 * x[:, 0]) + x[:, 1] + rng.normal(scale=0.5, size=2800)
    path = tmp_path / "noisy.csv"
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header="a,b,c,d,e,y",
               comments="")
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="gpscale.fit"):
        assert main(["fit", "--data", str(path), "--target", "y", "--epochs", "2",
                     "-o", "auto=rules", "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["method"] == "svgp" and metrics["auto_time_s"] > 0
    reason = next(r.getMessage() for r in caplog.records
                  if r.getMessage().startswith("method auto:"))
    assert "probe: an exact GP on 1,000 points" in reason and ": svgp" in reason
    assert reason == f"method auto: {metrics['method_reason']}"
