"""Data-set options are checked by their declaration before a loader runs (issue #46, finding 9):
``n=-5`` and ``bogus=1`` are clear errors, not a silent other split or a TypeError."""

from __future__ import annotations

import inspect

import pytest

from gpscale.data import DATASETS, load_dataset
from gpscale.data.options import DataOption, check_data_options


@pytest.mark.parametrize("given, match", [
    ({"bogus": 1}, r"unknown data option 'bogus' for data set 'sine'; valid options: "
                   r"num_train \(int ≥ 2: training points\); num_test .*; noise .*; n "
                   r"\(= num_train\)"),
    ({"n": -5}, r"option n=-5 is invalid: must be ≥ 2 \(num_train: int ≥ 2, training points\)"),
    ({"num_test": 0}, r"num_test=0 is invalid: must be ≥ 1"),
    ({"n": 1e4}, r"n=10000.0 is invalid: expected an integer"),
    ({"n": True}, r"n=True is invalid: expected an integer"),
    ({"noise": -1}, r"noise=-1 is invalid: must be ≥ 0"),
    ({"noise": float("nan")}, r"noise=nan is invalid: expected a finite number"),
    ({"n": 10, "num_train": 10}, r"n and num_train are the same option"),
])
def test_bad_options_name_the_option_and_the_valid_ones(given, match):
    with pytest.raises(ValueError, match=match):
        load_dataset("sine", **given)


def test_options_are_typed_and_applied():
    data = load_dataset("sine", n=30, num_test="7", noise=0)
    assert (data.num_train, data.num_test) == (30, 7)
    data = load_dataset("binary2d", n=20, num_test=10, bounds=[[0, 1], [2, 3]])
    assert data.num_dims == 2 and float(data.x_train[:, 1].min()) >= 2
    with pytest.raises(ValueError, match=r"bounds=\[\[1, 0\]\] is invalid: each pair needs"):
        load_dataset("binary1d", bounds=[[1, 0]])
    with pytest.raises(ValueError, match=r"gap=5 is invalid: expected \[low, high\]"):
        load_dataset("synthetic", gap=5)


def test_a_set_without_options_says_so(tmp_path):
    with pytest.raises(ValueError, match="unknown data option 'n' for data set 'yacht'; it "
                                         "takes no options"):
        load_dataset("yacht", roots=[tmp_path], n=10)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_declared_option_is_a_loader_keyword(name):
    """Each declared option reaches a keyword of the loader or its generator."""
    entry = DATASETS[name]
    closure = inspect.getclosurevars(entry.loader).nonlocals
    target = closure.get("generate", entry.loader)
    params = set(inspect.signature(target).parameters)
    if "options" in params:  # field_dataset passes **options on to FieldStream
        from gpscale.data.synthetic import FieldStream
        params |= set(inspect.signature(FieldStream).parameters)
    for option in entry.options:
        assert option.name in params, (name, option.name)


def test_check_data_options_directly():
    declared = (DataOption("num_train", "int", "points", minimum=2),)
    assert check_data_options("x", declared, {"n": "12"}) == {"num_train": 12}
    with pytest.raises(ValueError, match="unknown data option"):
        check_data_options("x", declared, {"num_test": 1})
    with pytest.raises(ValueError, match=r"unknown data option 'seed' .*arguments of their "
                                         r"own: --split, --seed"):
        check_data_options("sine", DATASETS["sine"].options, {"seed": 3})

