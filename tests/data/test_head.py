"""The first rows of a text file: header inference (numeric names too), decimal commas, and
numeric class labels compared as values (issue #46, findings 7, 8 and 12)."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpscale.data.csv import load_csv, read_table
from gpscale.data.head import decimal_comma, infer_header, quoted_cells
from gpscale.data.lines import canonical_labels, read_lines

RNG = np.random.default_rng(0)
X = RNG.uniform(size=(40, 3))
Y = np.sin(4 * X[:, 0]) + X[:, 1]


def _write(path, first: str | None, rows, fmt=repr, delimiter=","):
    lines = [first] if first is not None else []
    lines += [delimiter.join(fmt(float(v)) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _both(path, **kwargs):
    """The table as pyarrow reads it and as the line-by-line reader does."""
    return read_table(path, **kwargs), read_lines(path, **kwargs)


@pytest.mark.parametrize("first", ["10,20,30,40", "2010,2011,2012,2013", "-1,0,1,2"])
def test_integer_names_above_decimals_are_a_header(tmp_path, first, caplog):
    """Finding 7: ``10,20,30`` above decimal numbers is a header, in both readers, and the
    guess is logged as a warning naming the row."""
    path = _write(tmp_path / "d.csv", first, np.column_stack([X, Y]))
    with caplog.at_level(logging.WARNING, logger="gpscale.data"):
        for table in _both(path):
            assert table.names == first.split(",") and table.num_rows == 40
        data = load_csv(path, first.split(",")[-1])
    assert data.num_train + data.num_test == 40 and data.info["header"]
    assert f"the first row ({first.replace(',', ', ')}) is read as a header" in caplog.text
    assert "distinct integers above 4 columns of decimal numbers" in caplog.text


def test_an_integer_target_column_below_integer_names_is_no_evidence_against(tmp_path):
    rows = np.column_stack([X, RNG.integers(0, 5, 40)])
    path = tmp_path / "d.csv"
    path.write_text("1,2,3,4\n" + "\n".join(
        ",".join([*(repr(float(v)) for v in row[:3]), str(int(row[3]))]) for row in rows) + "\n")
    for table in _both(path):
        assert table.names == ["1", "2", "3", "4"] and table.num_rows == 40


@pytest.mark.parametrize("first, why", [
    ("0,1.5,2,3", "a decimal among the first row's cells"),
    ("1,1,2,3", "repeated integers are no header (names are distinct)"),
    ("0,3", None),  # a grid's origin above decimals in one column: data
])
def test_first_rows_of_numbers_that_stay_data(tmp_path, first, why, caplog):
    width = len(first.split(","))
    body = np.column_stack([X, Y])[:, :width]
    if first == "0,3":
        body = np.column_stack([X[:, 0], RNG.integers(0, 9, 40)])
    path = tmp_path / "d.csv"
    path.write_text(first + "\n" + "\n".join(
        ",".join(repr(float(v)) if j == 0 or first != "0,3" else str(int(v))
                 for j, v in enumerate(row)) for row in body) + "\n")
    with caplog.at_level(logging.INFO, logger="gpscale.data"):
        for table in _both(path):
            assert table.names is None and table.num_rows == 41, why
        read_table(path)
    assert "holds only numbers, so it is read as data" in caplog.text


def test_mixed_integers_and_decimals_below_mean_data():
    rows = [["1", "2"], ["0.5", "3"], ["1", "2.5"], ["0.25", "4.5"]]
    assert infer_header(rows) == (False, "the first row (1, 2) holds only numbers, so it is "
                                         "read as data")


def test_quoted_numbers_above_unquoted_ones_are_a_header(tmp_path, caplog):
    """R's write.csv quotes the names: ``"1","2","3"`` above numbers is a header."""
    path = _write(tmp_path / "q.csv", '"1","2","3","4"', np.column_stack([X, Y]))
    with caplog.at_level(logging.WARNING, logger="gpscale.data"):
        for table in _both(path):
            assert table.names == ["1", "2", "3", "4"] and table.num_rows == 40
        read_table(path)
    assert "its cells are quoted above unquoted numbers" in caplog.text
    every = tmp_path / "all.csv"  # a writer that quotes every cell: no evidence
    every.write_text('"1.5","2.5"\n"0.5","1.25"\n"2.5","3.75"\n')
    for table in _both(every):
        assert table.names is None and table.num_rows == 3


def test_quoted_cells_reads_the_quotes_or_declines():
    text = '"a",1\n"b,c",2\n"x\ny",3\n'
    rows = [["a", "1"], ["b,c", "2"]]
    assert quoted_cells(text, ",", rows[:1], [1]) == [[True, False]]
    assert quoted_cells(text, ",", rows, [1, 2]) is None  # a delimiter inside quotes
    assert quoted_cells(text, ",", [["x\ny", "3"]], [4]) is None  # a row over two lines


def test_a_target_name_without_header_says_why(tmp_path):
    path = _write(tmp_path / "d.csv", None, np.column_stack([X, Y]))
    with pytest.raises(ValueError, match=r"no header row: the first row \(0\.63.* holds only "
                                         r"numbers, so it is read as data; pass an integer"):
        load_csv(path, "y")


@pytest.mark.parametrize("delimiter", [";", "\t"])
def test_decimal_commas_are_named(tmp_path, delimiter):
    """Finding 12: ``a;b;c;y`` above ``1,5``-style numbers is refused as decimal commas, not
    as a file without header."""
    path = _write(tmp_path / "d.csv", delimiter.join("abcy"), np.column_stack([X, Y]),
                  fmt=lambda v: f"{v:.4f}".replace(".", ","), delimiter=delimiter)
    first = f"{X[0, 0]:.4f}".replace(".", ",")
    for read in (read_table, read_lines):
        with pytest.raises(ValueError, match=rf"uses decimal commas \('{first}' on line 2, "
                                             r"column 'a'\); gpscale reads '\.' as the decimal "
                                             r"point: write the numbers with decimal points"):
            read(path)
    with pytest.raises(ValueError, match="decimal commas"):
        load_csv(path, "y")


def test_decimal_comma_needs_a_column_of_numbers():
    assert decimal_comma([["a", "b"], ["1,5", "2"], ["2", "x"]]) == (1, 0)
    assert decimal_comma([["a", "b"], ["1,5", "2"], ["cat", "3"]]) is None  # text labels
    assert decimal_comma([["1.234,5", "2"], ["3", "4"]]) == (0, 0)
    assert decimal_comma([["1.5", "2"], ["3", "4"]]) is None


def test_numeric_labels_are_compared_as_values(tmp_path):
    """Finding 8: ``1`` and ``1.0`` are one class, named ``1``, in every reader (a label with a
    fractional part is no class label: ``validation.check_class_labels``)."""
    labels = ["1", "1.0", "0", "0.0", "+1", "1e0", "2.00", "2"] * 5
    path = tmp_path / "c.csv"
    path.write_text("a,b,y\n" + "\n".join(f"{X[i, 0]:.17g},{X[i, 1]:.17g},{lab}"
                                         for i, lab in enumerate(labels)) + "\n")
    data = load_csv(path, "y", task="classification")
    assert data.info["classes"] == ["0", "1", "2"] and data.num_classes == 3
    y, classes = read_lines(path).targets(path, 2, "classification")
    assert classes == ["0", "1", "2"]
    assert y.tolist() == [{"0": 0, "1": 1, "2": 2}[canonical_labels([v])[v]] for v in labels]
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"a": X[:40, 0], "y": labels}), parquet)
    assert load_csv(parquet, "y", task="classification").info["classes"] == ["0", "1", "2"]


def test_text_labels_stay_text_and_nan_labels_are_refused(tmp_path):
    assert canonical_labels(["1", "1.0", "cat"]) == {"1": "1", "1.0": "1.0", "cat": "cat"}
    assert canonical_labels(["12345678901234567890", "12345678901234567891.0"]) == {
        "12345678901234567890": "12345678901234567890",
        "12345678901234567891.0": "12345678901234567891"}
    path = tmp_path / "n.csv"
    path.write_text("a,y\n" + "\n".join(f"{i}.5,{'nan' if i == 3 else i % 2}"
                                        for i in range(10)) + "\n")
    with pytest.raises(ValueError, match="target column 'y' holds NaN or inf on line 5"):
        load_csv(path, "y", task="classification")
