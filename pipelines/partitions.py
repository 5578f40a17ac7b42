"""The ingested interactions as partitions, and the feature fit's per-partition steps.

An ingested data set (``pipelines/data/ingest.py``) is ``interactions/part-*.parquet`` beside
``users.parquet``, ``items.parquet`` and ``schema.json``. A partition is whole row groups of
one part file; in file order, the partitions' rows are the interactions in order. Both the
Dask fit (``features_distributed``) and the one-process streaming prepare
(``prepare_streaming``) read, split and label partitions with these functions, and fit the
workflow stage by stage: a stage's ops read no output of another op of the same stage.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from core.errors import DataError
from core.features.ops import Columns, FeatureOp, TargetEncode
from core.features.rows import AttributeTable, labelled_rows
from core.features.schema import FeatureSchema
from pipelines.data.schema import INTERACTION_COLUMNS, RawDataset
from pipelines.split import hashed_split

PARTITION_ROWS = 1 << 21  # rows per partition: whole row groups up to about this many
SPLIT_PARTS = ("train", "valid", "test")


@dataclass(frozen=True)
class Partition:
    """Row groups ``groups`` of the interactions file ``path``: one task's rows."""

    path: Path
    groups: tuple[int, ...]


def partitions(directory: Path, rows: int = PARTITION_ROWS) -> list[Partition]:
    """The ingested interactions of ``directory`` as partitions of whole row groups of about
    ``rows`` rows, in file order (so their rows, in order, are the interactions in order)."""
    files = sorted((Path(directory) / "interactions").glob("part-*.parquet"))
    if not files:
        raise DataError(directory, "no interactions/part-*.parquet: not an ingested data set")
    out: list[Partition] = []
    for path in files:
        metadata = pq.ParquetFile(path).metadata
        group: list[int] = []
        size = 0
        for i in range(metadata.num_row_groups):
            if group and size + metadata.row_group(i).num_rows > rows:
                out.append(Partition(path, tuple(group)))
                group, size = [], 0
            group.append(i)
            size += metadata.row_group(i).num_rows
        if group:
            out.append(Partition(path, tuple(group)))
    return out


def read_schema(directory: Path) -> FeatureSchema:
    """The feature schema an ingested data set recorded."""
    path = Path(directory) / "schema.json"
    if not path.is_file():
        raise DataError(directory, "schema.json is missing: not an ingested data set")
    return FeatureSchema.from_dict(json.loads(path.read_text()))


def attribute_tables(
    directory: Path, schema: FeatureSchema
) -> tuple[AttributeTable, AttributeTable]:
    """The user and item attributes (small tables, read whole)."""
    users = pd.read_parquet(Path(directory) / "users.parquet")
    items = pd.read_parquet(Path(directory) / "items.parquet")
    return (
        AttributeTable(users, "user_id", schema.user_attributes),
        AttributeTable(items, "item_id", schema.item_attributes),
    )


def labelled_part(
    partition: Partition,
    tables: tuple[AttributeTable, AttributeTable],
    seed: int,
    fractions: tuple[float, float, float],
    part: str,
) -> Columns:
    """The labelled rows of ``part`` in this partition, in row order."""
    interactions = pq.ParquetFile(partition.path).read_row_groups(list(partition.groups))
    frame = interactions.to_pandas()
    split = hashed_split(frame[list(INTERACTION_COLUMNS)], seed, fractions)
    return labelled_rows(frame.iloc[getattr(split, part)], *tables)


def stages(ops: Sequence[FeatureOp]) -> list[list[FeatureOp]]:
    """Runs of consecutive ops that read no output of an op in the same run: each run is
    fitted in one round (summaries, combine, transform)."""
    out: list[list[FeatureOp]] = []
    written: set[str] = set()
    for op in ops:
        needs = set(op.inputs) | ({op.target} if isinstance(op, TargetEncode) else set())
        if not out or needs & written:
            out.append([])
            written = set()
        out[-1].append(op)
        written |= set(op.outputs)
    return out


def op_summaries(columns: Columns, folds: dict[int, np.ndarray], ops: list[FeatureOp]) -> list[Any]:
    """Each op's summary of this partition's rows."""
    return [
        op.partial_fit(columns, folds[i])
        if isinstance(op, TargetEncode)
        else op.partial_fit(columns)
        for i, op in enumerate(ops)
    ]


def training_outputs(
    columns: Columns, folds: dict[int, np.ndarray], ops: list[FeatureOp]
) -> Columns:
    """The rows with the fitted ops' training outputs added (target
    encoding out of fold)."""
    out = dict(columns)
    for i, op in enumerate(ops):
        out.update(
            op.out_of_fold(out, folds[i]) if isinstance(op, TargetEncode) else op.transform(out)
        )
    return out


def write_partitions(dataset: RawDataset, directory: Path, file_rows: int, group_rows: int) -> None:
    """A data set held in memory (MovieLens, synthetic) in the layout ``ingest`` writes:
    ``interactions/part-*.parquet`` of ``file_rows`` rows in row groups of ``group_rows``,
    ``users.parquet``, ``items.parquet`` and ``schema.json``."""
    interactions = Path(directory) / "interactions"
    interactions.mkdir(parents=True, exist_ok=True)
    frame = dataset.interactions
    for number, start in enumerate(range(0, max(len(frame), 1), file_rows)):
        chunk = frame.iloc[start : start + file_rows]
        chunk.to_parquet(
            interactions / f"part-{number:05d}.parquet", index=False, row_group_size=group_rows
        )
    dataset.users.to_parquet(Path(directory) / "users.parquet", index=False)
    dataset.items.to_parquet(Path(directory) / "items.parquet", index=False)
    (Path(directory) / "schema.json").write_text(json.dumps(dataset.schema.to_dict()))
