"""Rows without a target, dropped on request (``--data-option missing_target=drop``): the same
rows are kept from text, Parquet and ``.npy`` files, the split follows, and everything else that
is wrong is still an error."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from gpscale.data import load_csv
from gpscale.data.options import check_file_options

MISSING_AT = (2, 5, 6, 11)


def _values() -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(20, dtype=np.float64)
    y = 3.0 * t + 1.0
    return t, y


def _text(tmp_path, token: str = "") -> str:
    t, y = _values()
    rows = ["t,y"] + [f"{a:g},{token if i in MISSING_AT else f'{b:g}'}"
                      for i, (a, b) in enumerate(zip(t, y, strict=True))]
    path = tmp_path / "d.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def _kept(data) -> np.ndarray:
    """The targets of every row kept, in file order (train then test of a ``last`` split)."""
    ys = torch.cat([data.y_train, data.y_test]) * data.transform.y_std + data.transform.y_mean
    return ys.numpy()


@pytest.mark.parametrize("token", ["", "NA", "nan", "null", "N/A"])
def test_text_rows_without_a_target_are_dropped_and_counted(tmp_path, token):
    path = _text(tmp_path, token)
    with pytest.warns(UserWarning, match=r"dropped 4 rows without a value in the target column "
                                         r"'y' \(lines 4, 7, 8, 13\) of 20"):
        data = load_csv(path, "y", missing_target="drop", split="last", test_fraction=0.25)
    t, y = _values()
    keep = np.setdiff1d(np.arange(20), MISSING_AT)
    assert data.num_train == 12 and data.num_test == 4
    np.testing.assert_allclose(_kept(data), y[keep], rtol=1e-12)
    # the inputs stayed with their targets: x and y are still the same line
    x = torch.cat([data.x_train, data.x_test])[:, 0] * data.transform.x_std[0] \
        + data.transform.x_mean[0]
    np.testing.assert_allclose(x.numpy(), t[keep], rtol=1e-12)


def test_without_the_option_the_error_names_the_line_and_the_option(tmp_path):
    with pytest.raises(ValueError, match=r"line 4, target column 'y': empty value.*"
                                         r"missing_target=drop"):
        load_csv(_text(tmp_path), "y")


def test_parquet_nulls_and_npy_nans_drop_the_same_rows(tmp_path):
    t, y = _values()
    masked = y.copy()
    masked[list(MISSING_AT)] = np.nan
    pq.write_table(pa.table({"t": t, "y": pa.array(masked, from_pandas=True)}),
                   tmp_path / "d.parquet")
    np.save(tmp_path / "d.npy", np.stack([t, masked], axis=1))
    keep = np.setdiff1d(np.arange(20), MISSING_AT)
    for name in ("d.parquet", "d.npy"):
        with pytest.warns(UserWarning, match="dropped 4 rows"):
            data = load_csv(tmp_path / name, -1, missing_target="drop", split="last")
        np.testing.assert_allclose(_kept(data), y[keep], rtol=1e-12)
    with pytest.raises(ValueError, match=r"missing values \(null\).*missing_target=drop"):
        load_csv(tmp_path / "d.parquet", "y")


def test_what_is_not_missing_is_still_an_error(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("t,y\n1,2\n2,abc\n3,\n4,5\n5,6\n")
    with pytest.raises(ValueError, match=r"line 3, target column 'y': 'abc' is not a number"):
        load_csv(path, "y", missing_target="drop")
    path.write_text("t,y\n1,2\n2,inf\n3,\n4,5\n5,6\n")
    with pytest.raises(ValueError, match=r"target column 'y' holds inf on line 3"):
        load_csv(path, "y", missing_target="drop")
    path.write_text("t,y\n1,2\n2,1.5\n3,\n4,5\n5,6\n")
    with pytest.raises(ValueError, match="not non-negative integers on line 3"):
        load_csv(path, "y", task="counts", missing_target="drop")
    with pytest.raises(ValueError, match="not to class labels"):
        load_csv(path, "y", task="classification", missing_target="drop")
    path.write_text("t,y\n1,\n2,\n3,4\n")
    with pytest.warns(UserWarning, match="dropped 2 rows"), \
            pytest.raises(ValueError, match="1 data row with a target"):
        load_csv(path, "y", missing_target="drop")


def test_the_data_option_is_checked():
    assert check_file_options("d.csv", {"missing_target": "drop"}) == {"missing_target": "drop"}
    with pytest.raises(ValueError, match="expected error or drop"):
        check_file_options("d.csv", {"missing_target": "skip"})


def test_a_forecast_through_the_cli_drops_them_and_reports_data_units(tmp_path):
    """``gpscale fit --data`` with a dates column, rows without a target, the last rows as the
    test set and a periodic kernel: the forecast of a yearly cycle is close, and the RMSE in the
    target's units is the standardised one times the target's training sd."""
    import datetime
    import json

    from gpscale.cli.__main__ import main

    day = datetime.date(2000, 1, 3)
    rows, targets = ["date,level"], []
    for week in range(160):
        when = day + datetime.timedelta(weeks=week)
        years = when.year + (when - datetime.date(when.year, 1, 1)).days / 365.0
        value = 10.0 * math.sin(2 * math.pi * years)
        if week % 9 == 4:  # no reading that week
            rows.append(f"{when:%Y%m%d},")
        else:
            rows.append(f"{when:%Y%m%d},{value:.6f}")
            targets.append(value)
    (tmp_path / "s.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match=r"dropped 18 rows without a value"):
        code = main(["fit", "--data", str(tmp_path / "s.csv"), "--target", "level",
                     "--data-option", "missing_target=drop", "--data-option", "dates=date",
                     "--data-option", "split=last", "--data-option", "test_fraction=0.2",
                     "--method", "exact", "-o", "kernel=periodic(period=1)", "--epochs", "30",
                     "--out", str(out), "--no-progress"])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_train"] + metrics["n_test"] == len(targets) == 142
    train = np.array(targets[:metrics["n_train"]])
    assert metrics["test_rmse_data_units"] == pytest.approx(
        metrics["test_rmse"] * train.std(), rel=1e-6)
    assert metrics["test_rmse_data_units"] < 0.5  # a cycle of amplitude 10, extrapolated
