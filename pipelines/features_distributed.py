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

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from distributed import Client, Future, LocalCluster

from core.features.ops import Columns, TargetEncode
from core.features.spec import build_workflow
from core.features.workflow import Workflow
from pipelines.partitions import (
    PARTITION_ROWS,
    SPLIT_PARTS,
    attribute_tables,
    labelled_part,
    op_summaries,
    partitions,
    read_schema,
    stages,
    training_outputs,
)


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
    tables = client.submit(attribute_tables, Path(directory), schema)
    return client.map(
        labelled_part,
        partitions(directory, rows),
        tables=tables,
        seed=seed,
        fractions=fractions,
        part=part,
    )


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
        summaries = client.gather(client.map(op_summaries, rows, folds, ops=stage))
        for i, op in enumerate(stage):
            op.combine([summary[i] for summary in summaries])
        [fitted] = client.scatter([stage], broadcast=True)
        rows = client.map(training_outputs, rows, folds, ops=fitted)
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
