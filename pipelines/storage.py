"""Parquet storage of feature columns (pyarrow).

2-D feature matrices (dense, multi-hot) are stored as numbered scalar columns
(``dense_0 .. dense_7``) so any parquet reader can use them; ``column_names`` expands a
group name back to its columns for the dataloader.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.errors import writing
from core.features.ops import Columns


def flatten(columns: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Pick ``names`` from ``columns``, splitting 2-D matrices into numbered columns."""
    flat: dict[str, np.ndarray] = {}
    for name in names:
        values = columns[name]
        if values.ndim == 2:
            for j in range(values.shape[1]):
                flat[f"{name}_{j}"] = np.ascontiguousarray(values[:, j])
        else:
            flat[name] = values
    return flat


def write_parquet(
    path: Path,
    columns: Mapping[str, np.ndarray],
    row_group_size: int = 262_144,
) -> None:
    """Write columns uncompressed and without dictionaries: the loader's fastest layout.

    The file is written beside ``path`` and renamed over it, so a reader that has the old
    file memory-mapped keeps reading the old file instead of crashing on a truncated one.
    """
    table = pa.table({name: pa.array(values) for name, values in columns.items()})
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with writing(path):  # arrow's errors name the temporary file, or no file
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            table,
            temporary,
            row_group_size=row_group_size,
            compression="none",
            use_dictionary=False,
        )
        os.replace(temporary, path)


def column_names(path: Path, group: str) -> list[str]:
    """The stored columns of a group: ``group`` itself or ``group_0, group_1, ...``."""
    names = pq.ParquetFile(path).schema_arrow.names
    if group in names:
        return [group]
    numbered = [n for n in names if n.startswith(f"{group}_") and n[len(group) + 1 :].isdigit()]
    if not numbered:
        raise KeyError(f"{path} has no column or column group {group!r}")
    return sorted(numbered, key=lambda n: int(n[len(group) + 1 :]))


def read_columns(path: Path, names: Sequence[str], max_rows: int | None = None) -> Columns:
    """Read whole columns into numpy (for small tables such as the evaluation splits), or
    their first ``max_rows`` rows, a row group at a time."""
    if max_rows is None:
        table = pq.read_table(path, columns=list(names))
    else:
        batches, rows = [], 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536, columns=list(names)):
            batches.append(batch.slice(0, max_rows - rows))
            rows += batches[-1].num_rows
            if rows >= max_rows:
                break
        schema = pq.read_schema(path)
        table = pa.Table.from_batches(batches, schema=pa.schema([schema.field(n) for n in names]))
    return {name: table.column(name).to_numpy() for name in names}
