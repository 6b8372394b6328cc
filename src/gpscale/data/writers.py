"""Write generated data to disk in the formats gpscale reads: CSV (optionally gzipped), Parquet
and ``.npy`` — chosen by the file name, as :func:`gpscale.data.readers.file_format` reads it.

Rows arrive as (x, y) chunks (:class:`gpscale.data.synthetic.FieldStream` yields them), and each
chunk is written before the next is made, so a file of 10⁸ rows needs memory for one chunk only:
``.npy`` through a memory-mapped array of the final shape, Parquet one row group per chunk, CSV
through pyarrow's streaming writer. Columns are named ``x0..x{d-1}`` and ``y`` (the ``.npy``
array holds them in that order, the target last).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from torch import Tensor

from gpscale.data.readers import file_format
from gpscale.data.synthetic import FieldStream
from gpscale.files import temporary_beside

__all__ = ["WrittenTable", "write_chunks", "write_field"]


@dataclass(frozen=True)
class WrittenTable:
    """What :func:`write_chunks` wrote: the path, the rows and the target's mean and variance."""

    path: Path
    num_rows: int
    num_dims: int
    y_mean: float
    y_var: float
    noise: float = 0.0

    @property
    def noise_floor(self) -> float:
        """√noise / std(y): the test RMSE, on the standardised target, of predicting the noise-free
        field exactly — no method can do better on average."""
        return (self.noise / self.y_var) ** 0.5 if self.y_var > 0 else float("nan")


def write_chunks(path: str | Path, chunks: Iterable[tuple[Tensor, Tensor]], *, num_rows: int,
                 num_dims: int) -> WrittenTable:
    """Write (x, y) chunks as one table of ``num_rows`` rows and ``num_dims + 1`` columns.

    The file is written under an unpredictable temporary name beside ``path``
    (:func:`gpscale.files.temporary_beside`) and renamed when complete, so an interrupted write
    leaves no half file behind and a planted file or symlink is never written through.

    Raises:
        ValueError: an unknown file type, or chunks whose shapes or total do not match.
    """
    path = Path(path)
    kind = file_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [f"x{j}" for j in range(num_dims)] + ["y"]
    count, total, total_sq = 0, 0.0, 0.0
    tmp = temporary_beside(path)
    try:
        sink = _Sink(kind, tmp, names, num_rows, gz=path.name.lower().endswith(".gz"))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        for x, y in chunks:
            block = np.concatenate([x.detach().cpu().double().numpy(),
                                    y.detach().cpu().double().numpy()[:, None]], 1)
            if block.shape[1] != num_dims + 1 or count + block.shape[0] > num_rows:
                raise ValueError(f"a chunk of shape {tuple(x.shape)} does not fit a table of "
                                 f"{num_rows} rows and {num_dims} inputs (at row {count})")
            sink.write(block, count)
            count += block.shape[0]
            total += float(block[:, -1].sum())
            total_sq += float(np.square(block[:, -1]).sum())
        if count != num_rows:
            raise ValueError(f"the chunks held {count} rows, not the {num_rows} announced")
        sink.close()
        os.replace(tmp, path)
    except BaseException:
        sink.close()
        tmp.unlink(missing_ok=True)
        raise
    mean = total / count
    return WrittenTable(path, count, num_dims, mean, max(total_sq / count - mean**2, 0.0))


class _Sink:
    def __init__(self, kind: str, path: Path, names: list[str], num_rows: int, gz: bool):
        self.kind, self.names = kind, names
        self._file = self._writer = self._array = None
        if kind == "npy":
            self._array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64,
                                                    shape=(num_rows, len(names)))
        elif kind == "parquet":
            schema = pa.schema([(name, pa.float64()) for name in names])
            self._writer = pq.ParquetWriter(path, schema)
        else:
            self._file = gzip.open(path, "wb", compresslevel=1) if gz else open(path, "wb")
            schema = pa.schema([(name, pa.float64()) for name in names])
            self._writer = pacsv.CSVWriter(self._file, schema)

    def write(self, block: np.ndarray, start: int) -> None:
        if self._array is not None:
            self._array[start:start + block.shape[0]] = block
            return
        table = pa.table({name: block[:, j] for j, name in enumerate(self.names)})
        self._writer.write_table(table)

    def close(self) -> None:
        if self._array is not None:
            self._array.flush()
            self._array = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._file is not None:
            self._file.close()
            self._file = None


def write_field(path: str | Path, num_rows: int, *, num_dims: int = 8, noise: float = 0.04,
                lengthscale: float = 0.5, seed: int = 0,
                chunk_rows: int = 1_000_000) -> WrittenTable:
    """Write ``num_rows`` noisy samples of a smooth random field on [0, 1]^d to ``path``.

    The field is :class:`~gpscale.data.synthetic.FieldStream`'s (an approximate GP(0, RBF_ℓ)
    draw, 32 random features) and y = f(x) + ε with ε ~ N(0, ``noise``). With the defaults
    (d = 8, ℓ = 0.5, noise 0.04) std(y) ≈ 0.87, so the noise floor — the best test RMSE on the
    standardised target — is ≈ 0.23 (:attr:`WrittenTable.noise_floor`). Rows are i.i.d., so
    any random split of the file is a fair train/test split. Memory: one chunk of rows.
    """
    if num_rows < 1:
        raise ValueError(f"num_rows must be at least 1; got {num_rows}")
    stream = FieldStream(n=num_rows, num_dims=num_dims, chunk_size=chunk_rows, seed=seed,
                         noise=noise, lengthscale=lengthscale)
    written = write_chunks(path, stream, num_rows=num_rows, num_dims=num_dims)
    return WrittenTable(written.path, written.num_rows, num_dims, written.y_mean, written.y_var,
                        noise)
