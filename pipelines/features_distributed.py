"""The feature workflow fitted on a Dask cluster, from the ingested parquet partitions.

Each worker reads its own partitions (row groups of ``interactions/part-*.parquet``), keeps
its rows of the hashed split's part, joins the user and item attributes and holds the rows
in memory. The driver never sees a row: per stage of the workflow (ops whose inputs the
stage before produced), the workers summarise their rows (``FeatureOp.partial_fit``), the
driver combines the summaries (``combine``, exact) and sends the fitted ops back, and the
workers add the ops' outputs to their rows. The result equals ``Workflow.fit_transform`` on
the same training rows in one process, vocabularies, counts and float statistics bit for
bit, and so do the encoded rows.

The one sequential part is target encoding's fold assignment, drawn by one seeded generator
in row order: the driver draws it part after part (one byte per training row) and scatters
it. The cluster is a ``LocalCluster`` of worker processes on loopback by default, or any
scheduler's address (a Dask cluster in Kubernetes).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from distributed import Client, Future, LocalCluster

from core.errors import DataError
from core.features.ops import Columns, FeatureOp, TargetEncode
from core.features.rows import AttributeTable, labelled_rows
from core.features.schema import FeatureSchema
from core.features.spec import build_workflow
from core.features.workflow import Workflow
from pipelines.data.schema import INTERACTION_COLUMNS, RawDataset
from pipelines.split import hashed_split

PARTITION_ROWS = 1 << 21  # rows per partition: whole row groups up to about this many
SPLIT_PARTS = ("train", "valid", "test")


@contextmanager
def dask_client(workers: int = 2, scheduler: str | None = None) -> Iterator[Client]:
    """A client of the scheduler at ``scheduler`` (``tcp://host:8786``), or of a
    ``LocalCluster`` of ``workers`` single-threaded processes listening on loopback only,
    with no dashboard; the local cluster is closed on exit."""
    if scheduler is not None:
        with Client(scheduler) as client:
            yield client
        return
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


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


def _attribute_tables(
    directory: Path, schema: FeatureSchema
) -> tuple[AttributeTable, AttributeTable]:
    """Runs on a worker: the user and item attributes (small tables, read whole)."""
    users = pd.read_parquet(Path(directory) / "users.parquet")
    items = pd.read_parquet(Path(directory) / "items.parquet")
    return (
        AttributeTable(users, "user_id", schema.user_attributes),
        AttributeTable(items, "item_id", schema.item_attributes),
    )


def _labelled_part(
    partition: Partition,
    tables: tuple[AttributeTable, AttributeTable],
    seed: int,
    fractions: tuple[float, float, float],
    part: str,
) -> Columns:
    """Runs on a worker: the labelled rows of ``part`` in this partition, in row order."""
    interactions = pq.ParquetFile(partition.path).read_row_groups(list(partition.groups))
    frame = interactions.to_pandas()
    split = hashed_split(frame[list(INTERACTION_COLUMNS)], seed, fractions)
    return labelled_rows(frame.iloc[getattr(split, part)], *tables)


def load_rows(
    client: Client,
    directory: Path,
    part: str = "train",
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    rows: int = PARTITION_ROWS,
) -> list[Future]:
    """One future per partition of ``directory``: its labelled rows of the hashed split's
    ``part``, read, split and joined on the workers."""
    if part not in SPLIT_PARTS:
        raise ValueError(f"part must be one of {SPLIT_PARTS}, got {part!r}")
    schema = read_schema(directory)
    tables = client.submit(_attribute_tables, Path(directory), schema)
    return client.map(
        _labelled_part,
        partitions(directory, rows),
        tables=tables,
        seed=seed,
        fractions=fractions,
        part=part,
    )


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


def _summaries(columns: Columns, folds: dict[int, np.ndarray], ops: list[FeatureOp]) -> list[Any]:
    """Runs on a worker: each op's summary of this partition's rows."""
    return [
        op.partial_fit(columns, folds[i])
        if isinstance(op, TargetEncode)
        else op.partial_fit(columns)
        for i, op in enumerate(ops)
    ]


def _training_outputs(
    columns: Columns, folds: dict[int, np.ndarray], ops: list[FeatureOp]
) -> Columns:
    """Runs on a worker: the rows with the fitted ops' training outputs added (target
    encoding out of fold)."""
    out = dict(columns)
    for i, op in enumerate(ops):
        out.update(
            op.out_of_fold(out, folds[i]) if isinstance(op, TargetEncode) else op.transform(out)
        )
    return out


def _length(columns: Columns) -> int:
    return len(columns["label"])


def fit(client: Client, rows: list[Future], workflow: Workflow) -> list[Future]:
    """Fit ``workflow`` on the training rows held by the futures ``rows`` (from
    ``load_rows``, in row order); returns the futures of the encoded training rows (what
    ``Workflow.fit_transform`` returns, per partition)."""
    lengths = client.gather(client.map(_length, rows))
    for stage in stages(workflow.ops):
        folds: list[dict[int, Any]] = [{} for _ in rows]
        for i, op in enumerate(stage):
            if isinstance(op, TargetEncode):  # drawn in row order, partition after partition
                generator = op.fold_generator()
                drawn = [op.draw_folds(generator, n) for n in lengths]
                for part, future in zip(folds, client.scatter(drawn), strict=True):
                    part[i] = future
        summaries = client.gather(client.map(_summaries, rows, folds, ops=stage))
        for i, op in enumerate(stage):
            op.combine([summary[i] for summary in summaries])
        [fitted] = client.scatter([stage], broadcast=True)
        rows = client.map(_training_outputs, rows, folds, ops=fitted)
    return rows


def _transformed(columns: Columns, workflow: Workflow) -> Columns:
    return workflow.transform(columns)


def transform(client: Client, rows: list[Future], workflow: Workflow) -> list[Future]:
    """``workflow.transform`` of the rows held by the futures ``rows``, on the workers."""
    [fitted] = client.scatter([workflow], broadcast=True)
    return client.map(_transformed, rows, workflow=fitted)


def fit_ingested(
    client: Client,
    directory: Path,
    seed: int = 0,
    min_frequency: int = 1,
    rows: int = PARTITION_ROWS,
) -> Workflow:
    """The workflow ``prepare`` fits for the ingested data set in ``directory`` (hashed
    split of ``seed``), fitted on the cluster of ``client``."""
    workflow = build_workflow(read_schema(directory), min_frequency=min_frequency, seed=seed)
    encoded = fit(client, load_rows(client, directory, "train", seed, rows=rows), workflow)
    client.cancel(encoded)  # the encoded rows are not needed here: free the workers' memory
    return workflow


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
