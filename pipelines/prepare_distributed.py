"""The prepare step's feature fit and ranking rows on a Dask cluster (``--fit-workers``,
``--dask-scheduler``).

The data set ``prepare`` was given is written as parquet partitions; the workers read them,
fit the workflow with the driver (``features_distributed.fit``: the same fitted workflow as
the in-memory fit), encode the validation and test rows, and each writes its partition's
ranking rows as a piece. The driver then streams the pieces into the one
``ranking_{train,valid,test}.parquet`` file per split the training steps read, a row group at
a time, so it never holds the encoded rows.

Row order: validation and test rows stay in row order (the files equal the in-memory ones).
The in-memory path permutes all training rows at once; here each worker permutes its own
rows, and every row group of the merged file takes rows from every piece in proportion to
the rows it has left, then is permuted. So every row group is still a random sample of all
training rows (stratified by partition), which is what the loader's shuffle buffer relies
on, without a cluster-wide shuffle. The order is not the in-memory one: the rows are.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
from distributed import Client, Future

from core.errors import ConfigError
from core.features.workflow import Workflow
from pipelines import features_distributed as fd
from pipelines.data.schema import RawDataset
from pipelines.partitions import PARTITION_ROWS, SPLIT_PARTS, write_partitions
from pipelines.ranking_files import RANKING_GROUP_ROWS, merge_pieces, write_piece
from pipelines.split import Split, hashed_split

PARTITIONS_PER_WORKER = 4  # small data sets: still a few partitions for every worker


def same_split(left: Split, right: Split) -> bool:
    return all(np.array_equal(getattr(left, part), getattr(right, part)) for part in SPLIT_PARTS)


def _write_split(
    client: Client,
    encoded: list[Future],
    workdir: Path,
    name: str,
    seed: int,
    names: tuple[str, ...],
) -> None:
    """``ranking_<name>.parquet`` from the encoded rows on the workers (training rows
    shuffled as the module says)."""
    pieces_dir = workdir / f"ranking_{name}.pieces"
    shutil.rmtree(pieces_dir, ignore_errors=True)
    pieces = [pieces_dir / f"part-{i:05d}.parquet" for i in range(len(encoded))]
    shuffle = name == "train"
    seeds = [(seed, i) if shuffle else None for i in range(len(encoded))]
    client.gather(client.map(write_piece, encoded, pieces, seeds, names=names))
    rng = np.random.default_rng(seed) if shuffle else None
    merge_pieces(pieces, workdir / f"ranking_{name}.parquet", rng, RANKING_GROUP_ROWS)
    shutil.rmtree(pieces_dir)


def fit_on_cluster(
    cluster: tuple[int | None, str | None],
    dataset: RawDataset,
    split: Split,
    workdir: Path,
    workflow: Workflow,
    seed: int,
    names: tuple[str, ...],
) -> None:
    """Fit ``workflow`` on the hashed split's training rows of ``dataset`` on the cluster
    ``cluster`` (local workers, or a scheduler's address) and write
    ``ranking_{train,valid,test}.parquet`` (columns ``names``) into ``workdir``. Any other
    ``split`` is refused before a cluster starts: the workers split their partitions by
    each row's own hash."""
    if not same_split(split, hashed_split(dataset.interactions, seed)):
        raise ConfigError(
            "--fit-workers/--dask-scheduler support the default hashed split only (each "
            "worker splits its own rows by their hash); this split chooses rows by others"
        )
    workers, scheduler = cluster
    with fd.dask_client(1 if workers is None else workers, scheduler) as client:
        _fit_and_write(client, dataset, workdir, workflow, seed, names)


def _fit_and_write(
    client: Client,
    dataset: RawDataset,
    workdir: Path,
    workflow: Workflow,
    seed: int,
    names: tuple[str, ...],
) -> None:
    """Partitions of ``dataset`` (about four per worker, at most ``PARTITION_ROWS`` rows),
    the fit, and the three ranking files; the partitions are removed after."""
    workers = max(1, len(client.scheduler_info()["workers"]))
    rows = math.ceil(max(len(dataset.interactions), 1) / (workers * PARTITIONS_PER_WORKER))
    rows = min(PARTITION_ROWS, rows)
    partitions = workdir / "fit_partitions"
    shutil.rmtree(partitions, ignore_errors=True)
    write_partitions(dataset, partitions, file_rows=rows, group_rows=rows)
    try:
        train = fd.fit(client, fd.load_rows(client, partitions, "train", seed, rows=rows), workflow)
        _write_split(client, train, workdir, "train", seed, names)
        client.cancel(train)
        for part in ("valid", "test"):
            held_out = fd.load_rows(client, partitions, part, seed, rows=rows)
            encoded = fd.transform(client, held_out, workflow)
            _write_split(client, encoded, workdir, part, seed, names)
            client.cancel([*held_out, *encoded])
    finally:
        shutil.rmtree(partitions, ignore_errors=True)
