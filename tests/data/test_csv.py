"""load_csv: target by name or index, header inference, labels, errors."""

from __future__ import annotations

import gzip
import warnings

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


# -- malformed files: a ValueError naming the file, the line and the column ------------------------

def _lines(path, *lines):
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("part", ["train", "test"])
def test_nonfinite_target_is_rejected_in_either_split(tmp_path, part):
    train, test = random_split(40, 0.1, 0)
    row = int((train if part == "train" else test)[0])
    rows = ROWS.astype(object)
    rows[row, 2] = "inf"
    path = _write(tmp_path / "d.csv", rows, header=["a", "b", "price", "c"])
    with pytest.raises(ValueError, match=rf"d.csv: the target column 'price' holds NaN or inf "
                                         rf"on line {row + 2}; remove") as err:
        load_csv(path, "price")
    assert "standardize" not in str(err.value)


def test_nonfinite_and_missing_inputs_name_line_and_column(tmp_path):
    path = _lines(tmp_path / "d.csv", "a,b,y", "1,2,3", "4,nan,6", "7,8,9", "1,inf,2")
    with pytest.raises(ValueError, match="column 'b' holds NaN or inf on lines 3, 5"):
        load_csv(path, "y")
    path = _lines(tmp_path / "e.csv", "a,b,y", "1,2,3", "4,,6", "7,8,9")
    with pytest.raises(ValueError, match="line 3, column 'b': empty value"):
        load_csv(path, "y")
    path = _lines(tmp_path / "f.csv", "1;2,5;3", "4;5,5;6", "7;8;9")
    with pytest.raises(ValueError, match=r"uses decimal commas \('2,5' on line 1, column 1\); "
                                         r"gpscale reads '\.' as the decimal point"):
        load_csv(path, -1)


def test_header_only_and_single_row_files(tmp_path):
    with pytest.raises(ValueError, match="h.csv has a header row but no data rows"):
        load_csv(_lines(tmp_path / "h.csv", "a,b,y"), "y")
    with pytest.raises(ValueError, match="has 1 data row; at least 2"):
        load_csv(_lines(tmp_path / "one.csv", "a,b,y", "1,2,3"), "y")
    with pytest.raises(ValueError, match="is empty"):
        load_csv(_lines(tmp_path / "blank.csv", "", "  ", ""), -1)


@pytest.mark.parametrize("target", ["a", "y", 0])
def test_duplicate_column_names_are_an_error(tmp_path, target):
    path = _write(tmp_path / "d.csv", ROWS, header=["a", "b", "a", "y"])
    with pytest.raises(ValueError, match=r"duplicate column names in the header: 'a' "
                                         r"\(columns 1, 3\)"):
        load_csv(path, target)


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_delimiter_is_sniffed(tmp_path, delimiter):
    want = load_csv(_write(tmp_path / "c.csv", ROWS, header=["a", "b", "t", "c"]), "t")
    got = load_csv(_write(tmp_path / "o.csv", ROWS, header=["a", "b", "t", "c"],
                          delimiter=delimiter), "t")
    assert got.info["columns"] == ["a", "b", "c"]
    torch.testing.assert_close(got.x_train, want.x_train, rtol=0, atol=0)
    torch.testing.assert_close(got.y_test, want.y_test, rtol=0, atol=0)


def test_a_wrong_explicit_delimiter_is_named(tmp_path):
    path = _write(tmp_path / "s.csv", ROWS, header=["a", "b", "t", "c"], delimiter=";")
    with pytest.raises(ValueError, match="looks semicolon-separated"):
        load_csv(path, "t", delimiter=",")


def test_ragged_rows_name_the_line(tmp_path):
    path = _lines(tmp_path / "r.csv", "a,b,y", "1,2,3", "4,5", "7,8,9")
    with pytest.raises(ValueError, match="r.csv: line 3 has 2 fields, line 1 has 3"):
        load_csv(path, "y")


def test_undecodable_and_bad_gzip_files(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("a,b,y\n1,2,3\n4,5,6\n\xe9,1,2\n".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text .byte 0xe9 on line 4"):
        load_csv(path, "y")
    fake = tmp_path / "fake.csv.gz"
    fake.write_text("a,b,y\n1,2,3\n")
    with pytest.raises(ValueError, match="is not a readable gzip file"):
        load_csv(fake, "y")
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfa,y\n1,2\n2,3\n3,5\n")
    assert load_csv(bom, "y").info["columns"] == ["a"]


def test_counts_error_names_the_line(tmp_path):
    path = _lines(tmp_path / "k.csv", "a,k", "1,2", "2,1.5", "3,0")
    with pytest.raises(ValueError, match="non-negative integers; the target column 'k' holds "
                                         "'1.5' on line 3"):
        load_csv(path, "k", task="counts")


def test_label_like_regression_target_warns(tmp_path):
    """A regression target of few distinct integers (0/1 labels) warns and names the task to
    pass; class labels loaded as classification, and a continuous target, do not warn."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 2))
    labels = (x[:, 0] > 0).astype(int)
    path = _write(tmp_path / "l.csv", [[a, b, c] for (a, b), c in zip(x, labels, strict=True)],
                  header=["a", "b", "label"])
    with pytest.warns(UserWarning, match=r"'label' holds only 2 distinct integer values "
                                         r"\(0, 1\).*--task classification"):
        data = load_csv(path, "label")
    assert data.task == "regression"  # still loaded as asked
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_csv(path, "label", task="classification").num_classes == 2
        smooth = _write(tmp_path / "s.csv", [[a, b, a + 0.5 * b] for a, b in x],
                        header=["a", "b", "y"])
        load_csv(smooth, "y")
        many = _write(tmp_path / "m.csv", [[a, b, i % 25] for i, (a, b) in enumerate(x)],
                      header=["a", "b", "y"])
        load_csv(many, "y")  # 25 distinct integers: more than LABEL_LIKE_MAX
