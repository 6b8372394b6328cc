"""Writing generated tables (gpscale.data.writers) in every format gpscale reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpscale.cli.__main__ import main
from gpscale.data.csv import read_table
from gpscale.data.synthetic import FieldStream
from gpscale.data.writers import write_chunks, write_field

FORMATS = ["npy", "parquet", "csv", "csv.gz"]


def _stream(n=2500, d=4, chunk=1000):
    return FieldStream(n=n, num_dims=d, chunk_size=chunk, lengthscale=0.5, noise=0.04)


@pytest.mark.parametrize("ext", FORMATS)
def test_round_trip_equals_the_stream_bit_for_bit(tmp_path, ext):
    stream = _stream()
    written = write_chunks(tmp_path / f"t.{ext}", stream, num_rows=stream.n, num_dims=4)
    expect = torch.cat([torch.cat([x, y[:, None]], 1) for x, y in stream]).numpy()
    table = read_table(written.path)
    got = table.numeric(written.path, list(range(5)))
    np.testing.assert_array_equal(got, expect)  # text keeps every digit of a float64
    if ext != "npy":
        assert table.names == ["x0", "x1", "x2", "x3", "y"]
    assert written.num_rows == 2500
    assert written.y_var == pytest.approx(expect[:, -1].var(), rel=1e-9)
    assert not list(tmp_path.glob(".*partial"))


def test_an_interrupted_write_leaves_no_file(tmp_path):
    def chunks():
        yield from _stream(n=2000, chunk=1000)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_chunks(tmp_path / "t.parquet", chunks(), num_rows=3000, num_dims=4)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("rows, match", [(2000, "does not fit"), (3000, "not the 3000")])
def test_chunks_that_do_not_fit_the_announced_shape(tmp_path, rows, match):
    with pytest.raises(ValueError, match=match):
        write_chunks(tmp_path / "t.npy", _stream(n=2500), num_rows=rows, num_dims=4)
    assert list(tmp_path.iterdir()) == []


def test_the_noise_floor_is_the_rmse_of_the_noise_free_field(tmp_path):
    """Predicting f exactly gives a standardised test RMSE equal to the reported floor."""
    written = write_field(tmp_path / "f.npy", 200_000, num_dims=8, chunk_rows=50_000)
    data = np.load(written.path)
    stream = FieldStream(n=200_000, num_dims=8, chunk_size=50_000, lengthscale=0.5, noise=0.04)
    f = stream.latent(torch.from_numpy(data[:, :-1])).numpy()
    rmse = np.sqrt(np.mean((data[:, -1] - f) ** 2)) / data[:, -1].std()
    assert rmse == pytest.approx(written.noise_floor, rel=0.01)
    assert 0.2 < written.noise_floor < 0.26


def test_cli_synthesize_then_fit(tmp_path, capsys):
    path = tmp_path / "big.parquet"
    assert main(["datasets", "synthesize", "--rows", "3000", "--dims", "3", "--out",
                 str(path)]) == 0
    assert "noise floor" in capsys.readouterr().out
    assert main(["fit", "--data", str(path), "--target", "y", "--method", "svgp", "--epochs",
                 "1", "--no-progress", "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["datasets", "synthesize", "--rows", "3", "--out",
                 str(tmp_path / "f.xlsx")]) != 0
    assert "unknown file type" in capsys.readouterr().err
    assert not (tmp_path / "f.xlsx").exists()


def test_a_planted_symlink_at_the_old_temporary_name_is_not_followed(tmp_path):
    """Issue #46: `synthesize --out X` wrote `.X.partial`, a name anyone could plant a link
    at; the temporary file is now unpredictable and made with O_EXCL."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    for name in ("t.csv", "t.parquet", "t.npy"):
        (tmp_path / f".{name}.partial").symlink_to(victim)
        written = write_field(tmp_path / name, 50, num_dims=2)
        assert written.path.stat().st_size > 0 and not written.path.is_symlink()
    assert victim.read_text() == "keep"
