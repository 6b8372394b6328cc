"""``auto``'s race: held-out rows, the candidates, successive halving, the warm start, and the
estimator and ``gpscale fit`` paths that run it."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from gpscale import GPRegressor
from gpscale.cli.__main__ import main
from gpscale.methods import build
from gpscale.methods.auto import race_candidates, split_mode
from gpscale.methods.cagp import calibration as cagp_calibration
from gpscale.methods.cagp.pipeline import default_num_actions
from gpscale.methods.options import OptionError
from gpscale.testing import SMALL_OPTIONS
from gpscale.training import harness, prefit
from gpscale.training import race as racing
from gpscale.training.config import resolve_fit_config
from gpscale.training.harness import (
    build_method,
    load_warm,
    restart_time,
    start_warm,
    train_built,
    train_method,
)
from gpscale.training.history import History

ADDITIVE = "rbf(0) + rbf(1) + rbf(2, 3)"


def _data(n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 0.1 * torch.randn(n, generator=g,
                                                                   dtype=torch.float64)
    return x, (y - y.mean()) / y.std()


@pytest.mark.parametrize("n", [300, 5_000, 100_000])
def test_held_out_split_sizes_and_seed(n):
    train, held = racing.held_out_split(n, seed=3)
    expected = min(max(racing.HELD_MIN, round(racing.HELD_SHARE * n)), racing.HELD_MAX, n // 2)
    assert len(held) == expected and len(train) + len(held) == n
    assert not set(train.tolist()) & set(held.tolist())
    again, held_again = racing.held_out_split(n, seed=3)
    assert torch.equal(held, held_again) and torch.equal(train, again)
    assert not torch.equal(held, racing.held_out_split(n, seed=4)[1])


def test_candidates_follow_task_size_and_options():
    # small data: the exact GP alone (no race); other tasks: the rules
    assert race_candidates("regression", 1_500, 5, {}) == []
    assert race_candidates("classification", 50_000, 5, {}) == []
    assert race_candidates("counts", 50_000, 5, {}) == []
    mid = race_candidates("regression", 4_000, 8, {}, memory=2**34)
    assert mid == ["exact", "cagp-opt", "svgp", "solvegp", "softki"]
    assert "exact" not in race_candidates("regression", 4_000, 8, {}, memory=2**34,
                                          parallel=True)
    assert race_candidates("regression", 20_000, 8, {}) == ["cagp-opt", "svgp", "solvegp",
                                                            "softki"]
    assert race_candidates("regression", 500_000, 8, {}) == ["svgp", "solvegp", "softki"]
    assert race_candidates("regression", 500_000, 3, {})[0] == "ggp"
    # an option only some keys declare narrows the race to them
    assert race_candidates("regression", 20_000, 8, {"num_inducing": 64}) == [
        "svgp", "solvegp", "softki"]
    assert race_candidates("regression", 20_000, 8, {"chunk_size": 512}) == [
        "cagp-opt", "softki"]
    # an additive expression over 4 inputs: ggp races beside the keys that take any kernel
    keys = race_candidates("regression", 500_000, 4, {"kernel": ADDITIVE})
    assert keys[0] == "ggp" and "svgp" in keys
    assert "ggp" not in race_candidates("regression", 500_000, 4,
                                        {"kernel": "rbf(0, 1, 2, 3)"})


def test_mode_option():
    assert split_mode({"auto": "rules", "kernel": "rbf"}) == ("rules", {"kernel": "rbf"})
    assert split_mode({}) == ("race", {})
    with pytest.raises(OptionError, match="auto='fastest'.*race, rules"):
        split_mode({"auto": "fastest"})


def test_warm_parameters_copy_where_shapes_fit():
    x, y = _data(400, 3)
    config = resolve_fit_config("cagp-opt", 400)
    a, _ = build_method("cagp-opt", (x[:300], y[:300]), task="regression", num_classes=None,
                        options={}, config=config, seed=0)
    b, _ = build_method("cagp-opt", (x, y), task="regression", num_classes=None, options={},
                        config=config, seed=1)
    with torch.no_grad():
        a.kernel.base_kernel.raw_lengthscale.add_(0.7)
    copied = load_warm(b, racing.warm_parameters(a))
    assert "policy.values" not in copied  # per-row actions keep their fresh start
    assert "kernel.base_kernel.raw_lengthscale" in copied
    torch.testing.assert_close(b.kernel.base_kernel.lengthscale, a.kernel.base_kernel.lengthscale)
    warm = {"a": torch.zeros(1)}
    assert racing.warm_options("cagp-opt", {"num_actions": 64}, {}, warm) == {"num_actions": 64,
                                                                  "prefit": "off"}
    assert racing.warm_options("cagp-opt", {"prefit": "exact"}, {"prefit": "exact"}, warm) == {
        "prefit": "exact"}
    assert racing.warm_options("svgp", {}, {}, warm) == {}


def _config(key: str):
    return resolve_fit_config(key, 1_000)


def test_race_halves_and_is_deterministic_under_a_seed():
    """Epoch-bound slices (time to spare): the same seed gives the same choice and the same
    held-out figures, to the bit; the worse half leaves after round 1."""
    x, y = _data(700, 3)
    keys = ["svgp", "softki", "solvegp"]
    options = {}
    first = racing.race(keys, x, y, options=options, config_for=_config, budget=1_000.0, seed=5,
                 epochs=12)
    second = racing.race(keys, x, y, options=options, config_for=_config, budget=1_000.0, seed=5,
                  epochs=12)
    assert first.choice.method == second.choice.method
    assert [(r.key, r.nll, r.epochs) for r in first.runners] == [
        (r.key, r.nll, r.epochs) for r in second.runners]
    assert len(first.runners) == 3 and first.held == racing.HELD_MIN
    out = [r for r in first.runners if r.round_out == 1]
    assert len(out) == 1 and all(math.isfinite(r.nll) for r in first.runners)
    winner = first.runners[0]
    assert winner.key == first.choice.method and winner.round_out is None
    assert winner.nll <= min(r.nll for r in first.runners)
    assert f"{winner.key}, the best held-out NLL" in first.choice.reason
    for r in first.runners:
        assert f"{r.key} NLL {r.nll:.3f}" in first.choice.reason
    assert any(name.endswith("raw_lengthscale") for name in first.warm)
    assert all(not t.requires_grad and t.device.type == "cpu" for t in first.warm.values())


def test_on_trained_sees_the_parameters_before_the_calibration():
    """SoftKI's held-out calibration rescales its outputscale and sets its noise after
    training; the hook sees the values the optimiser left, which the race continues from."""
    config = replace(_config("softki"), epochs=3, max_time=None)
    x, y = (t.to(config.torch_dtype) for t in _data(1_500, 3))
    model, _ = build_method("softki", (x, y), task="regression", num_classes=None,
                            options={"num_inducing": 16}, config=config, seed=0)
    seen = {}
    train_built(model, (x, y), config, on_trained=lambda m: seen.update(
        racing.warm_parameters(m)))
    after = racing.warm_parameters(model)
    assert seen.keys() == after.keys()
    assert not torch.equal(seen["log_noise"], after["log_noise"])  # calibrated after the hook
    torch.testing.assert_close(seen["inducing_points"], after["inducing_points"], rtol=0, atol=0)


def test_slices_and_the_winner_go_on_from_the_trained_parameters(monkeypatch):
    """A candidate's next slice, and the winner's final run, start from its parameters as
    training left them, not as the calibration for prediction left them; no slice anneals
    its learning rate as if its end were the run's."""
    real = racing.train_built
    starts: dict[int, list] = {}
    ends: dict[int, list] = {}

    def spy(model, train, config, *args, on_trained=None, **kwargs):
        assert not config.budget_anneal  # a slice is not its candidate's last epochs
        starts.setdefault(id(model), []).append(racing.warm_parameters(model))

        def keep(m):
            ends.setdefault(id(m), []).append(racing.warm_parameters(m))
            on_trained(m)

        return real(model, train, config, *args, on_trained=keep, **kwargs)

    monkeypatch.setattr(racing, "train_built", spy)
    x, y = _data(1_500, 3)
    result = racing.race(["softki", "svgp", "solvegp"], x, y, options={"num_inducing": 16},
                         config_for=_config, budget=1_000.0, seed=3, epochs=12)
    continued = [key for key in starts if len(starts[key]) == 2]
    assert continued  # two rounds: the better half trained twice
    for key in continued:
        second, first_end = starts[key][1], ends[key][0]
        assert second.keys() == first_end.keys()
        for name in second:
            assert torch.equal(second[name], first_end[name]), name
    winner = id(result.runners[0].model)
    assert winner in continued
    for name, value in result.warm.items():
        assert torch.equal(value, ends[winner][1][name]), name


def test_the_race_keeps_inside_its_limit_whatever_the_budget(monkeypatch):
    """A data-parallel run's other processes wait for rank 0's race inside one collective's
    timeout: ``limit`` caps the slices' seconds however long the budget."""
    shares = []
    real = racing._run_slice

    def spy(runner, train, held, config_for, seconds, *args):
        shares.append(seconds)
        return real(runner, train, held, config_for, 0.2, *args)

    monkeypatch.setattr(racing, "_run_slice", spy)
    monkeypatch.setattr(racing, "shared_start", lambda *args, **kwargs: None)  # slices only
    x, y = _data(600, 3)
    racing.race(["svgp", "softki", "solvegp"], x, y, options={}, config_for=_config,
                budget=100_000.0, seed=0, limit=6.0)
    assert len(shares) == 5  # three slices in round 1, two in round 2
    assert shares[:3] == [pytest.approx(6.0 / 2 / 3, rel=0.05)] * 3  # 2 rounds, 3 in the 1st
    assert all(0 < share <= 6.0 / 2 for share in shares[3:])  # what the 1st left, halved


def test_a_failing_candidate_leaves_the_race(monkeypatch):
    import gpscale.training.race as race_module

    real = race_module.train_built

    def broken(model, train, config, *args, **kwargs):
        if type(model).__name__.lower().startswith("softki"):
            raise RuntimeError("out of memory (simulated)")
        return real(model, train, config, *args, **kwargs)

    monkeypatch.setattr(race_module, "train_built", broken)
    x, y = _data(600, 3)
    result = racing.race(["softki", "svgp"], x, y, options={}, config_for=_config, budget=1_000.0,
                  seed=0, epochs=4)
    assert result.choice.method == "svgp"
    assert "softki failed (out of memory (simulated))" in result.choice.reason


def test_every_candidate_starts_from_one_exact_gp(monkeypatch):
    """One exact GP on the race's training rows starts every candidate (its outputscale and
    noise where the method estimates its own); a kernel expression takes no shared start."""
    starts, fitted = {}, []
    real_build, real_prefit = racing.build_method, racing.exact_prefit

    def build_spy(key, *args, start=None, **kwargs):
        starts.setdefault(key, start)  # the first build (a failed start is built again)
        return real_build(key, *args, start=start, **kwargs)

    def prefit_spy(x, y, **kwargs):
        fitted.append((x.shape[0], kwargs["size"], kwargs["kernel"]))
        return real_prefit(x, y, **kwargs)

    monkeypatch.setattr(racing, "build_method", build_spy)
    monkeypatch.setattr(racing, "exact_prefit", prefit_spy)
    x, y = _data(900, 3)
    result = racing.race(["svgp", "softki"], x, y, options={}, config_for=_config,
                         budget=1_000.0, seed=1, epochs=2)
    assert fitted == [(900 - racing.HELD_MIN, racing.START_POINTS, "matern32")]
    assert starts["svgp"] is starts["softki"] is not None
    assert "from an exact GP's start on 700 rows" in result.choice.reason
    softki = next(r for r in result.runners if r.key == "softki")
    assert softki.options == {} and softki.failure is None
    starts.clear()
    racing.race(["svgp", "softki"], x, y, options={"kernel": "rbf(0) + rbf(1, 2)"},
                config_for=_config, budget=1_000.0, seed=1, epochs=2)
    assert starts == {"svgp": None, "softki": None} and len(fitted) == 1


def test_a_method_with_its_own_prefit_rule_races_at_the_rate_it_has_alone(monkeypatch):
    """Every candidate takes the shared start; CaGP-Opt, which pre-fits alone only above
    AUTO_PREFIT_MIN_POINTS rows, trains from it at its capped prefit_max_lr only there, and
    at its full rate below; the winner's final run goes on under the cap it raced under, and
    under none where it raced uncapped."""
    starts, real_build = {}, racing.build_method

    def build_spy(key, *args, start=None, **kwargs):
        starts.setdefault(key, start)
        return real_build(key, *args, start=start, **kwargs)

    monkeypatch.setattr(racing, "build_method", build_spy)
    real_slice = racing._run_slice

    def rigged(runner, *args, **kwargs):  # CaGP-Opt wins
        real_slice(runner, *args, **kwargs)
        runner.nll = 0.0 if runner.key == "cagp-opt" else 1.0

    monkeypatch.setattr(racing, "_run_slice", rigged)
    x, y = _data(1_300, 3)
    for capped in (False, True):
        if capped:  # as on more rows than the rule's bound
            monkeypatch.setattr(prefit, "AUTO_PREFIT_MIN_POINTS", 1_000)
        starts.clear()
        result = racing.race(["cagp-opt", "svgp"], x, y, options={},
                             config_for=lambda key: replace(_config(key), dtype="float64"),
                             budget=1_000.0, seed=0, epochs=2)
        assert starts["svgp"] is not None and starts["cagp-opt"] is starts["svgp"]
        winner = result.runners[0]
        assert winner.key == "cagp-opt" and result.warm
        assert (winner.model.max_start_lr is not None) == capped
        assert ("prefit_max_lr" in result.options) == capped
    model = build("cagp-opt", 3, init=(x, y))
    start_warm(model, {}, "cagp-opt", {})
    assert model.max_start_lr is None
    start_warm(model, {}, "cagp-opt", {"prefit_max_lr": 0.1})
    assert model.max_start_lr == 0.1


def test_no_shared_start_where_the_exact_gp_races(monkeypatch):
    """Where the exact GP races (L-BFGS on its own likelihood) the candidates start from their
    own defaults: no pre-fit runs."""
    fitted = []
    monkeypatch.setattr(racing, "exact_prefit", lambda *a, **k: fitted.append(1) or {})
    x, y = _data(600, 3)
    result = racing.race(["exact", "svgp"], x, y, options={}, config_for=_config,
                         budget=1_000.0, seed=0, epochs=2)
    assert fitted == [] and "exact GP's start" not in result.choice.reason


def test_a_candidate_the_shared_start_breaks_starts_from_its_defaults(monkeypatch):
    """SVGP's inducing-point matrix at a large pre-fitted outputscale may not factor in
    float32: the candidate starts again from its own defaults, not out of the race."""
    real = racing.build_method
    builds = []

    def build(key, *args, start=None, **kwargs):
        builds.append((key, start is not None))
        if key == "svgp" and start is not None:
            raise RuntimeError("Cholesky of K_zz failed (simulated)")
        return real(key, *args, start=start, **kwargs)

    monkeypatch.setattr(racing, "build_method", build)
    x, y = _data(600, 3)
    result = racing.race(["svgp", "softki"], x, y, options={}, config_for=_config,
                         budget=1_000.0, seed=0, epochs=2)
    assert builds[:3] == [("svgp", True), ("svgp", False), ("softki", True)]
    svgp = next(r for r in result.runners if r.key == "svgp")
    assert svgp.failure is None and math.isfinite(svgp.nll) and svgp.epochs > 0


def test_rules_mode_and_small_data_skip_the_race():
    x, y = _data(2_100, 4)
    picked = racing.pick_auto("regression", x, y, num_classes=None, options={"auto": "rules"},
                       device=None, seed=0, config_for=_config, budget=300.0)
    assert picked.race is None and picked.warm is None
    assert picked.choice.method in ("svgp", "cagp-opt")
    small = racing.pick_auto("regression", x[:500], y[:500], num_classes=None, options={},
                      device=None, seed=0, config_for=_config, budget=300.0)
    assert small.race is None and small.choice.method == "exact"


def test_estimator_races_and_records_why(caplog):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2_300, 4))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(2_300)
    with caplog.at_level(logging.INFO, logger="gpscale.fit"):
        reg = GPRegressor(epochs=6, max_time=120, chunk_size=512).fit(X[:2_100], y[:2_100])
    assert reg.method_ in ("cagp-opt", "softki")  # the keys that take chunk_size
    assert reg.method_reason_.startswith("a race on 315 held-out rows of 2,100")
    assert "racing cagp-opt, softki" in caplog.text
    rmse = float(np.sqrt(np.mean((reg.predict(X[2_100:]) - y[2_100:]) ** 2)))
    assert rmse < 0.5 * float(np.std(y))


def test_cli_fit_races_and_writes_the_reason(tmp_path, capsys):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2_600, 3))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 / 4 + 0.1 * rng.standard_normal(2_600)
    path = tmp_path / "d.csv"
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header="a,b,c,y", comments="")
    code = main(["fit", "--data", str(path), "--target", "y", "--epochs", "4",
                 "--max-time", "200", "-o", "chunk_size=512", "--out", str(tmp_path / "run")])
    assert code == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["method"] in ("cagp-opt", "softki") and metrics["auto_time_s"] > 0
    assert metrics["train_time_s"] + metrics["auto_time_s"] <= 200 + 30
    assert metrics["method_reason"].startswith("a race on ")  # every candidate's figures
    assert metrics["method_reason"].endswith(f"{metrics['method']}, the best held-out NLL")


@pytest.mark.slow
def test_two_processes_agree_on_rank_zeros_race(tmp_path):
    """With --nproc rank 0 races (no exact GP: it has no data-parallel path) and both ranks
    train its winner."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((2_600, 4))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(2_600)
    path = tmp_path / "d.csv"
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header="a,b,c,d,y", comments="")
    assert main(["fit", "--data", str(path), "--target", "y", "--epochs", "4", "--max-time",
                 "200", "-o", "chunk_size=512", "--out", str(tmp_path / "run"), "--no-progress",
                 "--nproc", "2"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["method"] in ("cagp-opt", "softki") and metrics["nproc"] == 2
    assert math.isfinite(metrics["test_nll"]) and metrics["test_rmse"] < 0.6


def test_a_converged_lbfgs_winner_is_trained_again_from_its_own_start(caplog):
    """A full-batch L-BFGS run from the race's parameters that converges with most of its
    budget left is trained again from its own start; the lower loss of the two is kept."""
    x, y = _data(300, 3)
    config = resolve_fit_config("exact", 300)
    model, _ = build_method("exact", (x, y), task="regression", num_classes=None, options={},
                            config=config, seed=0)
    with torch.no_grad():  # long lengthscales, much noise: a plateau of a worse optimum
        model.kernel.base_kernel.raw_lengthscale.fill_(30.0)
        model.likelihood.noise_covar.raw_noise.fill_(2.0)
    warm = racing.warm_parameters(model)

    def final_loss(max_time, start):
        trained = train_method("exact", (x, y), task="regression", num_classes=None,
                               options={}, config=replace(config, max_time=max_time), seed=0,
                               warm=start)
        return min(trained.history.column("loss")), trained

    warm_only, _ = final_loss(None, warm)  # no budget: nothing to restart in
    fresh, _ = final_loss(config.max_time, None)
    with caplog.at_level(logging.INFO, logger="gpscale.training"):
        kept, trained = final_loss(config.max_time, warm)
    assert "training it again from its own start" in caplog.text
    assert fresh < warm_only - 1e-3
    assert kept == fresh
    assert trained.history.stopped == "converged"


def test_only_converged_full_batch_lbfgs_runs_with_time_left_restart():
    config = replace(resolve_fit_config("exact", 300), max_time=100.0)
    history = History(rows=[{"epoch": 3, "time_s": 10.0, "loss": 0.5}], stopped="converged")
    assert restart_time(history, config) == pytest.approx(90.0)
    assert restart_time(history, replace(config, max_time=None)) is None
    assert restart_time(history, replace(config, optimizer="adam")) is None
    assert restart_time(replace(history, stopped="time"), config) is None
    late = History(rows=[{"epoch": 30, "time_s": 60.0, "loss": 0.5}], stopped="converged")
    assert restart_time(late, config) is None  # less than half its budget left


def test_a_winner_with_parameters_per_row_starts_from_them_grown_to_every_row(monkeypatch):
    """CaGP-Opt's actions belong to the race's rows: its final run starts from them grown to
    every row (the held-out rows at zero) with its trained hyperparameters. The race builds it
    with the number of actions of every row, also where the default follows n (n/2 below
    1,024 rows), so the actions always carry over. A winner whose parameters all carry over
    (SVGP) starts from them."""
    real = racing._run_slice
    favourite = {"key": "cagp-opt"}

    def rigged(runner, *args, **kwargs):  # the real slice, then the favourite ranked first
        real(runner, *args, **kwargs)
        runner.nll = 0.0 if runner.key == favourite["key"] else 1.0

    monkeypatch.setattr(racing, "_run_slice", rigged)
    for key, n in (("cagp-opt", 700), ("cagp-opt", 1_300), ("svgp", 700)):
        favourite["key"] = key
        x, y = _data(n, 3)
        result = racing.race(["cagp-opt", "svgp"], x, y, options={}, config_for=_config,
                             budget=1_000.0, seed=0, epochs=2)
        winner = result.runners[0]
        assert winner.key == key == result.choice.method
        assert winner.model.rows_in_parameters == (key == "cagp-opt")
        if key == "svgp":
            assert any(name.endswith("raw_lengthscale") for name in result.warm)
        else:
            assert winner.model.policy.layout.num_blocks == default_num_actions(n) < n - result.held
            index, values = result.warm["policy.index"], result.warm["policy.values"]
            assert sorted(index.tolist()) == list(range(n))
            _, held = racing.held_out_split(n, 0)
            position = torch.argsort(index)
            assert bool((values[position[held]] == 0).all())
            raced_held = int(winner.model.policy.held.sum())  # its own calibration rows
            assert int((values != 0).sum()) == n - result.held - raced_held
            calibrate_on = index[result.warm["policy.held"]]  # rows no run trained on
            assert (calibrate_on.numel() > 0) == (n >= cagp_calibration.MIN_ROWS)
            assert set(calibrate_on.tolist()) <= set(held.tolist())
            assert any(name.endswith("raw_lengthscale") for name in result.warm)
    assert racing.warm_options("cagp-opt", {"num_actions": 8}, {}, {}) == {"num_actions": 8}
    assert racing.warm_options("cagp-opt", {"num_actions": 8}, {}, {"a": torch.zeros(1)}) == {
        "num_actions": 8, "prefit": "off"}


def test_a_race_winners_build_counts_against_what_the_race_left(monkeypatch):
    """The final run of a race's winner (``warm`` given, empty where it starts from its own
    start) trains for what the race left less its build (a pre-fit); any other run's
    ``max_time`` is its training time alone."""
    seen = []
    real_build, real_train = harness.build_method, harness.train_built

    def slow_build(*args, **kwargs):
        model, _ = real_build(*args, **kwargs)
        return model, 30.0  # as if its pre-fit had taken 30 s

    def spy(model, train, config, *args, **kwargs):
        seen.append(config.max_time)
        return real_train(model, train, replace(config, epochs=1), *args, **kwargs)

    monkeypatch.setattr(harness, "build_method", slow_build)
    monkeypatch.setattr(harness, "train_built", spy)
    x, y = _data(200, 2)
    config = replace(resolve_fit_config("svgp", 200), max_time=100.0)
    for warm in ({}, None):
        train_method("svgp", (x, y), task="regression", num_classes=None,
                     options={"num_inducing": 8}, config=config, seed=0, warm=warm)
    assert seen == [pytest.approx(70.0), 100.0]


def test_a_failed_run_from_its_own_start_keeps_the_warm_one(monkeypatch, caplog):
    """The second run is a chance, not a risk: where it fails, the converged warm-started run
    is returned, warned."""
    from gpscale.errors import NumericalError

    x, y = _data(300, 3)
    config = resolve_fit_config("exact", 300)
    model, _ = build_method("exact", (x, y), task="regression", num_classes=None, options={},
                            config=config, seed=0)
    with torch.no_grad():
        model.kernel.base_kernel.raw_lengthscale.fill_(30.0)
        model.likelihood.noise_covar.raw_noise.fill_(2.0)
    warm = racing.warm_parameters(model)
    warm_only = train_method("exact", (x, y), task="regression", num_classes=None, options={},
                             config=replace(config, max_time=None), seed=0, warm=warm)
    real, builds = harness.build_method, []

    def second_fails(*args, **kwargs):
        builds.append(1)
        if len(builds) == 2:
            raise NumericalError("the Cholesky factor failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(harness, "build_method", second_fails)
    with caplog.at_level(logging.INFO, logger="gpscale.training"):
        kept = train_method("exact", (x, y), task="regression", num_classes=None, options={},
                            config=config, seed=0, warm=warm)
    assert len(builds) == 2 and "keeping the warm-started one" in caplog.text
    assert min(kept.history.column("loss")) == min(warm_only.history.column("loss"))


def test_cagp_opt_is_judged_by_the_intervals_its_final_run_delivers():
    """A CaGP-Opt slice on 1,300 rows calibrates its predictive as its final run does, and the
    race scores that predictive: the runner's NLL is the held-out NLL of the calibrated model,
    its variance factor is not 1, and the reason line carries one NLL."""
    x, y = _data(1_500, 3)
    train_rows, held_rows = racing.held_out_split(x.shape[0], 0)
    assert len(train_rows) >= 1_000  # where CaGP-Opt calibrates
    runner = racing.Runner("cagp-opt", {**SMALL_OPTIONS["cagp-opt"]})
    racing._run_slice(runner, (x[train_rows], y[train_rows]), (x[held_rows], y[held_rows]),
                      lambda key: replace(_config(key), dtype="float64"), 60.0, 5, 0)
    model = runner.model
    assert runner.failure is None and float(model.variance_scale) != 1.0
    with torch.no_grad():
        pred = model.predict(model.posterior(x[train_rows], y[train_rows]), x[held_rows])
    assert runner.nll == pytest.approx(pred.nll(y[held_rows]), rel=1e-9)
    assert runner.judged == runner.nll and runner.describe().count("NLL") == 1
