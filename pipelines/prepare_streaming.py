"""The prepare step for an ingested data set larger than memory, in one process.

``prepare`` holds every interaction in memory (pandas), several times over while it encodes.
This one reads the ingested ``interactions/part-*.parquet`` a partition at a time
(``pipelines/partitions.py``) and writes what ``prepare`` writes, from the same hashed split:

1. the fit, one pass per stage of the workflow: read, split (each row's own hash), label,
   add the outputs of the stages fitted so far, summarise; one running summary per op
   (``FeatureOp.merge``), combined once at the end of the pass;
2. the encoding pass: each partition's ranking rows as a piece (``pipelines/ranking_files.py``),
   its retrieval positives, and its rows spilled into buckets by user;
3. one bucket at a time: the online histories and each user's recent training positives.

Equal to ``prepare`` on the same data: the workflow, the validation and test ranking files,
``retrieval.npz`` and the online tables (tested). The training ranking file holds the same
rows in another order (each row group a random sample, as on a Dask cluster).

Memory: one partition's rows, one bucket, the catalog (users, items, id maps) and the fitted
workflow. The retrieval positives go to disk a partition at a time and into ``retrieval.npz``
a piece at a time (the towers, which train on them, hold them: 16 bytes per positive).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.features.ops import Columns, FeatureOp, TargetEncode
from core.features.rows import AttributeTable, labelled_rows
from core.features.spec import WEIGHT, build_workflow
from core.features.workflow import Workflow
from core.ids import ITEM_ID_MAP, USER_ID_MAP, IdMap
from pipelines.data.schema import INTERACTION_COLUMNS
from pipelines.partitions import (
    PARTITION_ROWS,
    Partition,
    op_summaries,
    partitions,
    read_schema,
    stages,
    training_outputs,
)
from pipelines.prepare import (
    SPLITS,
    RetrievalData,
    item_log_q,
    item_tower_inputs,
    positive_pairs,
    ranking_parquet_columns,
    recent_history,
    user_histories,
    user_tower_inputs,
)
from pipelines.progress import Every
from pipelines.ranking_files import RANKING_GROUP_ROWS, merge_pieces, write_piece
from pipelines.split import Split, hashed_split

BUCKET_ROWS = 1 << 21  # interactions per user bucket, about: the most held at once for histories
SPILLED = ("user_id", "item_id", "rating", "timestamp")


@dataclass(frozen=True)
class IngestedInfo:
    """What the pipeline records of the data (``dataset.json``), read without loading it."""

    name: str
    users: int
    items: int
    interactions: int
    newest_timestamp: int
    data_hash: str  # equals RawDataset.content_hash() of the same data


def ingested_rows(directory: Path) -> int:
    """Interactions of an ingested data set, from the part files' metadata."""
    parts = sorted((Path(directory) / "interactions").glob("part-*.parquet"))
    return sum(pq.ParquetFile(p).metadata.num_rows for p in parts)


def describe(directory: Path) -> IngestedInfo:
    """Counts, the newest timestamp and the content hash, one column at a time."""
    directory = Path(directory)
    parts = sorted((directory / "interactions").glob("part-*.parquet"))
    users = pq.ParquetFile(directory / "users.parquet").metadata.num_rows
    items = pq.ParquetFile(directory / "items.parquet").metadata.num_rows
    digest, newest = hashlib.sha256(), None
    for column in INTERACTION_COLUMNS:  # the bytes RawDataset.content_hash digests, in order
        for path in parts:
            for batch in pq.ParquetFile(path).iter_batches(columns=[column]):
                values = batch.column(0).to_numpy(zero_copy_only=False)
                digest.update(values.tobytes())
                if column == "timestamp" and len(values):
                    top = int(values.max())
                    newest = top if newest is None else max(newest, top)
    digest.update(str(users).encode())
    digest.update(str(items).encode())
    name = json.loads((directory / "ingest.json").read_text())["name"]
    return IngestedInfo(
        name, users, items, ingested_rows(directory), newest or 0, digest.hexdigest()[:16]
    )


class _Reader:
    """Partitions read with their hashed split, computed on the first read and kept on disk
    (a byte per row) for the passes after it."""

    def __init__(self, parts: list[Partition], seed: int, scratch: Path) -> None:
        self.parts, self.seed, self.codes = parts, seed, scratch / "splits"
        self.codes.mkdir(parents=True, exist_ok=True)

    def __iter__(self) -> Iterator[tuple[int, pd.DataFrame, Split]]:
        for number, partition in enumerate(self.parts):
            table = pq.ParquetFile(partition.path).read_row_groups(list(partition.groups))
            frame = table.to_pandas()
            saved = self.codes / f"part-{number:05d}.npy"
            if saved.is_file():
                code = np.load(saved)
                split = Split(*(np.flatnonzero(code == k) for k in range(len(SPLITS))))
            else:
                split = hashed_split(frame[list(INTERACTION_COLUMNS)], self.seed)
                code = np.zeros(len(frame), dtype=np.uint8)
                for k, part in enumerate((split.train, split.valid, split.test)):
                    code[part] = k
                np.save(saved, code)
            yield number, frame, split


def _folds(
    ops: list[FeatureOp], generators: dict[int, np.random.Generator], rows: int
) -> dict[int, np.ndarray]:
    """The next ``rows`` fold draws of each target encoding in ``ops`` (drawn in row order,
    partition after partition: the draws of all rows at once)."""
    return {
        i: op.draw_folds(generators[id(op)], rows)
        for i, op in enumerate(ops)
        if isinstance(op, TargetEncode)
    }


def _generators(workflow: Workflow) -> dict[int, np.random.Generator]:
    return {id(op): op.fold_generator() for op in workflow.ops if isinstance(op, TargetEncode)}


def _encoded_training_rows(
    rows: Columns, fitted: list[list[FeatureOp]], generators: dict[int, np.random.Generator]
) -> Columns:
    """Training rows with the outputs of the fitted stages (target encodings out of fold)."""
    length = len(rows["label"])
    for stage in fitted:
        rows = training_outputs(rows, _folds(stage, generators, length), stage)
    return rows


def _fit(
    reader: _Reader,
    tables: tuple[AttributeTable, AttributeTable],
    workflow: Workflow,
    log: Callable[[str], None],
) -> bool:
    """Fit ``workflow`` on the training rows, one pass per stage; True when some event's
    weight is not 1 (the ranking rows then carry the weights)."""
    weighted = False
    fitted: list[list[FeatureOp]] = []
    all_stages = stages(workflow.ops)
    every = Every()
    for number, stage in enumerate(all_stages, 1):
        generators = _generators(workflow)
        running: list | None = None
        for part, frame, split in reader:
            if every.due():
                log(
                    f"prepare: fitting stage {number} of {len(all_stages)}: partition"
                    f" {part + 1} of {len(reader.parts)}"
                )
            if WEIGHT in frame and number == 1:
                weighted = weighted or not bool(np.all(frame[WEIGHT].to_numpy() == 1.0))
            rows = _encoded_training_rows(
                labelled_rows(frame.iloc[split.train], *tables), fitted, generators
            )
            summaries = op_summaries(rows, _folds(stage, generators, len(rows["label"])), stage)
            running = (
                summaries
                if running is None
                else [op.merge([r, s]) for op, r, s in zip(stage, running, summaries, strict=True)]
            )
        assert running is not None  # partitions() never returns no partition
        for op, summary in zip(stage, running, strict=True):
            op.combine([summary])
        fitted.append(stage)
        log(f"prepare: fitted stage {number} of {len(all_stages)} ({len(stage)} ops)")
    return weighted


class _Buckets:
    """Interactions spilled by user range: bucket ``b`` holds every row of its users, in
    row order, so one bucket at a time sees each of its users' whole history."""

    def __init__(self, directory: Path, user_ids: np.ndarray, buckets: int) -> None:
        self.directory = directory
        ordered = np.sort(user_ids)
        self.cuts = ordered[(np.arange(1, buckets) * len(ordered)) // buckets]
        self.count = buckets
        self.writers: dict[int, pq.ParquetWriter] = {}
        directory.mkdir(parents=True)

    def of(self, user_ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.cuts, user_ids, side="right")

    def path(self, bucket: int) -> Path:
        return self.directory / f"bucket-{bucket:05d}.parquet"

    def write(self, frame: pd.DataFrame, training: np.ndarray) -> None:
        rows = frame[list(SPILLED)].assign(training=training)
        bucket = self.of(rows["user_id"].to_numpy())
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(self.count + 1))
        for b in range(self.count):
            if bounds[b] == bounds[b + 1]:
                continue
            table = pa.Table.from_pandas(
                rows.iloc[order[bounds[b] : bounds[b + 1]]], preserve_index=False
            )
            if b not in self.writers:
                self.writers[b] = pq.ParquetWriter(self.path(b), table.schema, compression="none")
            self.writers[b].write_table(table)

    def read(self) -> Iterator[tuple[int, pd.DataFrame]]:
        """Each bucket's rows, bucket after bucket (users in ascending id ranges)."""
        for writer in self.writers.values():
            writer.close()
        for b in range(self.count):
            if b in self.writers:
                yield b, pq.read_table(self.path(b)).to_pandas()


def prepare_ingested(
    directory: Path,
    workdir: Path,
    seed: int = 0,
    history_length: int = 20,
    rows: int = PARTITION_ROWS,
    bucket_rows: int = BUCKET_ROWS,
    log: Callable[[str], None] = print,
) -> Workflow:
    """``prepare`` (default hashed split of ``seed``) for the ingested data set in
    ``directory``, a partition of about ``rows`` rows at a time; its scratch files (split
    codes, pieces, buckets) are removed at the end, also when it fails."""
    directory, workdir = Path(directory), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    scratch = workdir / "prepare.scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        users = pd.read_parquet(directory / "users.parquet")
        items = pd.read_parquet(directory / "items.parquet")
        reader = _Reader(partitions(directory, rows), seed, scratch)
        workflow = build_workflow(read_schema(directory), seed=seed)
        buckets = _Buckets(
            scratch / "buckets",
            users["user_id"].to_numpy(),
            max(1, math.ceil(ingested_rows(directory) / bucket_rows)),
        )
        positives = _encode(
            directory, workdir, scratch, reader, (users, items), workflow, buckets, log
        )
        workflow.save(workdir / "workflow")
        history = _write_online(
            directory, workdir / "online", (users, items), buckets, workflow, history_length, log
        )
        log(f"prepare: wrote the histories of {len(users)} users ({buckets.count} buckets)")
        counts = np.zeros(len(items), np.int64)
        for piece in positives["train"]:
            counts += np.bincount(np.load(piece)[:, 1], minlength=len(items))
        item_features, item_dense = item_tower_inputs(workflow, items)
        RetrievalData(
            user_ids=users["user_id"].to_numpy(),
            item_ids=items["item_id"].to_numpy(),
            user_features=user_tower_inputs(workflow, users),
            history=history,
            item_features=item_features,
            item_dense=item_dense,
            item_log_q=item_log_q(counts),
            positives={},
        ).save(workdir / "retrieval.npz")
        _append_positives(workdir / "retrieval.npz", positives)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return workflow


def _append_positives(path: Path, pieces: dict[str, list[Path]]) -> None:
    """Add each split's positives to the ``.npz`` at ``path`` as ``RetrievalData.save`` would
    (an uncompressed ``positives_<split>.npy`` member), written a piece at a time."""
    with zipfile.ZipFile(path, "a", allowZip64=True) as archive:
        for name, files in pieces.items():
            rows = sum(np.load(f, mmap_mode="r").shape[0] for f in files)
            header = {"descr": np.dtype(np.int64).str, "fortran_order": False, "shape": (rows, 2)}
            with archive.open(f"positives_{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array_header_1_0(member, header)
                for f in files:
                    member.write(np.ascontiguousarray(np.load(f), dtype=np.int64).tobytes())


def _encode(
    directory: Path,
    workdir: Path,
    scratch: Path,
    reader: _Reader,
    catalog: tuple[pd.DataFrame, pd.DataFrame],
    workflow: Workflow,
    buckets: _Buckets,
    log: Callable[[str], None],
) -> dict[str, list[Path]]:
    """Fit ``workflow``, write the ranking files and spill the rows into ``buckets``;
    returns the files of each split's retrieval positives (user and item catalog positions,
    a file per partition, in row order)."""
    users, items = catalog
    schema = workflow.schema
    tables = (
        AttributeTable(users, "user_id", schema.user_attributes),
        AttributeTable(items, "item_id", schema.item_attributes),
    )
    weighted = _fit(reader, tables, workflow, log)
    names = (*ranking_parquet_columns(schema), *((WEIGHT,) if weighted else ()))
    catalog_index = (pd.Index(users["user_id"]), pd.Index(items["item_id"]))
    positives: dict[str, list[Path]] = {name: [] for name in SPLITS}
    fitted, generators = stages(workflow.ops), _generators(workflow)
    pieces = scratch / "pieces"
    for number, frame, split in reader:
        for name, index in zip(SPLITS, (split.train, split.valid, split.test), strict=True):
            labelled = labelled_rows(frame.iloc[index], *tables)
            encoded = (
                _encoded_training_rows(labelled, fitted, generators)
                if name == "train"
                else workflow.transform(labelled)
            )
            piece = pieces / name / f"part-{number:05d}.parquet"
            write_piece(encoded, piece, (reader.seed, number) if name == "train" else None, names)
            positives[name].append(pieces / name / f"positives-{number:05d}.npy")
            np.save(
                positives[name][-1],
                positive_pairs(frame.iloc[index], catalog_index, str(directory)),
            )
        training = np.zeros(len(frame), dtype=bool)
        training[split.train] = True
        buckets.write(frame, training)
        log(f"prepare: encoded partition {number + 1} of {len(reader.parts)}")
    for name in SPLITS:
        rng = np.random.default_rng(reader.seed) if name == "train" else None
        found = sorted((pieces / name).glob("part-*.parquet"))
        merge_pieces(found, workdir / f"ranking_{name}.parquet", rng, RANKING_GROUP_ROWS)
        log(f"prepare: wrote ranking_{name}.parquet")
    return positives


def _write_online(
    directory: Path,
    online: Path,
    catalog: tuple[pd.DataFrame, pd.DataFrame],
    buckets: _Buckets,
    workflow: Workflow,
    history_length: int,
    log: Callable[[str], None],
) -> np.ndarray:
    """The online tables (``prepare.write_online_tables``), histories a bucket at a time;
    returns each catalog user's recent training positives (the towers' history)."""
    users, items = catalog
    online.mkdir(parents=True, exist_ok=True)
    IdMap.load(directory / USER_ID_MAP).save(online / USER_ID_MAP)
    IdMap.load(directory / ITEM_ID_MAP).save(online / ITEM_ID_MAP)
    users.to_parquet(online / "users.parquet", index=False)
    items.to_parquet(online / "items.parquet", index=False)
    user_ids = users["user_id"].to_numpy()
    history = np.zeros((len(user_ids), history_length), dtype=np.int64)
    bucket_of_user = buckets.of(user_ids)
    writer: pq.ParquetWriter | None = None
    every = Every()
    try:
        for b, rows in buckets.read():
            if every.due():
                log(f"prepare: histories: bucket {b + 1} of {buckets.count}")
            table = user_histories(rows, history_length)
            if writer is None:
                writer = pq.ParquetWriter(online / "histories.parquet", table.schema)
            writer.write_table(table.cast(writer.schema))
            mine = np.flatnonzero(bucket_of_user == b)
            training = rows[rows["training"].to_numpy()]
            history[mine] = recent_history(
                workflow, training, user_ids[mine], history_length, str(directory)
            )
    finally:
        if writer is not None:
            writer.close()
    return history
