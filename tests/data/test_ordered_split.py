"""A forecast's split of a data file of the user's own: the last rows, in file order, are the
test set (``--data-option split=last``)."""

from __future__ import annotations

import pytest
import torch

from gpscale.data import load_csv
from gpscale.data.splits import ordered_split


def test_the_last_rows_are_the_test_set(tmp_path):
    rows = ["t,y"] + [f"{i},{(i * 7) % 11}" for i in range(50)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    data = load_csv(tmp_path / "d.csv", "y", test_fraction=0.2, split="last",
                    standardize_x=False)
    assert data.num_train == 40 and data.num_test == 10
    t_test = data.x_test[:, 0]
    assert torch.equal(t_test, torch.arange(40, 50, dtype=t_test.dtype))  # in file order
    assert float(data.x_train.max()) == 39.0


def test_sizes_match_the_random_split_and_bad_values_are_named(tmp_path):
    train, test = ordered_split(2225, 0.2)
    assert len(train) == 1780 and len(test) == 445 and int(test[0]) == 1780
    (tmp_path / "d.csv").write_text("a,y\n1,2\n3,4\n5,6\n")
    with pytest.raises(ValueError, match="split must be one of random, last"):
        load_csv(tmp_path / "d.csv", "y", split="first")


def test_the_data_option_is_checked():
    from gpscale.data.options import check_file_options

    assert check_file_options("d.csv", {"split": "last"}) == {"split": "last"}
    with pytest.raises(ValueError, match="expected random or last"):
        check_file_options("d.csv", {"split": "end"})


def test_a_dates_column_reads_as_decimal_years(tmp_path):
    (tmp_path / "d.csv").write_text("date,y\n19580101,1\n19580702,2\n19590101,3\n20000301,4\n")
    data = load_csv(tmp_path / "d.csv", "y", test_fraction=0.25, split="last", dates="date",
                    standardize_x=False)
    years = torch.cat([data.x_train[:, 0], data.x_test[:, 0]]).tolist()
    assert years == pytest.approx([1958.0, 1958.5, 1959.0, 2000 + 60 / 366])
    (tmp_path / "bad.csv").write_text("date,y\n19580101,1\n19581301,2\n19590101,3\n")
    with pytest.raises(ValueError, match=r"row 1 \(0-based\) holds 19581301, not a valid date"):
        load_csv(tmp_path / "bad.csv", "y", dates="date")
    with pytest.raises(ValueError, match="is the target"):
        load_csv(tmp_path / "bad.csv", "y", dates="y")
