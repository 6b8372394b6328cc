"""Suite ``scale``: one row measured end to end on a small file, and the size names."""

from __future__ import annotations

import pytest

from gpscale.benchmarks import scale


@pytest.mark.parametrize("method, field", [("softki", scale.FIELD_8D), ("ggp", scale.FIELD_3D)])
def test_a_row_reports_load_training_and_prediction(tmp_path, method, field):
    path, floor = scale._file(tmp_path, 3000, field)
    row = scale.measure(str(path), method, field, max_time=1.0, predict_rows=5000)
    assert row["n_train"] == 2700 and row["num_dims"] == field["num_dims"]
    assert row["epochs"] >= 1 and row["time_per_epoch_s"] > 0
    assert row["load_s"] > 0 and row["condition_s"] > 0 and row["predict_1m_s"] > 0
    assert floor < row["test_rmse"] < 1.2  # learned something in a second, never below the floor
    assert row["peak_fit_mb"] >= 0 and row["peak_predict_mb"] >= 0
    # the file is written once and reused
    assert scale._file(tmp_path, 3000, field) == (path, floor)


def test_unknown_sizes_are_named(tmp_path):
    with pytest.raises(ValueError, match="n100k"):
        scale.run(tmp_path, datasets=("n3m",))
