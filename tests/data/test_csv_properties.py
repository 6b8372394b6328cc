"""Property tests of the CSV readers: any text gives a clear ValueError or a correct result,
never another exception type (issue #19)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpscale.cli.predict import read_features
from gpscale.data.csv import load_csv, read_table
from gpscale.data.splits import random_split

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

# Characters that matter to a CSV reader, plus a few that do not belong in one.
ALPHABET = st.sampled_from(list("0123456789.-+eE,;\t|\n\r \"'abcnifxy_") + ["\x00", "é", "∞"])
TEXT = st.text(ALPHABET, max_size=200)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("csv_properties")


def _file(folder, name: str, content: str | bytes):
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


@SETTINGS
@given(text=TEXT, target=st.sampled_from([-1, 0, 1, "y", "a"]),
       task=st.sampled_from(["regression", "classification", "counts"]))
def test_random_text_loads_or_raises_value_error(folder, text, target, task):
    path = _file(folder, "random.csv", text)
    try:
        data = load_csv(path, target, task=task)
    except ValueError as err:
        assert str(err) and "\n" not in str(err).strip()
        return
    for t in (data.x_train, data.x_test):
        assert bool(torch.isfinite(t).all())
    if task != "classification":
        assert bool(torch.isfinite(torch.cat([data.y_train, data.y_test])).all())
    rows = [line for line in text.replace("\r", "\n").split("\n") if line.strip()]
    assert data.num_train + data.num_test <= len(rows)


@SETTINGS
@given(raw=st.binary(max_size=200), gz=st.booleans())
def test_random_bytes_load_or_raise_value_error(folder, raw, gz):
    path = _file(folder, "bytes.csv.gz" if gz else "bytes.csv", raw)
    with pytest.raises(ValueError):
        load_csv(path, -1)
        raise ValueError("loaded")  # a correct load is fine too


@SETTINGS
@given(text=TEXT, names=st.sampled_from([None, ["a", "b"], ["x0", "x1"]]),
       target=st.sampled_from([None, "y", "-1", "a"]))
def test_random_text_at_predict_time(folder, text, names, target):
    path = _file(folder, "predict.csv", text)
    try:
        x = read_features(path, target, feature_names=names, num_features=2,
                          train_target="y", train_target_index=2)
    except ValueError as err:
        assert str(err)
        return
    assert x.ndim == 2 and x.shape[1] == 2 and np.isfinite(x).all()


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False,
                   allow_subnormal=False)


@st.composite
def tables(draw):
    n = draw(st.integers(3, 30))
    d = draw(st.integers(1, 4))
    values = draw(st.lists(st.lists(finite, min_size=d + 1, max_size=d + 1), min_size=n,
                           max_size=n))
    header = draw(st.booleans())
    delimiter = draw(st.sampled_from([",", ";", "\t", "|"]))
    spaces = draw(st.booleans())
    return np.array(values), header, delimiter, spaces


@SETTINGS
@given(table=tables(), seed=st.integers(0, 3))
def test_well_formed_tables_load_exactly(folder, table, seed):
    """Any numeric table, in any delimiter, with or without header, loads to its values."""
    values, header, delimiter, spaces = table
    n, width = values.shape
    names = [f"col{j}" for j in range(width - 1)] + ["target"]
    sep = f"{delimiter} " if spaces and delimiter != "\t" else delimiter
    lines = [sep.join(names)] if header else []
    lines += [sep.join(repr(float(v)) for v in row) for row in values]
    path = _file(folder, "table.csv", "\n".join(lines) + "\n")
    x, y = values[:, :-1], values[:, -1]
    train, test = (idx.numpy() for idx in random_split(n, 0.1, seed))
    # constant: every value equal (a spread of 1e-177, whose square underflows, is not)
    # or spread by less than the smallest normal float64, no scale to standardise by
    tiny = np.finfo(np.float64).tiny
    diff = x[train] - x[train][0]  # np.std squares 1e-177 to 0: scale the spread first
    reach = np.abs(diff).max(axis=0)
    spread = reach * np.std(diff / np.where(reach > 0, reach, 1.0), axis=0)
    flat = (x[train] == x[train][0]) | (spread <= tiny)
    constant = bool(flat.all() or (y[train] == y[train][0]).all())
    try:
        data = load_csv(path, "target" if header else -1, seed=seed)
    except ValueError as err:
        assert constant, str(err)
        assert "constant" in str(err)
        return
    assert not constant
    assert data.info["columns"] == (names[:-1] if header else [str(j) for j in range(width - 1)])
    t = data.transform
    kept = list(t.kept_columns)
    for part, idx in ((data.x_train, train), (data.x_test, test)):
        restored = part.numpy() * np.array(t.x_std) + np.array(t.x_mean)
        np.testing.assert_allclose(restored, x[idx][:, kept], rtol=1e-9, atol=1e-9 * scale(x))
    for part, idx in ((data.y_train, train), (data.y_test, test)):
        restored = part.numpy() * t.y_std + t.y_mean
        np.testing.assert_allclose(restored, y[idx], rtol=1e-9, atol=1e-9 * scale(y))


def scale(values: np.ndarray) -> float:
    return max(1.0, float(np.abs(values).max()))


@SETTINGS
@given(text=TEXT, delimiter=st.sampled_from([None, ",", ";"]))
def test_read_table_gives_rectangular_rows_or_value_error(folder, text, delimiter):
    path = _file(folder, "table.txt", text)
    try:
        table = read_table(path, delimiter=delimiter)
    except ValueError:
        return
    assert table.rows and len({len(r) for r in table.rows}) == 1
    assert len(table.lines) == len(table.rows)
    if table.names is not None:
        assert len(table.names) == len(table.rows[0]) == len(set(table.names))
