"""load_csv: target by name or index, header inference, labels, errors."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from gpscale.data.csv import load_csv
from gpscale.data.splits import random_split

ROWS = np.array([[float(i), float(i % 7), 2.0 * i + 1, float(i * i % 5)] for i in range(40)])


def _write(path, rows, header=None, delimiter=","):
    lines = [delimiter.join(header)] if header else []
    lines += [delimiter.join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_target_by_name_matches_hand_standardisation(tmp_path):
    """The split is random_split(n, 0.1, seed); x and y use training mean/std only."""
    path = _write(tmp_path / "d.csv", ROWS, header=["a", "b", "price", "c"])
    data = load_csv(path, "price", seed=4)
    assert data.info["target"] == "price" and data.info["columns"] == ["a", "b", "c"]
    assert (data.num_train, data.num_test, data.num_dims) == (36, 4, 3)
    train, test = (idx.numpy() for idx in random_split(40, 0.1, 4))
    x, y = ROWS[:, [0, 1, 3]], ROWS[:, 2]
    mean, std = x[train].mean(0), x[train].std(0)
    torch.testing.assert_close(data.x_train, torch.from_numpy((x[train] - mean) / std))
    torch.testing.assert_close(data.x_test, torch.from_numpy((x[test] - mean) / std))
    torch.testing.assert_close(data.y_test,
                               torch.from_numpy((y[test] - y[train].mean()) / y[train].std()))


def test_name_and_index_give_the_same_data(tmp_path):
    with_header = load_csv(_write(tmp_path / "h.csv", ROWS, header=["a", "b", "t", "c"]), "t")
    no_header = load_csv(_write(tmp_path / "n.csv", ROWS), 2, header=None)
    inferred = load_csv(tmp_path / "n.csv", -2)
    digits = load_csv(tmp_path / "n.csv", "2")
    for other in (no_header, inferred, digits):
        torch.testing.assert_close(other.x_train, with_header.x_train, rtol=0, atol=0)
        torch.testing.assert_close(other.y_test, with_header.y_test, rtol=0, atol=0)
    assert inferred.num_train + inferred.num_test == 40


def test_gzip_and_delimiter(tmp_path):
    path = tmp_path / "d.tsv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join("\t".join(str(v) for v in row) for row in ROWS) + "\n")
    data = load_csv(path, -1, delimiter="\t")
    assert data.num_train + data.num_test == 40 and data.num_dims == 3
    assert data.name == "d"


def test_classification_labels_map_to_codes(tmp_path):
    labels = ["cat", "dog", "ant"] * 10
    path = tmp_path / "c.csv"
    path.write_text("\n".join(f"{i},{i % 4},{lab}" for i, lab in enumerate(labels)) + "\n")
    data = load_csv(path, -1, task="classification")
    assert data.info["classes"] == ["ant", "cat", "dog"]
    assert data.num_classes == 3 and data.y_train.dtype == torch.int64
    assert data.num_train + data.num_test == 30  # first row is data, not a header
    assert torch.bincount(torch.cat([data.y_train, data.y_test])).tolist() == [10, 10, 10]


def test_numeric_labels_sort_numerically(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("x,label\n" + "\n".join(f"{i},{[10, 2, 3][i % 3]}" for i in range(30)))
    data = load_csv(path, "label", task="classification")
    assert data.info["classes"] == ["2", "3", "10"]


def test_counts_stay_unstandardised(tmp_path):
    rows = np.array([[float(i), float(i % 3)] for i in range(20)])
    data = load_csv(_write(tmp_path / "k.csv", rows), 1, task="counts")
    assert set(torch.cat([data.y_train, data.y_test]).tolist()) == {0.0, 1.0, 2.0}
    assert data.transform.y_std == 1.0
    bad = _write(tmp_path / "neg.csv", np.array([[0.0, -1.0], [1.0, 2.0], [2.0, 0.0]]))
    with pytest.raises(ValueError, match="non-negative integers"):
        load_csv(bad, 1, task="counts")


@pytest.mark.parametrize(
    ("target", "header", "match"),
    [("missing", ["a", "b", "t", "c"], "target column 'missing' not found; columns: a, b, t, c"),
     ("t", None, "no header row"),
     (4, None, r"out of range for 4 columns \(valid: -4\.\.3\)")],
    ids=["missing-name", "name-without-header", "index-out-of-range"],
)
def test_target_errors(tmp_path, target, header, match):
    path = _write(tmp_path / "d.csv", ROWS, header=header)
    with pytest.raises(ValueError, match=match):
        load_csv(path, target)


def test_non_numeric_input_and_unknown_task(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("1,2,3\n4,x,6\n7,8,9\n")
    with pytest.raises(ValueError, match="input columns must be numeric"):
        load_csv(path, -1)
    with pytest.raises(ValueError, match="unknown task 'ranking'"):
        load_csv(path, -1, task="ranking")


def test_split_is_seeded(tmp_path):
    path = _write(tmp_path / "d.csv", ROWS)
    a, b, c = load_csv(path, -1, seed=1), load_csv(path, -1, seed=1), load_csv(path, -1, seed=2)
    torch.testing.assert_close(a.y_test, b.y_test, rtol=0, atol=0)
    assert not torch.equal(a.y_test, c.y_test)
    assert a.info["seed"] == 1
