"""Column-wise readers (issue #20): CSV and gzipped CSV through pyarrow, Parquet, ``.npy``.

Every format loads the same numbers as the others and as the line-by-line reader; the target is
picked by name or index; bad files give a one-line ValueError naming the file and the problem.
"""

from __future__ import annotations

import gzip
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpscale.cli.predict import read_features
from gpscale.data import load_table
from gpscale.data.csv import load_csv, read_table
from gpscale.data.csv_arrow import HEAD_BYTES, ArrowCsvTable, read_csv_columns
from gpscale.data.lines import read_lines
from gpscale.data.readers import NpyTable, ParquetTable, file_format

NAMES = ["a", "b", "price", "c"]
RNG = np.random.default_rng(7)
VALUES = np.column_stack([RNG.normal(size=(50, 2)), RNG.normal(size=50) * 3 + 1,
                          RNG.uniform(size=50)])


def _csv_text(values, names=NAMES, delimiter=","):
    lines = [delimiter.join(names)] if names else []
    lines += [delimiter.join(repr(float(v)) for v in row) for row in values]
    return "\n".join(lines) + "\n"


def _csv(path, values=VALUES, names=NAMES, delimiter=","):
    path.write_text(_csv_text(values, names, delimiter))
    return path


def _gz(path, values=VALUES, names=NAMES):
    with gzip.open(path, "wt") as f:
        f.write(_csv_text(values, names))
    return path


def _parquet(path, values=VALUES, names=NAMES):
    pq.write_table(pa.table({n: values[:, j] for j, n in enumerate(names)}), path)
    return path


def _npy(path, values=VALUES):
    np.save(path, values)
    return path


@pytest.fixture
def files(tmp_path):
    return {"csv": _csv(tmp_path / "d.csv"), "gz": _gz(tmp_path / "d.csv.gz"),
            "parquet": _parquet(tmp_path / "d.parquet"), "npy": _npy(tmp_path / "d.npy")}


def _same(a, b):
    for part in ("x_train", "y_train", "x_test", "y_test"):
        torch.testing.assert_close(getattr(a, part), getattr(b, part), rtol=0, atol=0)


# -- every format reads the same numbers -----------------------------------------------------------

def test_every_format_loads_the_same_dataset(files):
    want = load_csv(files["csv"], "price", seed=3)
    for kind in ("gz", "parquet"):
        got = load_csv(files[kind], "price", seed=3)
        _same(got, want)
        assert got.info["columns"] == ["a", "b", "c"] and got.info["header"]
    from_npy = load_csv(files["npy"], 2, seed=3)
    _same(from_npy, want)
    assert from_npy.info["columns"] == ["0", "1", "3"] and not from_npy.info["header"]
    assert from_npy.name == want.name == "d"


def test_columns_are_the_line_by_line_readers_numbers(files):
    """The pyarrow CSV path (not the fallback) gives the exact float64 of Python's float()."""
    reference = read_lines(files["csv"]).numeric(files["csv"], [0, 1, 2, 3])
    np.testing.assert_array_equal(reference, VALUES)
    for kind, path in files.items():
        table = read_table(path)
        assert isinstance(table, {"csv": ArrowCsvTable, "gz": ArrowCsvTable,
                                  "parquet": ParquetTable, "npy": NpyTable}[kind])
        assert table.num_rows == 50 and table.width == 4
        assert table.names == (None if kind == "npy" else NAMES)
        np.testing.assert_array_equal(table.numeric(path, [3, 0, 2]), VALUES[:, [3, 0, 2]])


def test_target_by_name_and_by_index(files):
    want = load_csv(files["csv"], "price")
    for kind in ("csv", "gz", "parquet", "npy"):
        for target in (2, -2, "2", "-2"):
            got = load_csv(files[kind], target)
            _same(got, want)
            assert got.info["target_index"] == 2
    assert load_table(files["parquet"], "price").info["target"] == "price"
    assert load_table(files["npy"], -1).info["target"] == "3"


def test_numeric_labels_are_the_same_classes_in_every_format(tmp_path):
    values = VALUES.copy()
    values[:, 2] = np.arange(50) % 3 * 5  # labels 0, 5, 10
    text = "".join(f"{p},{q},{int(k)},{r}\n" for p, q, k, r in values.tolist())
    (tmp_path / "k.csv").write_text(text)  # labels written as integers, as a user would
    paths = [tmp_path / "k.csv", _parquet(tmp_path / "k.pq", values),
             _npy(tmp_path / "k.npy", values)]
    loaded = [load_csv(p, 2, task="classification") for p in paths]
    for data in loaded:
        assert data.info["classes"] == ["0", "5", "10"] and data.num_classes == 3
        _same(data, loaded[0])


def test_text_labels_in_csv_and_parquet(tmp_path):
    labels = np.array(["dog", "cat", " ant"] * 10)
    x = RNG.normal(size=(30, 2))
    text = "a,b,label\n" + "".join(f"{p},{q},{lab}\n"
                                    for (p, q), lab in zip(x.tolist(), labels, strict=True))
    (tmp_path / "l.csv").write_text(text)
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1],
                             "label": [s.strip() for s in labels]}), tmp_path / "l.parquet")
    got = [load_csv(tmp_path / name, "label", task="classification")
           for name in ("l.csv", "l.parquet")]
    for data in got:
        assert data.info["classes"] == ["ant", "cat", "dog"]
        assert torch.bincount(torch.cat([data.y_train, data.y_test])).tolist() == [10, 10, 10]
    _same(got[0], got[1])


def test_counts_in_parquet_and_npy(tmp_path):
    values = np.column_stack([np.arange(20.0), np.arange(20) % 4])
    for path in (_parquet(tmp_path / "k.parquet", values, ["x", "k"]),
                 _npy(tmp_path / "k.npy", values)):
        data = load_csv(path, 1, task="counts")
        assert set(torch.cat([data.y_train, data.y_test]).tolist()) == {0.0, 1.0, 2.0, 3.0}
    values[5, 1] = 1.5
    with pytest.raises(ValueError, match=r"k.npy: counts must be non-negative integers; the "
                                         r"target column 1 holds 1.5 on row 5 \(0-based\)"):
        load_csv(_npy(tmp_path / "k.npy", values), 1, task="counts")


def test_parquet_with_integer_columns_and_predict_by_name(tmp_path):
    """Integer columns read as float64; predict matches a Parquet file's columns by name."""
    table = pa.table({"c": pa.array(np.arange(30) % 4, pa.int32()), "y": VALUES[:30, 2],
                      "a": VALUES[:30, 0], "b": pa.array(np.arange(30) % 2 == 0)})
    path = tmp_path / "p.parquet"
    pq.write_table(table, path)
    x = read_features(path, feature_names=["a", "b", "c"], num_features=3, train_target="y")
    np.testing.assert_array_equal(x, np.column_stack([VALUES[:30, 0], np.arange(30) % 2 == 0,
                                                      np.arange(30) % 4]))
    npy = _npy(tmp_path / "p.npy", x)
    np.testing.assert_array_equal(read_features(npy, feature_names=["a", "b", "c"],
                                                num_features=3), x)


def test_npy_is_memory_mapped_and_only_the_asked_columns_are_copied(tmp_path):
    path = _npy(tmp_path / "m.npy", np.asfortranarray(VALUES.astype(np.float32)))
    table = read_table(path)
    assert isinstance(table.array, np.memmap) and table.array.dtype == np.float32
    out = table.numeric(path, [1, 3])
    assert type(out) is np.ndarray and out.shape == (50, 2) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, VALUES.astype(np.float32)[:, [1, 3]])


# -- pyarrow's CSV reader keeps the line-by-line reader's rules ----------------------------------

def test_semicolons_spaces_and_crlf_take_the_fast_path(tmp_path):
    text = _csv_text(VALUES, delimiter="; ").replace("\n", "\r\n")
    path = tmp_path / "s.txt"
    path.write_text("\ufeff" + text, newline="")
    table = read_table(path)
    assert isinstance(table, ArrowCsvTable) and table.delimiter == ";"
    assert table.names == NAMES
    np.testing.assert_array_equal(table.numeric(path, [0, 1, 2, 3]), VALUES)


def test_headerless_file(tmp_path):
    path = _csv(tmp_path / "n.tsv", names=None, delimiter="\t")
    table = read_table(path)
    assert isinstance(table, ArrowCsvTable) and table.names is None
    np.testing.assert_array_equal(table.numeric(path, [2]), VALUES[:, [2]])
    with pytest.raises(ValueError, match="target 'price' is a column name, but the file has "
                                         "no header row"):
        load_csv(path, "price")


@pytest.fixture(params=["threads", "one thread"])
def arrow_threads(request):
    """pyarrow with its thread pool, and with one thread (as under OMP_NUM_THREADS=1, where its
    conversion errors name the row too: 'In CSV column #1: Row #20449: CSV conversion ...')."""
    before = pa.cpu_count()
    if request.param == "one thread":
        pa.set_cpu_count(1)
    yield request.param
    pa.set_cpu_count(before)


def test_errors_past_the_first_mebibyte_name_the_line(tmp_path, arrow_threads):
    """A text cell beyond pyarrow's sample: read as text, then reported with its line."""
    rows = np.tile(VALUES, (HEAD_BYTES // 3000 + 60, 1))
    lines = _csv_text(rows).splitlines()
    n = len(lines)
    assert len("\n".join(lines[:n - 5])) > HEAD_BYTES
    lines[n - 3] = lines[n - 3].replace(lines[n - 3].split(",")[1], "oops", 1)
    path = tmp_path / "big.csv"
    path.write_text("\n".join(lines) + "\n")
    table, why = read_csv_columns(path)
    assert isinstance(table, ArrowCsvTable), why
    with pytest.raises(ValueError, match=rf"big.csv: line {n - 2}, column 'b': 'oops' is not a "
                                         "number; input columns must be numeric"):
        load_csv(path, "price")
    lines[n - 3] = lines[n - 3].replace("oops", "inf")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"column 'b' holds NaN or inf on line {n - 2}; "):
        load_csv(path, "price")


def test_a_file_only_python_reads_loads_with_a_warning(tmp_path, caplog, arrow_threads):
    """pyarrow rejects 1_000 (Python's float() reads it): loaded line by line, not silently."""
    values = VALUES.copy()
    values[4, 0] = 1000.0
    path = _csv(tmp_path / "u.csv", values)
    path.write_text(path.read_text().replace("1000.0", "1_000"))
    with caplog.at_level(logging.WARNING, logger="gpscale.data"):
        data = load_csv(path, "price")
    _same(data, load_csv(_csv(tmp_path / "v.csv", values), "price"))
    assert any("u.csv: pyarrow read text in column 0" in r.getMessage() for r in caplog.records)


# -- bad input: one-line ValueErrors naming the file and the problem -----------------------------

def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_missing_target_column(files):
    for kind in ("csv", "gz", "parquet"):
        with pytest.raises(ValueError, match="target column 'cost' not found; columns: a, b, "
                                             "price, c") as err:
            load_csv(files[kind], "cost")
        _one_line(err)
    with pytest.raises(ValueError, match=r"out of range for 4 columns \(valid: -4\.\.3\)"):
        load_csv(files["npy"], 4)
    with pytest.raises(ValueError, match="no header row"):
        load_csv(files["npy"], "price")


def test_non_numeric_cells(tmp_path, files):
    path = tmp_path / "t.csv"
    path.write_text(_csv_text(VALUES).replace(repr(float(VALUES[6, 3])), "n/a"))
    with pytest.raises(ValueError, match="t.csv: line 8, column 'c': 'n/a' is not a number; "
                                         "input columns must be numeric"):
        load_csv(path, "price")
    table = pa.table({"a": VALUES[:, 0], "price": VALUES[:, 2], "c": ["x"] * 50})
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="t.parquet: the input column 'c' holds string values; "
                                         "input columns must be numeric"):
        load_csv(tmp_path / "t.parquet", "price")
    with pytest.raises(ValueError, match="the target column 'c' holds text; use "
                                         "task='classification'"):
        load_csv(tmp_path / "t.parquet", "c")


def test_missing_and_nonfinite_values_in_parquet_and_npy(tmp_path):
    table = pa.table({"a": pa.array([1.0, None, 3.0, 4.0]), "y": [1.0, 2.0, 3.0, 4.0]})
    pq.write_table(table, tmp_path / "n.parquet")
    with pytest.raises(ValueError, match=r"n.parquet: the input column 'a' has missing values "
                                         r"\(null\) on row 1 \(0-based\); remove or impute"):
        load_csv(tmp_path / "n.parquet", "y")
    values = VALUES.copy()
    values[[3, 9], 1] = [np.nan, np.inf]
    with pytest.raises(ValueError, match=r"f.npy: column 1 holds NaN or inf on rows 3, 9 "
                                         r"\(0-based\); remove or impute those rows"):
        load_csv(_npy(tmp_path / "f.npy", values), -1)
    values[[3, 9], 1] = 0.0
    values[7, 2] = -np.inf
    with pytest.raises(ValueError, match=r"the target column 'price' holds NaN or inf on row 7 "
                                         r"\(0-based\)"):
        load_csv(_parquet(tmp_path / "f.parquet", values), "price")


@pytest.mark.parametrize(("array", "match"), [
    (np.arange(10.0), r"a .npy file must hold a 2-D array \(rows, columns\); this one has "
                      r"shape \(10,\)"),
    (np.zeros((2, 3, 4)), r"must hold a 2-D array .* shape \(2, 3, 4\)"),
    (np.array([["a", "b"], ["c", "d"]]), "holds <U1 values; gpscale reads .npy arrays of "
                                         "numbers"),
    (np.array([[1, "a"]], dtype=object), r"holds Python objects \(dtype object\), which only "
                                         "unpickling could read"),
    (np.zeros((0, 3)), "has no data rows"),
], ids=["1-d", "3-d", "strings", "objects", "no-rows"])
def test_bad_npy_arrays(tmp_path, array, match):
    path = _npy(tmp_path / "bad.npy", array)
    with pytest.raises(ValueError, match=match) as err:
        load_csv(path, -1)
    assert str(path) in _one_line(err)


def test_corrupt_and_truncated_files(tmp_path, files):
    raw = files["parquet"].read_bytes()
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(ValueError, match=r"broken.parquet is not a readable Parquet file "
                                         r"\(.*magic bytes") as err:
        load_csv(broken, "price")
    _one_line(err)
    text = tmp_path / "text.pq"
    text.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="text.pq is not a readable Parquet file"):
        load_csv(text, 0)
    raw = files["npy"].read_bytes()
    short = tmp_path / "short.npy"
    short.write_bytes(raw[:len(raw) - 40])
    with pytest.raises(ValueError, match=r"short.npy is truncated: its header declares an "
                                         r"array of shape \(\d+, \d+\) and dtype float64"):
        load_csv(short, -1)
    gz = tmp_path / "cut.csv.gz"
    gz.write_bytes(files["gz"].read_bytes()[:200])
    with pytest.raises(ValueError, match="cut.csv.gz is not a readable gzip file"):
        load_csv(gz, "price")


@pytest.mark.parametrize("name", ["e.csv", "e.csv.gz", "e.parquet", "e.npy"])
def test_empty_files(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(gzip.compress(b"") if name.endswith(".gz") else b"")
    match = r"is empty \(0 bytes\)" if name.endswith(("parquet", "npy")) else r"is empty \(no rows"
    with pytest.raises(ValueError, match=match) as err:
        load_csv(path, 0)
    assert _one_line(err).startswith(str(path))


@pytest.mark.parametrize("name", ["data.xlsx", "data.json", "data", "data.gz", "data.npz"])
def test_unknown_extension(tmp_path, name):
    path = tmp_path / name
    path.write_text("a,b\n1,2\n3,4\n")
    with pytest.raises(ValueError, match=r"unknown file type \((extension '.+'|no extension)\); "
                                         r"gpscale reads "
                                         r"\.csv, \.tsv, \.txt \(each optionally \.gz\), "
                                         r"\.parquet, \.pq and \.npy files") as err:
        load_csv(path, -1)
    _one_line(err)
    with pytest.raises(ValueError, match="unknown file type"):
        read_table(path)


def test_file_format_by_name():
    assert [file_format(n) for n in ("a.CSV", "a.tsv.gz", "a.txt", "a.pq", "b.parquet",
                                     "c.npy", "d.csv.gz")] == \
        ["csv", "csv", "csv", "parquet", "parquet", "npy", "csv"]


def test_options_that_do_not_apply_to_binary_files(files):
    with pytest.raises(ValueError, match="a delimiter applies to text files only"):
        load_csv(files["parquet"], "price", delimiter=",")
    with pytest.raises(ValueError, match="a .npy file has no header row"):
        load_csv(files["npy"], -1, header=0)


# -- pyarrow agrees with the line-by-line reader on any text ------------------------------------

ALPHABET = st.sampled_from(list("0123456789.-+eE,;\t|\n\r \"'abcnifxy_") + ["\x00", "é", "∞"])


@st.composite
def _numeric_text(draw):
    """Mostly well-formed numeric tables with a few stray characters."""
    n, width = draw(st.integers(1, 8)), draw(st.integers(1, 4))
    sep = draw(st.sampled_from([",", ";", "\t", "|", ", "]))
    cell = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                     st.integers(-99, 99).map(str), st.text(ALPHABET, max_size=4))
    rows = [sep.join(draw(st.lists(cell, min_size=width, max_size=width))) for _ in range(n)]
    if draw(st.booleans()):
        rows.insert(0, sep.join(f"h{j}" for j in range(width)))
    return draw(st.sampled_from(["\n", "\r\n", "\r"])).join(rows) + draw(
        st.sampled_from(["", "\n"]))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(ALPHABET, max_size=120), _numeric_text()),
       delimiter=st.sampled_from([None, None, ",", ";"]))
def test_pyarrow_reads_what_python_reads_or_declines(tmp_path_factory, text, delimiter):
    path = tmp_path_factory.getbasetemp() / "agree.csv"
    path.write_bytes(text.encode("utf-8"))
    fast, _ = read_csv_columns(path, delimiter=delimiter)
    if fast is None:
        return  # the line-by-line reader reads it (or names the problem)
    slow = read_lines(path, delimiter=delimiter)
    assert (fast.names, fast.num_rows, fast.width, fast.delimiter) == \
        (slow.names, len(slow.rows), slow.width, slow.delimiter)
    columns = list(range(fast.width))
    try:
        want = slow.numeric(path, columns)
    except ValueError as err:
        with pytest.raises(ValueError) as got:
            fast.numeric(path, columns)
        assert str(got.value) == str(err)
        return
    np.testing.assert_array_equal(fast.numeric(path, columns), want)


@pytest.mark.skipif(int(pa.__version__.split(".")[0]) < 15, reason="page checksums: pyarrow 15")
def test_damaged_parquet_page_with_checksums(tmp_path):
    path = tmp_path / "crc.parquet"
    table = pa.table({n: VALUES[:, j] for j, n in enumerate(NAMES)})
    pq.write_table(table, path, write_page_checksum=True, compression="none")
    raw = bytearray(path.read_bytes())
    at = raw.find(VALUES[10, 0].tobytes())
    raw[at:at + 8] = np.float64(123.0).tobytes()
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"crc.parquet is not a readable Parquet file \(column "
                                         r"'a': .*CRC") as err:
        load_csv(path, "price")
    _one_line(err)
