"""Suite ``scale``: one row measured end to end on a small file, and the size names."""

from __future__ import annotations

import pytest

from gpscale.benchmarks import scale


@pytest.mark.long
@pytest.mark.parametrize("method, field", [("softki", scale.FIELD_8D), ("ggp", scale.FIELD_3D)])
def test_a_row_reports_load_training_and_prediction(tmp_path, method, field):
    path, floor = scale._file(tmp_path, 3000, field)
    row = scale.measure(str(path), method, field, max_time=1.0, predict_rows=5000)
    assert row["n_train"] == 2700 and row["num_dims"] == field["num_dims"]
    assert row["epochs"] >= 1 and row["time_per_epoch_s"] > 0
    assert row["load_s"] > 0 and row["condition_s"] > 0 and row["predict_1m_s"] > 0
    assert floor < row["test_rmse"] < 1.2  # learned something in a second, never below the floor
    assert row["peak_fit_mb"] >= 0 and row["peak_predict_mb"] >= 0
    assert row["inducing"] == ("512" if method == "softki" else None)  # min(512, 2700/2); GGP: none
    # the file is written once and reused
    assert scale._file(tmp_path, 3000, field) == (path, floor)


def test_unknown_sizes_are_named(tmp_path):
    with pytest.raises(ValueError, match="n100k"):
        scale.run(tmp_path, datasets=("n3m",))


def test_max_time_reaches_every_run_and_is_refused_elsewhere(tmp_path, monkeypatch):
    """``gpscale bench scale --max-time S`` trains each run for S seconds; a suite without a
    per-run budget, or a budget that is not positive, is an error naming the flag."""
    from gpscale.benchmarks.registry import run_suite

    seen = []
    monkeypatch.setattr(scale, "_file", lambda out, n, field: (out / "f.parquet", 0.2))
    monkeypatch.setattr(scale, "peak_memory_mb",
                        lambda fn, path, method, field, **kw: seen.append(kw["max_time"])
                        or (0.0, {"test_rmse": 0.3}))
    run_suite("scale", tmp_path, datasets=("n100k",), runs=("svgp",), max_time=60.0)
    assert seen == [60.0]
    with pytest.raises(ValueError, match="--max-time"):
        run_suite("kernels", tmp_path, max_time=60.0)
    with pytest.raises(ValueError, match="--max-time"):
        run_suite("scale", tmp_path, max_time=0.0)
