"""Findings of the outside probe (issue #46) through the command line: each is a one-line error
with exit code 2 and no traceback, or a correct answer, never a silently wrong one.

In-process ``gpscale.cli.__main__.main`` on small data (2 epochs), so each test runs in seconds.
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch

from gpscale.cli.__main__ import main

N = 60


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(N, 3))
    return x, np.sin(4 * x[:, 0]) + x[:, 1] - x[:, 2]


def _write(path, header: str | None, rows, fmt=repr):
    lines = [header] if header is not None else []
    lines += [",".join(v if isinstance(v, str) else fmt(float(v)) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(capsys, argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _ok(capsys, argv) -> str:
    code, out, err = _run(capsys, argv)
    assert code == 0, err
    return out


def _fails(capsys, argv, *needles: str) -> str:
    """Exit code 2 and exactly one error line naming every needle; no traceback."""
    code, _, err = _run(capsys, argv)
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith(f"gpscale {argv[0]}: ")]
    assert code == 2 and len(errors) == 1, err
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _fit(data, out, *extra, target="y", method="exact"):
    return ["fit", "--data", data, "--target", target, "--method", method, "--epochs", "2",
            "--out", out, "--no-progress", *extra]


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


# -- finding 7: numeric header names ---------------------------------------------------------------

def test_numeric_header_is_not_a_data_row(tmp_path, capsys, caplog):
    """``10,20,30,40`` above decimals: fit sees N rows, predict gives N predictions aligned
    with their inputs (dropping the first data row drops exactly the first prediction). The
    guess is logged (on stderr from the command line; captured by pytest here)."""
    x, y = _data()
    train = _write(tmp_path / "train.csv", "10,20,30,40", np.column_stack([x, y]))
    code, out, err = _run(capsys, _fit(train, tmp_path / "run", target="40"))  # a name
    assert code == 0, err
    assert '"n_train": 54' in out and '"n_test": 6' in out
    assert "the first row (10, 20, 30, 40) is read as a header" in caplog.text
    model = tmp_path / "run" / "model.pt"
    whole = _write(tmp_path / "all.csv", "10,20,30", x)
    tail = _write(tmp_path / "tail.csv", "10,20,30", x[1:])
    first = _rows(_ok(capsys, ["predict", "--model", model, "--data", whole]))
    rest = _rows(_ok(capsys, ["predict", "--model", model, "--data", tail]))
    assert len(first) == N and first[1:] == rest


def test_predict_knows_the_models_numeric_header(tmp_path):
    """A predict file whose first row is the model's numeric column names is read with that
    header even where the file alone gives too little evidence (integer inputs below)."""
    from gpscale.cli.predict import read_features

    rows = [[repr(float(v)), str(k)] for v, k in zip(_data()[0][:10, 0], range(10), strict=True)]
    path = _write(tmp_path / "p.csv", "1,2", rows)
    model = {"num_features": 2, "train_target": "3", "train_target_index": 2}
    assert read_features(path, None, feature_names=["1", "2"], **model).shape == (10, 2)
    assert read_features(path, None, feature_names=["2", "1"], **model).shape == (10, 2)
    assert read_features(path, None, feature_names=["x0", "x1"], **model).shape == (11, 2)


# -- finding 8: class labels 1 and 1.0 -------------------------------------------------------------

def test_labels_one_and_one_point_zero_are_one_class(tmp_path, capsys):
    x, _ = _data()
    labels = np.array(["1", "1.0", "0", "0.0"] * (N // 4))
    labels[x[:, 0] > 0.5] = "1"
    data = _write(tmp_path / "c.csv", "a,b,c,y", np.column_stack([x, labels]).tolist(),
                  fmt=repr)
    _ok(capsys, _fit(data, tmp_path / "run", "--task", "classification", method="svgp"))
    rows = _rows(_ok(capsys, ["predict", "--model", tmp_path / "run" / "model.pt", "--data",
                              data]))
    assert list(rows[0]) == ["label", "p_0", "p_1"] and len(rows) == N


# -- finding 9: data options and constant columns -------------------------------------------------

@pytest.mark.parametrize("option, needle", [
    ("bogus=1", "unknown data option 'bogus' for data set 'sine'; valid options: num_train"),
    ("n=-5", "option n=-5 is invalid: must be ≥ 2 (num_train: int ≥ 2, training points)"),
    ("seed=3", "the split and seed are arguments of their own: --split, --seed")])
def test_data_options_are_checked_by_their_declaration(tmp_path, capsys, option, needle):
    _fails(capsys, ["fit", "--dataset", "sine", "--data-option", option, "--method", "exact",
                    "--epochs", "1", "--out", tmp_path / "run", "--no-progress"], needle)


def test_constant_columns_are_named_and_tiny_or_huge_ones_kept(tmp_path, capsys):
    x, y = _data()
    rows = [[repr(float(v) * 1e-300), str(2 ** 64 + 4096 * i), "7", repr(float(t))]
            for i, (v, t) in enumerate(zip(x[:, 0], y, strict=True))]
    data = _write(tmp_path / "d.csv", "tiny,huge,const,y", rows)
    with pytest.warns(UserWarning, match=r"dropped the input column 'const' \(every value 7\)"):
        code, out, err = _run(capsys, _fit(data, tmp_path / "run"))
    assert code == 0, err
    assert '"num_dims": 2' in out


# -- finding 10: noise below GPyTorch's floor ------------------------------------------------------

def test_noise_below_gpytorchs_floor_is_refused_up_front(tmp_path, capsys):
    x, y = _data()
    data = _write(tmp_path / "d.csv", "a,b,c,y", np.column_stack([x, y]))
    _fails(capsys, _fit(data, tmp_path / "run", "-o", "noise=1e-5"),
           "option noise=1e-05 is invalid: must be ≥ 0.0001, the floor of GPyTorch's Gaussian "
           "likelihood")


# -- finding 11: predict with a counts model -------------------------------------------------------

def test_predict_with_a_counts_model(tmp_path, capsys):
    """A model trained with --task counts predicts the mean and std of the count; the mean is
    the model's expected rate E[exp f]."""
    x, _ = _data()
    counts = np.random.default_rng(1).poisson(np.exp(2 * x[:, 0]))
    data = _write(tmp_path / "counts.csv", "a,b,c,y",
                  np.column_stack([x, counts]).tolist(), fmt=lambda v: f"{v:g}")
    _ok(capsys, _fit(data, tmp_path / "run", "--task", "counts", method="auto"))
    rows = _rows(_ok(capsys, ["predict", "--model", tmp_path / "run" / "model.pt", "--data",
                              data]))
    assert list(rows[0]) == ["mean", "std"] and len(rows) == N
    mean = np.array([float(r["mean"]) for r in rows])
    std = np.array([float(r["std"]) for r in rows])
    assert (mean > 0).all() and (std >= np.sqrt(mean) * (1 - 1e-6)).all()  # ≥ Poisson's

    from gpscale.cli.predict import count_moments
    from gpscale.io import load_with_data

    saved = load_with_data(tmp_path / "run" / "model.pt")
    from gpscale.data.transforms import Standardizer

    z = Standardizer.from_dict(saved.transform).transform_x(torch.from_numpy(x))
    with torch.no_grad():
        pred = saved.model.predict(saved.state(), z.to(saved.data[0].dtype))
    expected, _ = count_moments(pred.mean.double(), pred.variance.double())
    np.testing.assert_allclose(mean, expected.numpy(), rtol=1e-6)
    if pred.rate is not None:
        np.testing.assert_allclose(mean, pred.rate.double().numpy(), rtol=1e-6)


# -- finding 12: decimal commas --------------------------------------------------------------------

def test_decimal_commas_are_named(tmp_path, capsys):
    x, y = _data()
    path = tmp_path / "d.csv"
    path.write_text("a;b;c;y\n" + "\n".join(";".join(f"{v:.3f}".replace(".", ",") for v in row)
                                             for row in np.column_stack([x, y])) + "\n")
    _fails(capsys, _fit(path, tmp_path / "run"), "the file uses decimal commas",
           "line 2, column 'a'", "gpscale reads '.' as the decimal point")


# -- item 4: nothing non-finite passes predict -----------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    x, y = _data()
    data = _write(root / "train.csv", "a,b,c,y", np.column_stack([x, y]))
    assert main([str(a) for a in _fit(data, root / "run")]) == 0
    return root / "run" / "model.pt"


def test_nonfinite_inputs_name_their_lines(model, tmp_path, capsys):
    x, _ = _data()
    rows = [[repr(float(v)) for v in row] for row in x[:6]]
    rows[2][1] = "inf"
    data = _write(tmp_path / "bad.csv", "a,b,c", rows)
    _fails(capsys, ["predict", "--model", model, "--data", data], "column 'b' holds NaN or inf",
           "line 4")


def test_nonfinite_predictions_name_their_lines(model, tmp_path, capsys, monkeypatch):
    """A model that predicts NaN at some rows (here made to) is an error naming their lines,
    and --out is not written."""
    import gpscale.cli.predict as predict

    load = predict.load_with_data

    def poisoned(path):
        saved = load(path)
        original = saved.model.predict

        def nan_at_rows(state, x):
            pred = original(state, x)
            mean = pred.mean.clone()
            mean[[1, 4]] = float("nan")
            return type(pred)(mean, pred.variance, pred.noise, pred.probs, pred.rate)

        saved.model.predict = nan_at_rows
        return saved

    monkeypatch.setattr(predict, "load_with_data", poisoned)
    x, _ = _data()
    data = _write(tmp_path / "x.csv", "a,b,c", x[:8])
    out = tmp_path / "pred.csv"
    _fails(capsys, ["predict", "--model", model, "--data", data, "--out", out],
           "the model predicts NaN or inf on lines 3, 6", "outside the training data")
    assert not out.exists()


# -- reading options of a file of one's own (--data-option with --data) ----------------------------

def _sizes(out: str) -> tuple[int, int]:
    metrics = json.loads(out[out.index("{"):out.rindex("}") + 1])
    return metrics["n_train"], metrics["n_test"]


def test_file_options_reach_the_reader(tmp_path, capsys):
    """Each option changes what is read; before, every --data-option of --data was dropped.
    ``10,20,30,40`` above decimals is a header by default and N + 1 data rows under
    ``header=none``; a first row of integers above integers is data by default and names
    under ``header=0``; ``delimiter`` and ``test_fraction`` are honoured."""
    x, y = _data()
    numeric = _write(tmp_path / "numeric.csv", "10,20,30,40", np.column_stack([x, y]))
    assert _sizes(_ok(capsys, _fit(numeric, tmp_path / "a", target="3"))) == (54, 6)
    numeric.write_text(numeric.read_text().replace(",", ";"))
    as_data = _ok(capsys, _fit(numeric, tmp_path / "b", "--data-option", "header=none",
                               "--data-option", "delimiter=;", "--data-option",
                               "test_fraction=0.25", target="3"))
    assert sum(_sizes(as_data)) == N + 1 and _sizes(as_data)[1] in (15, 16)
    ints = np.random.default_rng(1).integers(0, 1000, size=(N, 4))
    counts = _write(tmp_path / "ints.csv", "1,2,3,4", ints, fmt=lambda v: str(int(v)))
    assert sum(_sizes(_ok(capsys, _fit(counts, tmp_path / "c", target="3")))) == N + 1
    named = _ok(capsys, _fit(counts, tmp_path / "d", "--data-option", "header=0", target="4"))
    assert sum(_sizes(named)) == N


@pytest.mark.parametrize("option, needles", [
    ("bogus=1", ("unknown data option 'bogus'", "header (", "delimiter (", "test_fraction (")),
    ("header=yes", ("header='yes' is invalid", "expected infer, none or 0")),
    ("delimiter=ab", ("delimiter='ab' is invalid", "one character")),
    ("test_fraction=1.5", ("test_fraction=1.5 is invalid", "between 0 and 1")),
])
def test_bad_file_options_are_one_line_errors(tmp_path, capsys, option, needles):
    x, y = _data()
    path = _write(tmp_path / "t.csv", "a,b,c,y", np.column_stack([x, y]))
    _fails(capsys, _fit(path, tmp_path / "run", "--data-option", option), *needles)
    assert not (tmp_path / "run").exists()
