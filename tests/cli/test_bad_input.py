"""Bad input through the command line: a one-line error and exit code 2, never a traceback, and
never a silently wrong answer (issue #19).

Every test calls ``gpscale.cli.__main__.main`` in-process on small data (200 rows, ``exact``,
2 epochs) so that each runs in seconds.
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.data.splits import random_split

N = 200


def _table(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(N, 3))
    return x, np.sin(4 * x[:, 0]) + x[:, 1] - x[:, 2]


def _write(path, header, rows, delimiter=","):
    lines = [delimiter.join(header)] if header else []
    lines += [delimiter.join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _train_csv(path, seed: int = 0, delimiter: str = ","):
    x, y = _table(seed)
    return _write(path, ["a", "b", "c", "y"], np.column_stack([x, y]), delimiter)


def _fit_argv(data, out, *extra, method="exact"):
    return ["fit", "--data", str(data), "--target", "y", "--method", method, "--epochs", "2",
            "--out", str(out), "--no-progress", *extra]


def _ok(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def _fails(capsys, argv, *needles: str) -> str:
    """Exit code 2 and exactly one error line naming every needle; no traceback."""
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith(f"gpscale {argv[0]}: ")]
    assert code == 2, err
    assert len(errors) == 1, err
    assert errors[0].startswith(f"gpscale {argv[0]}: error: "), err
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _predictions(text: str) -> np.ndarray:
    rows = list(csv.DictReader(io.StringIO(text)))
    return np.array([[float(r["mean"]), float(r["std"])] for r in rows])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model fitted on columns a, b, c with target y (header row)."""
    root = tmp_path_factory.mktemp("trained")
    data = _train_csv(root / "train.csv")
    assert main(_fit_argv(data, root / "run")) == 0
    return root / "run" / "model.pt"


def _predict(model, path, *extra):
    return ["predict", "--model", str(model), "--data", str(path), *extra]


# -- columns by name ------------------------------------------------------------------------------

def test_predict_matches_columns_by_header_name(trained, tmp_path, capsys):
    """Reordered columns (same names) give the predictions of the training order."""
    x, y = _table()
    same = _write(tmp_path / "same.csv", ["a", "b", "c"], x[:20])
    shuffled = _write(tmp_path / "shuffled.csv", ["c", "y", "a", "b"],
                      np.column_stack([x[:20, 2], y[:20], x[:20, 0], x[:20, 1]]))
    want = _predictions(_ok(capsys, _predict(trained, same)))
    got = _predictions(_ok(capsys, _predict(trained, shuffled)))  # target y dropped
    np.testing.assert_array_equal(got, want)
    # --target names a column that is absent: ignored, as the help says
    np.testing.assert_array_equal(
        _predictions(_ok(capsys, _predict(trained, same, "--target", "price"))), want)


def test_predict_names_missing_and_unknown_columns(trained, tmp_path, capsys):
    x, _ = _table()
    missing = _write(tmp_path / "missing.csv", ["c", "a"], x[:5, [2, 0]])
    _fails(capsys, _predict(trained, missing), "lacks the input column b")
    extra = _write(tmp_path / "extra.csv", ["a", "b", "c", "d", "e"],
                   np.column_stack([x[:5], x[:5, :2]]))
    _fails(capsys, _predict(trained, extra), "columns d, e", "not trained on")
    _ok(capsys, _predict(trained, _write(tmp_path / "drop.csv", ["a", "b", "c", "id"],
                                         np.column_stack([x[:5], np.arange(5)])),
                         "--target", "id"))
    _fails(capsys, _predict(trained, missing, "--target", "a"), "input of the model")


def test_predict_headerless_file_needs_the_training_column_count(trained, tmp_path, capsys):
    """Without a header: d input columns, or the training file's d + 1 with the target."""
    x, y = _table()
    with_header = _write(tmp_path / "h.csv", ["a", "b", "c"], x[:8])
    want = _predictions(_ok(capsys, _predict(trained, with_header)))
    inputs = _write(tmp_path / "inputs.csv", None, x[:8])
    full = _write(tmp_path / "full.csv", None, np.column_stack([x[:8], y[:8]]))
    np.testing.assert_array_equal(_predictions(_ok(capsys, _predict(trained, inputs))), want)
    np.testing.assert_array_equal(_predictions(_ok(capsys, _predict(trained, full))), want)
    wrong = _write(tmp_path / "wrong.csv", None, x[:8, :2])
    _fails(capsys, _predict(trained, wrong), "has 2 columns", "3 input columns")


def test_model_file_of_the_first_format_predicts_by_position(trained, tmp_path, capsys):
    """A model.pt written before feature names and checksums (format gpscale-1, pickled) is
    refused; converted with `gpscale convert --trust` it predicts by position."""
    from gpscale.io import read_file

    payload = read_file(trained, ("method",))
    legacy = {k: v for k, v in payload.items() if k not in ("version", "sha256")}
    legacy["format"] = "gpscale-1"
    legacy["info"] = {k: v for k, v in legacy["info"].items()
                      if k not in ("feature_names", "target_name", "target_index")}
    old, new = tmp_path / "old.pt", tmp_path / "new.pt"
    torch.save(legacy, old)
    x, y = _table()
    full = _write(tmp_path / "full.csv", None, np.column_stack([x[:8], y[:8]]))
    inputs = _write(tmp_path / "inputs.csv", None, x[:8])
    _fails(capsys, _predict(old, inputs), "pickled format", "gpscale convert")
    _ok(capsys, ["convert", str(old), str(new), "--trust"])
    want = _predictions(_ok(capsys, _predict(trained, inputs)))
    np.testing.assert_array_equal(
        _predictions(_ok(capsys, _predict(new, full, "--target", "-1"))), want)
    np.testing.assert_array_equal(_predictions(_ok(capsys, _predict(new, inputs))), want)


def test_predict_on_a_header_only_file(trained, tmp_path, capsys):
    path = tmp_path / "empty.csv"
    path.write_text("a,b,c\n")
    _fails(capsys, _predict(trained, path), "empty.csv", "no data rows")


def test_predict_rejects_nonfinite_features_with_line_numbers(trained, tmp_path, capsys):
    x, _ = _table()
    path = _write(tmp_path / "nan.csv", ["a", "b", "c"], x[:5])
    path.write_text(path.read_text().replace(str(x[3, 1]), "inf"))
    _fails(capsys, _predict(trained, path), "column 'b'", "line 5")


def test_predict_help_agrees_with_the_behaviour(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "drop if present, ignored if absent" in text


# -- targets --------------------------------------------------------------------------------------

@pytest.mark.parametrize("part", ["train", "test"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_nonfinite_target_is_rejected_wherever_it_lands(part, value, tmp_path, capsys):
    train_idx, test_idx = random_split(N, 0.1, 0)
    row = int((train_idx if part == "train" else test_idx)[3])
    x, y = _table()
    rows = np.column_stack([x, y]).astype(object)
    rows[row, 3] = value
    path = _write(tmp_path / "bad.csv", ["a", "b", "c", "y"], rows)
    line = _fails(capsys, _fit_argv(path, tmp_path / "out"), "bad.csv", "'y'", "NaN or inf",
                  f"line {row + 2}")
    assert "standardize" not in line
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_metrics_json_is_strict_json(tmp_path, capsys, monkeypatch):
    """A non-finite metric is written as null (json.dump with allow_nan=False)."""
    from gpscale.distributions import Predictive

    metrics = Predictive.metrics
    monkeypatch.setattr(Predictive, "metrics",
                        lambda self, y: {**metrics(self, y), "test_nll": float("inf")})
    out = tmp_path / "out"
    _ok(capsys, _fit_argv(_train_csv(tmp_path / "d.csv"), out))

    def reject(constant):
        raise AssertionError(f"metrics.json holds {constant}")

    written = json.loads((out / "metrics.json").read_text(), parse_constant=reject)
    assert written["test_nll"] is None and written["test_rmse"] > 0


# -- file integrity -------------------------------------------------------------------------------

def _overwrite_middle(path):
    """Overwrite 200 bytes in the middle of the tensor data (after the JSON header)."""
    raw = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")
    assert len(raw) - start > 400
    mid = start + (len(raw) - start) // 2 - 100
    raw[mid:mid + 200] = bytes(range(200))
    path.write_bytes(bytes(raw))


def _foreign(path):
    from safetensors.torch import save_file

    save_file({"weights": torch.zeros(3)}, str(path))


def _pickled(path):
    torch.save({"weights": torch.zeros(3)}, path)


@pytest.mark.parametrize(("damage", "needle"), [
    (_overwrite_middle, "checksum mismatch"),
    (lambda p: p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2]), "truncated"),
    (lambda p: p.write_bytes(b""), "empty"),
    (lambda p: p.write_text("a,b,c\n1,2,3\n"), "not a gpscale file"),
    (_foreign, "not a gpscale file"),
    (_pickled, "pickled format"),
], ids=["overwritten", "truncated", "empty", "text", "foreign", "pickled"])
def test_damaged_model_file(damage, needle, trained, tmp_path, capsys):
    model = tmp_path / "model.pt"
    model.write_bytes(trained.read_bytes())
    damage(model)
    x, _ = _table()
    data = _write(tmp_path / "x.csv", ["a", "b", "c"], x[:5])
    _fails(capsys, _predict(model, data), str(model), needle)


def test_a_checkpoint_is_not_a_model(tmp_path, capsys):
    data, ckpt = _train_csv(tmp_path / "d.csv"), tmp_path / "ck.pt"
    _ok(capsys, _fit_argv(data, tmp_path / "run", "--checkpoint", str(ckpt)))
    _fails(capsys, _predict(ckpt, data), "ck.pt", "training checkpoint, not a saved model")
    _fails(capsys, _fit_argv(data, tmp_path / "again", "--checkpoint",
                             str(tmp_path / "run" / "model.pt")),
           "model.pt", "not a training checkpoint")


@pytest.mark.parametrize(("change", "needle"), [
    ({"seed": 1}, "other training data"),
    ({"rows": N - 20}, "training data of shape"),
    ({"method": "sgpr"}, "method exact; this run uses sgpr"),
    ({"extra": ("--dtype", "float32")}, "float32"),
], ids=["other-data", "other-shape", "other-method", "other-dtype"])
def test_checkpoint_of_another_run_is_an_error(change, needle, tmp_path, capsys):
    """A checkpoint written by another run is reported, never trained over."""
    ckpt = tmp_path / "ck.pt"
    _ok(capsys, _fit_argv(_train_csv(tmp_path / "first.csv"), tmp_path / "first",
                          "--checkpoint", str(ckpt)))
    before = ckpt.read_bytes()
    second = _train_csv(tmp_path / "second.csv", seed=change.get("seed", 0))
    if "rows" in change:
        second.write_text("".join(second.read_text().splitlines(True)[:change["rows"] + 1]))
    extra = (*change.get("extra", ()), "--checkpoint", str(ckpt))
    if change.get("method") == "sgpr":
        extra = (*extra, "-o", "num_inducing=16")
    argv = _fit_argv(second, tmp_path / "second", *extra, method=change.get("method", "exact"))
    _fails(capsys, argv, "ck.pt", needle, "delete it")
    assert ckpt.read_bytes() == before


def test_checkpoint_with_other_method_options_is_an_error(tmp_path, capsys):
    data, ckpt = _train_csv(tmp_path / "d.csv"), tmp_path / "ck.pt"
    _ok(capsys, _fit_argv(data, tmp_path / "a", "-o", "num_inducing=16", "--checkpoint",
                          str(ckpt), method="sgpr"))
    _fails(capsys, _fit_argv(data, tmp_path / "b", "-o", "num_inducing=20", "--checkpoint",
                             str(ckpt), method="sgpr"),
           "-o num_inducing=16; this run uses -o num_inducing=20", "pass -o num_inducing=16")


@pytest.mark.parametrize(("damage", "needle"), [
    (lambda p: p.write_bytes(p.read_bytes()[:300]), "truncated"),
    (lambda p: p.write_bytes(b""), "empty"),
    (_overwrite_middle, "checksum mismatch"),
], ids=["truncated", "empty", "overwritten"])
def test_damaged_checkpoint(damage, needle, tmp_path, capsys):
    data, ckpt = _train_csv(tmp_path / "d.csv"), tmp_path / "ck.pt"
    _ok(capsys, _fit_argv(data, tmp_path / "a", "--checkpoint", str(ckpt)))
    damage(ckpt)
    _fails(capsys, _fit_argv(data, tmp_path / "b", "--checkpoint", str(ckpt)), "ck.pt", needle)


# -- CSV layout -----------------------------------------------------------------------------------

def test_duplicate_column_names(tmp_path, capsys):
    x, y = _table()
    path = _write(tmp_path / "dup.csv", ["a", "a", "c", "y"], np.column_stack([x, y]))
    for target in ("a", "y"):
        argv = _fit_argv(path, tmp_path / "out")
        argv[argv.index("y")] = target
        _fails(capsys, argv, "duplicate column names", "'a' (columns 1, 2)")


@pytest.mark.parametrize("delimiter", [";", "\t"])
def test_semicolon_and_tab_separated_files_load(delimiter, tmp_path, capsys):
    comma = json.loads(_ok(capsys, _fit_argv(_train_csv(tmp_path / "c.csv"), tmp_path / "c")))
    other = _train_csv(tmp_path / "o.csv", delimiter=delimiter)
    got = json.loads(_ok(capsys, _fit_argv(other, tmp_path / "o")))
    assert got["num_dims"] == 3 and got["test_rmse"] == comma["test_rmse"]
    x, _ = _table()
    new = _write(tmp_path / "new.csv", ["b", "a", "c"], x[:5, [1, 0, 2]], delimiter)
    _ok(capsys, _predict(tmp_path / "o" / "model.pt", new))


def test_header_only_file_at_fit(tmp_path, capsys):
    path = tmp_path / "h.csv"
    path.write_text("a,b,c,y\n")
    _fails(capsys, _fit_argv(path, tmp_path / "out"), "h.csv", "no data rows")


# -- the same errors from the Python API ----------------------------------------------------------

def test_python_api_raises_value_errors_without_advice_on_missing_options(tmp_path):
    from gpscale import GPRegressor, load
    from gpscale.data import load_csv
    from gpscale.data.transforms import Standardizer
    from gpscale.errors import SavedFileError
    from gpscale.validation import check_xy

    x, y = _table()
    bad_y = y.copy()
    bad_y[[4, 9]] = [np.inf, np.nan]
    for fit_y in (bad_y, np.ones(N)):
        with pytest.raises(ValueError) as err:
            GPRegressor(method="exact", epochs=2).fit(x, fit_y)
        assert "standardize" not in str(err.value)
    with pytest.raises(ValueError, match=r"y contains NaN or inf values \(rows 4, 9\)"):
        Standardizer.fit(torch.from_numpy(x), torch.from_numpy(bad_y))
    with pytest.raises(ValueError, match=r"first rows: \[4, 9\]"):
        check_xy(torch.from_numpy(x), torch.from_numpy(bad_y))
    rows = np.column_stack([x, bad_y])
    with pytest.raises(ValueError, match="holds NaN or inf on lines 6, 11"):
        load_csv(_write(tmp_path / "d.csv", ["a", "b", "c", "y"], rows), "y")
    empty = tmp_path / "model.pt"
    empty.write_bytes(b"")
    with pytest.raises(SavedFileError, match="model.pt: the file is empty") as err:
        load(empty)
    assert isinstance(err.value, ValueError)


def test_json_safe_writes_null_for_non_finite_values():
    from gpscale.metrics import json_safe

    value = {"a": float("inf"), "b": np.float32("nan"), "c": [1.0, torch.tensor(-np.inf)],
             "d": "text", "e": None, "f": np.int64(3)}
    assert json.dumps(json_safe(value), allow_nan=False) == (
        '{"a": null, "b": null, "c": [1.0, null], "d": "text", "e": null, "f": 3}')


def test_data_file_with_a_method_of_another_task_names_the_task_flag(tmp_path, capsys):
    data = _train_csv(tmp_path / "train.csv")
    _fails(capsys, _fit_argv(data, tmp_path / "run", method="iterncgp"), "'iterncgp'",
           "'regression'", "--task classification")


def test_unreachable_device_is_one_error_line(capsys, tmp_path):
    """``--device cuda:N`` past the GPUs torch sees (every N on a CPU build) names the device."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _fails(capsys, _fit_argv(_train_csv(tmp_path / "t.csv"), tmp_path / "out", "--device",
                             f"cuda:{count}"), f"cuda:{count}", "CUDA device")
