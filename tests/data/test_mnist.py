"""read_idx on hand-built IDX files (no shared data needed)."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from gpscale.data.mnist import read_idx


def _idx(shape, payload: bytes, type_code: int = 0x08) -> bytes:
    return bytes([0, 0, type_code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape) + payload


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gzip"])
def test_read_idx_hand_built(tmp_path, compress):
    raw = _idx((2, 3), bytes([0, 1, 2, 253, 254, 255]))
    path = tmp_path / ("a.idx.gz" if compress else "a.idx")
    path.write_bytes(gzip.compress(raw) if compress else raw)
    array = read_idx(path)
    assert array.dtype == np.uint8
    assert array.tolist() == [[0, 1, 2], [253, 254, 255]]


def test_read_idx_big_endian_int32(tmp_path):
    path = tmp_path / "b.idx"
    path.write_bytes(_idx((2,), struct.pack(">2i", -7, 65536), type_code=0x0C))
    assert read_idx(path).tolist() == [-7, 65536]


@pytest.mark.parametrize(
    ("raw", "match"),
    [(b"\x01\x00\x08\x01" + struct.pack(">I", 1) + b"\x00", "bad magic"),
     (_idx((4,), b"\x00\x01"), r"shape \(4,\)"),
     (_idx((1,), b"\x00", type_code=0x07), "unknown IDX type byte 0x07")],
    ids=["magic", "short", "type"],
)
def test_read_idx_errors(tmp_path, raw, match):
    path = tmp_path / "bad.idx"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=match):
        read_idx(path)
