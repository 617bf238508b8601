"""Parquet files of ``strata embed export --format parquet`` (the ``parquet`` extra: pyarrow).

The engine hands the rows over in node-id order, one pass of the export at a time (see
strata-embed's ``run/export.rs``); each pass becomes one or more row groups of ``BATCH_ROWS`` rows, so
memory stays at one pass whatever the table's size. Columns: ``id`` (int64), ``name`` (the
store's id map, or the id as text without one) and ``embedding`` (fixed-size list of float32).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import ConfigError

#: Rows per row group.
BATCH_ROWS = 65_536


def _pyarrow():
    """Imports pyarrow lazily: only Parquet exports need it, and it is an optional extra."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as e:
        raise ConfigError(
            "embed.export.format: Parquet is written with pyarrow, which is not installed; pip install pyarrow"
        ) from e
    return pyarrow


class Writer:
    """Writes the export's files as the engine hands them over: ``begin(path, dim)``, then
    ``rows(first_id, names, float32 bytes)`` in id order, then ``finish()``."""

    def __init__(self):
        self._pa = _pyarrow()
        self._file = None
        self._path: Path | None = None
        self._dim = 0

    def begin(self, path, dim: int) -> None:
        pa = self._pa
        self._path, self._dim = Path(path), dim
        schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("embedding", pa.list_(pa.float32(), dim))])
        self._file = pa.parquet.ParquetWriter(str(self._path), schema)
        self._schema = schema

    def rows(self, first: int, names: list[str], data: bytes) -> None:
        pa = self._pa
        values = np.frombuffer(data, dtype=np.float32)
        for lo in range(0, len(names), BATCH_ROWS):
            hi = min(lo + BATCH_ROWS, len(names))
            flat = pa.array(values[lo * self._dim : hi * self._dim], type=pa.float32())
            batch = pa.record_batch(
                [
                    pa.array(np.arange(first + lo, first + hi, dtype=np.int64)),
                    pa.array(names[lo:hi], type=pa.string()),
                    pa.FixedSizeListArray.from_arrays(flat, self._dim),
                ],
                schema=self._schema,
            )
            self._file.write_batch(batch, row_group_size=BATCH_ROWS)

    def finish(self) -> None:
        self._file.close()
        self._file = None
        with open(self._path, "rb") as f:
            os.fsync(f.fileno())
