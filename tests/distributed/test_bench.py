"""The data-parallel benchmarks' helpers (the benchmarks themselves run under ``slow``)."""

from __future__ import annotations

import pytest
import torch

from gpscale.benchmarks.distributed import _stream_rows, bench_ggp
from gpscale.data.synthetic import FieldStream


@pytest.mark.parametrize(("start", "stop"), [(0, 250), (0, 100), (37, 163), (200, 250),
                                             (100, 200), (99, 101), (150, 151)])
def test_stream_rows_are_the_streams_rows(start, stop):
    """A rank's rows of the stream = the same rows of the whole stream (chunks seeded by index)."""
    stream = FieldStream(n=250, num_dims=2, chunk_size=100)
    x_all, y_all = (torch.cat(t) for t in zip(*stream, strict=True))
    x, y = _stream_rows(stream, start, stop)
    torch.testing.assert_close(x, x_all[start:stop], rtol=0, atol=0)
    torch.testing.assert_close(y, y_all[start:stop], rtol=0, atol=0)


@pytest.mark.slow
def test_bench_ggp_quick_p1_and_p2_agree():
    """P = 1 and P = 2 train the same model from the same statistics (loss to solver accuracy)."""
    rows = bench_ggp(4000, nprocs=(1, 2), grid_size=30, num_probes=4, epochs=2, threads=1,
                     chunk_size=1500)
    assert [r["nproc"] for r in rows] == [1, 2] and len(rows[1]["peak_mb_ranks"]) == 2
    # rtol 1e-3 CG: rounding-level differences of the statistics move the loss ~1e-5
    assert rows[1]["final_loss"] == pytest.approx(rows[0]["final_loss"], rel=1e-3)
    assert all(r["stats_time_s"] > 0 and r["time_per_epoch_s"] > 0 for r in rows)
