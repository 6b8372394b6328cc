"""Readers cannot hang on, or be flooded by, what a path names: a named pipe, a device, a
sparse file or a tiny file declaring a huge array is refused with one line naming the file,
before anything the size of the declaration is read or allocated (gpscale.regular_files,
gpscale.files.read_bytes, the data readers)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npy_format

import gpscale
from gpscale.data.csv import load_csv, read_table
from gpscale.data.lines import read_lines
from gpscale.data.readers import read_npy, read_parquet
from gpscale.errors import SavedFileError
from gpscale.files import FormatError, decode, encode
from gpscale.io import convert, load_with_data, read_file
from gpscale.regular_files import NotRegularFileError

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
needs_dev = pytest.mark.skipif(not Path("/dev/null").exists() or not Path("/dev/zero").exists(),
                               reason="no /dev/null and /dev/zero here")

MODEL_READERS = {
    "load": gpscale.load,
    "load_with_data": load_with_data,
    "read_file": lambda p: read_file(p, ("checkpoint",)),
    "convert": lambda p: convert(p, Path(p).parent / "new.pt", trust=True),
}
DATA_READERS = {
    "load_csv": lambda p: load_csv(p, 0),
    "read_table": read_table,
    "read_lines": read_lines,
    "read_npy": read_npy,
    "read_parquet": read_parquet,
}
DATA_NAMES = {"load_csv": "d.csv", "read_table": "d.csv.gz", "read_lines": "d.csv",
              "read_npy": "d.npy", "read_parquet": "d.parquet"}


@contextlib.contextmanager
def unblocked(fifo: Path, seconds: float = 10.0) -> Iterator[None]:
    """While the body runs, a reader blocked on ``fifo`` is released: a writer opens and closes
    it, so the reader sees an empty file instead of waiting forever (the test then fails on
    the message, not by hanging)."""
    done = threading.Event()

    def release() -> None:
        deadline = time.monotonic() + seconds
        while not done.is_set() and time.monotonic() < deadline:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as err:  # ENXIO: no reader has it open (yet)
                assert err.errno == errno.ENXIO, err
            time.sleep(0.05)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _refused(read, path: Path, kind: str) -> str:
    with pytest.raises(ValueError) as err:
        read(path)
    text = str(err.value)
    assert text.startswith(str(path)) and kind in text and "\n" not in text, text
    return text


@needs_fifo
@pytest.mark.parametrize("reader", [*MODEL_READERS, *DATA_READERS])
def test_a_named_pipe_is_refused_without_blocking(tmp_path, reader):
    """Probe finding: a FIFO as --model or --data blocked the reader until killed."""
    fifo = tmp_path / DATA_NAMES.get(reader, "m.pt")
    os.mkfifo(fifo)
    read = {**MODEL_READERS, **DATA_READERS}[reader]
    with unblocked(fifo):
        text = _refused(read, fifo, "is a named pipe (FIFO), not a regular file")
    assert not (tmp_path / "new.pt").exists(), text


@needs_dev
@pytest.mark.parametrize("reader", [*MODEL_READERS, *DATA_READERS])
def test_a_device_is_refused_before_it_is_read(tmp_path, reader):
    """Probe finding: /dev/zero as --model, convert --trust input or --data was read until
    memory ran out. /dev/null (which ends at once) is tried first, so that a reader that does
    read devices fails here rather than on /dev/zero."""
    read = {**MODEL_READERS, **DATA_READERS}[reader]
    for device in ("null", "zero"):
        link = tmp_path / f"{device}-{DATA_NAMES.get(reader, 'm.pt')}"
        link.symlink_to(f"/dev/{device}")
        _refused(read, link, "is a character device, not a regular file")


@pytest.mark.parametrize("reader", [*MODEL_READERS, "read_lines", "read_npy"])
def test_a_folder_is_refused_naming_it(tmp_path, reader):
    folder = tmp_path / DATA_NAMES.get(reader, "m.pt")
    folder.mkdir()
    _refused({**MODEL_READERS, **DATA_READERS}[reader], folder, "is a folder")


def test_not_regular_file_error_is_a_value_error_naming_the_path(tmp_path):
    err = NotRegularFileError(tmp_path, 0o010644)  # S_IFIFO
    assert isinstance(err, ValueError) and str(err).startswith(f"{tmp_path}: is a named pipe")


# -- bounded reads --------------------------------------------------------------------------------

def _header_only(length: int, header: bytes = b"") -> bytes:
    return struct.pack("<Q", length) + header


def _document(document: str) -> bytes:
    header = json.dumps({"__metadata__": {"gpscale": document}}).encode()
    return struct.pack("<Q", len(header)) + header


@contextlib.contextmanager
def peak_python_memory() -> Iterator[list[int]]:
    """The peak of memory allocated through Python and NumPy inside the block (bytes)."""
    tracemalloc.start()
    out: list[int] = []
    try:
        yield out
    finally:
        out.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


SPARSE = 1 << 28  # bytes of the sparse files: nothing is written, reading them costs memory


@pytest.mark.parametrize(("start", "match"), [
    (_header_only(0), "header length 0 does not fit"),
    (_header_only(150_000_000), "over the limit of 100000000 bytes"),
    (_document("{}"), r"declares 0 bytes of tensors; the file holds \d+"),
], ids=["bad-header", "header-over-limit", "no-tensors-for-the-bytes"])
def test_a_sparse_file_is_refused_from_its_header(tmp_path, start, match):
    """Probe finding: a 2 GB sparse file cost more than its size in memory to report a bad
    header; the header is now checked against the file's size before the rest is read."""
    path = tmp_path / "sparse.pt"
    with path.open("wb") as f:
        f.write(start)
        f.truncate(SPARSE)
    with peak_python_memory() as peak, pytest.raises(SavedFileError, match=match) as err:
        gpscale.load(path)
    assert str(err.value).startswith(f"{path}: ")
    assert peak[0] < SPARSE // 16, peak


@pytest.mark.parametrize(("document", "match"), [
    ('{"$ndarray_items": [1], "dtype": "|O", "shape": [2000, 1000]}',
     r"do not fill the declared shape \[2000, 1000\]"),
    ('{"$ndarray_items": [[1], [2]], "dtype": "|O", "shape": [2, 1000]}',
     "do not fill the declared shape"),
    ('{"$ndarray_items": ["a", "b", "c", "d"], "dtype": "<U1000000", "shape": [4]}',
     "wider than its items need"),
], ids=["object-shape", "object-rows", "text-width"])
def test_a_tiny_file_declaring_a_huge_array_is_refused_before_allocation(tmp_path, document,
                                                                         match):
    """Probe finding: a 10 KB model file holding an object array of declared shape
    [20000, 10000] allocated it (2 GB) before any check; here a smaller declaration (16 MB)
    must be refused with less than 1 MB allocated."""
    with peak_python_memory() as peak, pytest.raises(FormatError, match=match):
        decode(_document(document))
    assert peak[0] < 1 << 20, peak
    path = tmp_path / "tiny.pt"
    path.write_bytes(_document(document))
    with pytest.raises(SavedFileError, match=f"^{path}: .*{match}"):
        gpscale.load(path)


def test_arrays_of_items_still_round_trip():
    values = {"o": np.array([[1, "x"], [None, [2, 3]]], dtype=object),
              "u": np.array(["ant", "cat"]), "wide": np.array(["a"], dtype="<U300"),
              "empty": np.empty((0, 5), dtype=object), "scalar": np.array("s", dtype=object)}
    back = decode(encode(values))
    for key, value in values.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert back[key].tolist() == value.tolist(), key


def test_a_tensor_declared_beyond_the_file_is_refused_before_it_is_read(tmp_path):
    header = json.dumps({"__metadata__": {"gpscale": "{}"},
                         "t0": {"dtype": "F64", "shape": [100000, 100000],
                                "data_offsets": [0, 8 * 10 ** 10]}}).encode()
    path = tmp_path / "big.pt"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(SavedFileError, match=r"its tensor 't0' declares shape \[100000, 100000\]"
                                             r" at bytes 0..80000000000; the file holds 16"):
        gpscale.load(path)


# -- .npy files -----------------------------------------------------------------------------------

def test_a_text_file_named_npy_is_called_text_not_pickled(tmp_path):
    """Probe finding: a CSV file named .npy was reported as "pickled (object) data"."""
    path = tmp_path / "data.npy"
    path.write_text("a,b,y\n1,2,3\n4,5,6\n")
    text = _refused(read_npy, path, "is not a .npy file")
    assert "looks like text" in text and "pickle" not in text


def test_an_npy_header_declaring_more_than_the_file_holds_is_refused(tmp_path):
    path = tmp_path / "short.npy"
    header = io.BytesIO()
    npy_format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False,
                                               "shape": (10 ** 9, 3)})
    path.write_bytes(header.getvalue() + bytes(96))
    _refused(read_npy, path, "is truncated: its header declares an array of shape "
                             "(1000000000, 3) and dtype float64 (24000000000 bytes); the file "
                             "holds 96 bytes after the header")


def _little_memory(monkeypatch, free: int = 1 << 20) -> None:
    """The machine as if ``free`` bytes were free (what a crafted file meets at scale)."""
    import gpscale.limits

    monkeypatch.setattr(gpscale.limits, "available_memory", lambda: free)


def test_a_gzip_file_decompressing_beyond_memory_is_refused_naming_it(tmp_path, monkeypatch):
    """A few KB of gzip for 300,000 rows (a compression bomb in miniature): with 1 MiB free, the
    reader stops when its arrays would outgrow the memory, with one line naming the file."""
    import gzip

    path = tmp_path / "bomb.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("a,y\n" + "".join(f"{i % 10},{i % 3}.5\n" for i in range(300_000)))
    assert path.stat().st_size < 20_000
    _little_memory(monkeypatch)
    with pytest.raises(ValueError, match=r"bomb\.csv\.gz: more than [\d,]+ rows of 2 numeric "
                                         r"columns need .* GiB of memory free"):
        load_csv(path, "y")
    monkeypatch.undo()
    assert load_csv(path, "y").num_train > 200_000  # with the memory there, it is read


def test_a_parquet_file_whose_rows_outgrow_memory_is_refused_before_reading(tmp_path,
                                                                            monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "many.parquet"
    pq.write_table(pa.table({"a": np.zeros(200_000), "y": np.ones(200_000)}), path)
    _little_memory(monkeypatch)
    with pytest.raises(ValueError, match=r"many\.parquet: the 200,000 rows its metadata "
                                         "declares .* nothing was allocated"):
        read_parquet(path)
    _little_memory(monkeypatch, free=5 << 20)  # one column fits, the table does not
    table = read_parquet(path)
    with pytest.raises(ValueError, match=r"many\.parquet: 200,000 rows of 2 numeric columns"):
        table.numeric(path, [0, 1])


def test_the_line_by_line_reader_stops_a_gzip_bomb_naming_the_file(tmp_path, monkeypatch):
    """The Python reader (pyarrow's fallback) decompresses a chunk at a time and stops when the
    rows would outgrow the memory free; the same file reads with the memory there."""
    import gzip

    from gpscale.limits import TooLargeError

    path = tmp_path / "lines.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("a,y\n" + "".join(f"{i % 10},{i % 3}.5\n" for i in range(300_000)))
    _little_memory(monkeypatch)
    with pytest.raises(TooLargeError, match=r"lines\.csv\.gz: more than [\d,]+ bytes of "
                                            "decompressed text"):
        read_lines(path)
    monkeypatch.undo()
    assert len(read_lines(path).rows) == 300_000
