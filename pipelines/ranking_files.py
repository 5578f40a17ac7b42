"""The ranking files (``ranking_{train,valid,test}.parquet``) written from pieces.

A prepare that works part by part (on Dask workers, or streaming in one process) writes each
part's encoded rows as a piece (training pieces permuted), then merges the pieces into one
file per split a row group at a time, holding about one row group per piece. Validation and
test rows keep their order; every row group of the training file draws rows from every piece
in proportion to what it has left and is permuted, so each row group is a random sample of
all training rows (stratified by piece): what the loader's shuffle buffer relies on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.errors import writing
from core.features.ops import Columns
from pipelines.split import POSITIVE_RATING
from pipelines.storage import flatten, write_parquet

RANKING_GROUP_ROWS = 65_536  # row group size of the ranking files (as the in-memory path)


def write_piece(
    columns: Columns, path: Path, seed: tuple[int, int] | None, names: tuple[str, ...]
) -> int:
    """Runs on a worker: this partition's ranking rows (rating 3 dropped) as parquet,
    permuted when ``seed`` is given; returns the rows written."""
    kept = np.flatnonzero(columns["rating"] != POSITIVE_RATING)
    if seed is not None:
        kept = np.random.default_rng(list(seed)).permutation(kept)
    picked = {c: columns[c][kept] for c in names}
    write_parquet(path, flatten(picked, names), row_group_size=RANKING_GROUP_ROWS)
    return len(kept)


def shares(remaining: np.ndarray, rows: int) -> np.ndarray:
    """``rows`` split over the pieces in proportion to ``remaining`` (largest remainders;
    never more than a piece has left)."""
    total = int(remaining.sum())
    take = remaining * rows // total
    left_over = rows - int(take.sum())
    by_remainder = np.argsort(-(remaining * rows % total), kind="stable")
    take[by_remainder[:left_over]] += 1
    return take


def _row_groups(piece: pq.ParquetFile) -> Iterator[pa.Table]:
    """The piece's row groups, each read when asked for (``iter_batches`` reads ahead: 26
    pieces of 1.5M rows held 2.3 GB more)."""
    for group in range(piece.num_row_groups):
        yield piece.read_row_group(group)


def merge_pieces(
    pieces: list[Path], path: Path, rng: np.random.Generator | None, group_rows: int
) -> None:
    """Stream ``pieces`` (parquet files of one schema) into ``path`` in row groups of
    ``group_rows``: in order, or (``rng``) each group drawn from every piece in proportion
    to what it has left and permuted. Holds about one row group per piece in memory."""
    files = [pq.ParquetFile(p) for p in pieces]
    remaining = np.array([f.metadata.num_rows for f in files], dtype=np.int64)
    batches = [_row_groups(f) for f in files]
    buffers = [f.schema_arrow.empty_table() for f in files]

    def take(i: int, rows: int) -> pa.Table:
        while buffers[i].num_rows < rows:
            buffers[i] = pa.concat_tables([buffers[i], next(batches[i])])
        out, buffers[i] = buffers[i].slice(0, rows), buffers[i].slice(rows)
        return out

    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with (
        writing(path),
        pq.ParquetWriter(
            temporary, files[0].schema_arrow, compression="none", use_dictionary=False
        ) as writer,
    ):
        while remaining.sum():
            rows = min(group_rows, int(remaining.sum()))
            if rng is None:  # in order: fill the group from the first pieces with rows left
                before = np.cumsum(remaining) - remaining
                counts = np.clip(rows - before, 0, remaining)
            else:
                counts = shares(remaining, rows)
            group = pa.concat_tables([take(i, int(n)) for i, n in enumerate(counts) if n])
            if rng is not None:
                group = group.take(rng.permutation(group.num_rows))
            writer.write_table(group, row_group_size=group_rows)
            remaining -= counts
    os.replace(temporary, path)
