"""The gpscale command line: fit, predict, datasets, methods, bench, demo and its errors."""

from __future__ import annotations

import csv
import gzip
import json

import numpy as np
import pytest

from gpscale.cli.__main__ import main


def _fit(tmp_path, *extra, dataset="yacht", method="exact", epochs="4", name="run"):
    out = tmp_path / name
    code = main(["fit", "--dataset", dataset, "--method", method, "--epochs", epochs,
                 "--out", str(out), "--no-progress", *extra])
    return code, out


def test_fit_writes_metrics_history_and_model(tmp_path, data_root, capsys):
    code, out = _fit(tmp_path)
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("test_rmse", "test_nll", "train_time_s", "epochs"):
        assert key in metrics
    assert metrics["epochs"] == 4 and metrics["n_train"] + metrics["n_test"] == 308
    rows = list(csv.DictReader(open(out / "history.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    assert (out / "model.pt").exists()
    assert json.loads(capsys.readouterr().out)["test_rmse"] == metrics["test_rmse"]


def test_predict_on_raw_rows_reproduces_test_rmse(tmp_path, data_root):
    """Raw split-0 test rows through `gpscale predict` give the RMSE that fit reported."""
    code, out = _fit(tmp_path)
    raw = np.loadtxt(gzip.open(data_root / "uci/yacht/data.csv.gz"), delimiter=",")
    mask = np.loadtxt(gzip.open(data_root / "uci/yacht/test_mask.csv.gz"), delimiter=",")
    test = raw[mask[:, 0] == 1]
    train_y = raw[mask[:, 0] == 0, -1]
    path = tmp_path / "rows.csv"
    np.savetxt(path, test, delimiter=",")
    assert main(["predict", "--model", str(out / "model.pt"), "--data", str(path),
                 "--target", "-1", "--out", str(tmp_path / "pred.csv")]) == 0
    pred = np.array([float(r["mean"]) for r in csv.DictReader(open(tmp_path / "pred.csv"))])
    rmse_std = np.sqrt(np.mean((pred - test[:, -1]) ** 2)) / train_y.std(ddof=1)
    reported = json.loads((out / "metrics.json").read_text())["test_rmse"]
    assert rmse_std == pytest.approx(reported, rel=1e-2)


def test_fit_on_user_csv(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(80, 2))
    path = tmp_path / "mine.csv"
    with open(path, "w") as f:
        f.write("a,b,price\n")
        for row in x:
            f.write(f"{row[0]},{row[1]},{np.sin(4 * row[0]) + row[1]}\n")
    out = tmp_path / "csvrun"
    assert main(["fit", "--data", str(path), "--target", "price", "--method", "exact",
                 "--epochs", "20", "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_dims"] == 2 and metrics["test_rmse"] < 0.5


@pytest.mark.parametrize("argv, match", [
    (["fit", "--dataset", "nosuchset", "--method", "exact"], "valid"),
    (["fit", "--dataset", "yacht", "--method", "nosuchmethod"], "valid methods"),
    (["bench", "nosuchsuite"], "valid suites"),
], ids=["dataset", "method", "suite"])
def test_unknown_names_list_valid_ones(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_checkpoint_resume_matches_uninterrupted_run(tmp_path, data_root):
    """A run stopped early (time budget) and resumed ends where an uninterrupted run ends."""
    ckpt = tmp_path / "ck.pt"
    _, part = _fit(tmp_path, "--checkpoint", str(ckpt), "--max-time", "1e-6", epochs="6",
                   name="part")
    assert json.loads((part / "metrics.json").read_text())["epochs"] == 1
    _, resumed = _fit(tmp_path, "--checkpoint", str(ckpt), epochs="6", name="resumed")
    _, straight = _fit(tmp_path, epochs="6", name="straight")
    got = json.loads((resumed / "metrics.json").read_text())
    want = json.loads((straight / "metrics.json").read_text())
    # the same epochs and stop (a steady plateau may end both before the 6th: the plateau
    # test's window travels in the checkpoint)
    assert got["epochs"] == want["epochs"] > 1 and got["stopped"] == want["stopped"]
    assert got["test_nll"] == pytest.approx(want["test_nll"], rel=1e-9)


def test_datasets_lists_presence(data_root, capsys):
    assert main(["datasets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    yacht = next(line for line in lines if line.startswith("yacht"))
    assert "308" in yacht and " yes " in yacht
    mixture = next(line for line in lines if line.startswith("gmm10"))
    assert mixture.startswith("gmm10, mixture ") and "generated" in mixture  # aliases listed


def test_methods_lists_baselines(capsys):
    assert main(["methods"]) == 0
    keys = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"exact", "cggp", "sgpr", "svgp"} <= set(keys)


@pytest.mark.slow
def test_demo_quick(tmp_path, capsys):
    """The demo in quick mode prints a row per run (1-D regression subset, GGP on the 2-D
    field, IterNCGP on 2-D binary data) with sensible metrics, and writes the panel grid."""
    from gpscale.cli.demo import QUICK_METHODS

    assert main(["demo", "--quick", "--out", str(tmp_path / "demo")]) == 0
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    header = rows.pop("method")
    col = {name: header.index(name) for name in ("data", "test_rmse", "test_accuracy")}
    for key in QUICK_METHODS:  # y has std ≈ 0.75: predicting its mean gives RMSE ≈ 0.75
        assert rows[key][col["data"]] == "1-D"
        assert 0 < float(rows[key][col["test_rmse"]]) < 0.7, rows[key]
    assert rows["ggp"][col["data"]] == "2-D field" and float(rows["ggp"][col["test_rmse"]]) < 1
    assert float(rows["iterncgp"][col["test_accuracy"]]) > 0.7
    assert (tmp_path / "demo" / "demo.png").stat().st_size > 10_000


def test_datasets_download_from_a_mirror(tmp_path, data_root, capsys):
    """`datasets download` fetches and verifies the files (file:// mirror) into the cache."""
    cache = tmp_path / "cache"
    mirror = (data_root / "uci" / "yacht").resolve().as_uri()
    assert main(["datasets", "download", "yacht", "--cache-dir", str(cache),
                 "--base-url", mirror]) == 0
    for name in ("data.csv.gz", "test_mask.csv.gz"):
        got = (cache / "uci" / "yacht" / name).read_bytes()
        assert got == (data_root / "uci" / "yacht" / name).read_bytes()
    assert "downloaded" in capsys.readouterr().out


def test_datasets_download_checksum_failure(tmp_path, data_root, capsys):
    """A mirror serving other bytes fails the checksum; nothing is left in the cache."""
    cache, mirror = tmp_path / "cache", tmp_path / "mirror"
    mirror.mkdir()
    for name in ("data.csv.gz", "test_mask.csv.gz"):
        (mirror / name).write_bytes((data_root / "uci" / "housing" / name).read_bytes())
    assert main(["datasets", "download", "yacht", "--cache-dir", str(cache),
                 "--base-url", mirror.as_uri()]) == 2
    assert "sha256 mismatch" in capsys.readouterr().err
    assert not any(p.is_file() for p in cache.rglob("*"))


# Bounds: a constant rate scores NLL 11.5 on poisson1d; chance accuracy on binary2d is 0.5.
@pytest.mark.parametrize("dataset, metric, low, high", [("poisson1d", "test_nll", 0.0, 1.5),
                                                        ("binary2d", "test_accuracy", 0.75, 1.0)])
def test_fit_iterncgp_on_counts_and_classes_without_flags(tmp_path, dataset, metric, low, high):
    """`gpscale fit --method iterncgp` learns its kernel in rounds on counts or classes (the
    default since issue #21); with ``-o learn_kernel=false`` it conditions once."""
    for learn in (True, False):
        out = tmp_path / f"{dataset}-{learn}"
        extra = [] if learn else ["-o", "learn_kernel=false"]
        assert main(["fit", "--dataset", dataset, "--method", "iterncgp", "--out", str(out),
                     "--no-progress", *extra]) == 0
        metrics = json.loads((out / "metrics.json").read_text())
        if learn:
            assert metrics["stopped"] in ("converged", "no-improvement", "epochs", "time")
            assert metrics["epochs"] >= 1
        else:
            assert metrics["stopped"] == "conditioned" and metrics["epochs"] == 1
        assert low < metrics[metric] < high, (learn, metrics)
        assert (out / "model.pt").exists()


@pytest.mark.parametrize("method", ["svgp", "softki"])
def test_model_without_data_dependence_is_saved_without_the_training_set(tmp_path, data_root,
                                                                        method):
    """SVGP's model.pt carries no training data (its predictive needs none), SoftKI's its
    m-sized posterior instead; each predicts the raw test rows with the RMSE fit reported. The
    exact GP's carries the data it conditions on."""
    from gpscale.io import load_with_data

    code, out = _fit(tmp_path, method=method, epochs="3", name=method)
    assert code == 0
    saved = load_with_data(out / "model.pt")
    assert saved.data is None
    assert (saved.summary is None) == (method == "svgp")
    code, out_exact = _fit(tmp_path, name="exact")
    assert load_with_data(out_exact / "model.pt").data is not None
    raw = np.loadtxt(gzip.open(data_root / "uci/yacht/data.csv.gz"), delimiter=",")
    mask = np.loadtxt(gzip.open(data_root / "uci/yacht/test_mask.csv.gz"), delimiter=",")
    test, train_y = raw[mask[:, 0] == 1], raw[mask[:, 0] == 0, -1]
    path = tmp_path / "rows.csv"
    np.savetxt(path, test, delimiter=",")
    assert main(["predict", "--model", str(out / "model.pt"), "--data", str(path),
                 "--target", "-1", "--out", str(tmp_path / "pred.csv")]) == 0
    pred = np.array([float(r["mean"]) for r in csv.DictReader(open(tmp_path / "pred.csv"))])
    rmse_std = np.sqrt(np.mean((pred - test[:, -1]) ** 2)) / train_y.std(ddof=1)
    reported = json.loads((out / "metrics.json").read_text())["test_rmse"]
    assert rmse_std == pytest.approx(reported, rel=1e-2)


def test_predict_streams_chunks_equal_to_one_pass(tmp_path, data_root, capsys):
    """`gpscale predict` writes chunk by chunk; the rows equal predict_csv's single table."""
    from gpscale.cli import predict as predict_module

    code, out = _fit(tmp_path, method="softki", epochs="2")
    raw = np.loadtxt(gzip.open(data_root / "uci/yacht/data.csv.gz"), delimiter=",")
    path = tmp_path / "rows.csv"
    np.savetxt(path, raw, delimiter=",")
    whole = predict_module.predict_csv(out / "model.pt", path, target="-1")
    parts = list(predict_module.predict_csv_chunks(out / "model.pt", path, target="-1",
                                                   chunk_rows=50))
    assert [len(p) for p in parts] == [50] * 6 + [8]
    joined = predict_module.PredictionTable.concat(parts)
    for column in ("mean", "std"):  # float32 products may round differently per chunk size
        np.testing.assert_allclose(joined.columns[column], whole.columns[column], rtol=1e-5)
    capsys.readouterr()  # fit's metrics
    assert main(["predict", "--model", str(out / "model.pt"), "--data", str(path),
                 "--target", "-1"]) == 0
    assert capsys.readouterr().out.replace("\r\n", "\n") == whole.to_csv().replace("\r\n", "\n")


def test_predict_that_fails_midway_leaves_no_output_file(tmp_path, data_root, monkeypatch):
    """A failure after the first chunk (here: injected) leaves neither a partial --out file nor
    a temporary one; an existing file of that name keeps its content."""
    from gpscale.cli import predict as predict_module

    code, out = _fit(tmp_path, method="svgp", epochs="1")
    raw = np.loadtxt(gzip.open(data_root / "uci/yacht/data.csv.gz"), delimiter=",")
    path = tmp_path / "rows.csv"
    np.savetxt(path, raw, delimiter=",")
    real = predict_module.predict_csv_chunks

    def failing(*args, **kwargs):
        chunks = real(*args, **kwargs, chunk_rows=50)
        yield next(chunks)
        raise RuntimeError("disk full")

    monkeypatch.setattr(predict_module, "predict_csv_chunks", failing)
    target = tmp_path / "pred.csv"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="disk full"):
        main(["predict", "--model", str(out / "model.pt"), "--data", str(path),
              "--target", "-1", "--out", str(target)])
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.csv", "rows.csv", "run"]


def test_memory_exhausted_outside_training_gives_no_training_advice(monkeypatch, capsys):
    """A MemoryError while a command reads its inputs (a process memory limit, say) exits 4 with
    one line about the process's memory, not advice on batch sizes that played no part."""
    from gpscale.cli import __main__ as cli

    def reads_too_much(args):
        raise MemoryError()

    monkeypatch.setitem(cli.COMMANDS, "predict", reads_too_much)
    assert main(["predict", "--model", "m.pt", "--data", "x.csv"]) == 4
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpscale predict: error: out of memory in gpscale predict (MemoryError)")
    assert "limit" in err and "--batch-size" not in err and "\n" not in err
