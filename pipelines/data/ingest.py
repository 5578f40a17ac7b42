"""A team's own data into Cascade's raw schema: checked, converted, written once.

``ingest`` reads the files a dataset file names (``dataset_file.py``) and writes, into one
output directory: ``interactions/part-*.parquet`` (internal ids, ``rating`` 5/3/1 from the
positive rule, ``timestamp`` in unix seconds, ``weight`` when the rule weighs events),
``users.parquet`` and ``items.parquet`` (every known id with its declared features),
``user_ids.parquet``/``item_ids.parquet`` (the ``IdMap``s), ``schema.json`` and ``ingest.json``
(counts, files, seconds). ``load_ingested`` reads it back as a ``RawDataset``.

The user and item tables are small: they are read whole and checked first. The interactions
are streamed batch by batch in one pass that checks each batch and converts it; once a problem
is found, later batches are only checked (to count the bad rows) and the run ends with one
error naming the file, the column and the first bad row. Everything is written to a temporary
sibling directory, renamed into place at the end, so a failed run leaves nothing behind.
Progress goes to ``log`` as plain lines (rows so far, the file being read) every
``pipelines.progress.PROGRESS_S`` seconds, and one line at the end.

Ids: integer id columns keep their ids (identity map; CSV ids count as integers when every one
is written as a positive integer); any other id gets an internal id in first-seen order, table
rows first. When a later file breaks the integer guess, the run starts again with string ids.

Its parts: ``ingest_problems`` (bad rows, one error), ``ingest_ids`` (the id mapping),
``ingest_values`` (timestamps, the positive rule), ``ingest_tables`` (user and item tables).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.features.schema import Feature, FeatureSchema
from core.ids import IdKind, IdMap
from pipelines.data.dataset_file import DatasetFile
from pipelines.data.ingest_ids import KindMismatch, SideIds
from pipelines.data.ingest_problems import Problems
from pipelines.data.ingest_tables import Table, read_table
from pipelines.data.ingest_values import Outcomes, seconds
from pipelines.data.reader import Batch, file_format, file_schema, list_files, read_batches
from pipelines.data.schema import RawDataset
from pipelines.progress import Every

PART_ROWS = 1 << 24  # rows per written interactions file

Log = Callable[[str], None]


class _Progress:
    """A line every ``every_s`` seconds while the interactions stream: rows so far, their
    rate, the file being read (its position among the files)."""

    def __init__(self, log: Log | None, files: list[Path], every_s: float | None) -> None:
        self.log, self.every = log, Every(every_s)
        self.position = {str(path): n for n, path in enumerate(files, 1)}

    def batch(self, batch: Batch, rows: int, checking: bool) -> None:
        if self.log is None or not self.every.due():
            return
        rate = rows / max(self.every.elapsed(), 1e-9)
        doing = "checking only (a problem was found)" if checking else "converting"
        self.log(
            f"ingest: {rows:,} rows read, {rate:,.0f} rows/s; file {self.position[str(batch.file)]}"
            f" of {len(self.position)} ({batch.file.name}); {doing}"
        )


# --- the interactions -----------------------------------------------------------------------
class _Parts:
    """``interactions/part-00000.parquet``, ... of at most ``PART_ROWS`` rows each, written by
    a thread (parquet encoding runs without the GIL, beside the conversion)."""

    def __init__(self, directory: Path, schema: pa.Schema) -> None:
        self.directory, self.schema = directory, schema
        self.count, self.rows = 0, 0
        self._writer: pq.ParquetWriter | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="cascade-write")
        self._pending: list[Future[None]] = []

    def write(self, table: pa.Table) -> None:
        while len(self._pending) >= 2:  # bounded: at most two batches wait
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._write, table))

    def _write(self, table: pa.Table) -> None:
        if self._writer is None or self.rows >= PART_ROWS:
            self._close()
            path = self.directory / f"part-{self.count:05d}.parquet"
            # uncompressed: the ids do not compress cheaply, and only Cascade reads these;
            # timestamps (sorted-ish) delta-encoded, rating and weight (few values) as dictionaries
            self._writer = pq.ParquetWriter(
                path,
                self.schema,
                compression="none",
                use_dictionary=["rating", "weight"],
                column_encoding={"timestamp": "DELTA_BINARY_PACKED"},
            )
            self.count, self.rows = self.count + 1, 0
        self._writer.write_table(table, row_group_size=1 << 20)
        self.rows += table.num_rows

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        """Wait for the writes and close the last file (raising a write's error)."""
        try:
            for future in self._pending:
                future.result()
            self._pool.submit(self._close).result()
        finally:
            self._pool.shutdown()


def _mapped(side: SideIds, values: pa.Array, batch: Batch, column: str) -> tuple:
    """One side's internal ids of a batch, marked as met, and its problems."""
    internal, found = side.find(values, batch, column)
    side.mark_seen(internal)  # harmless after a problem: the run then fails
    return internal, found


def _one_ahead(
    batches: Iterator[Batch], start: Callable[[Batch], Future[tuple]]
) -> Iterator[tuple[Batch, Future[tuple]]]:
    """Each batch with its started job, the next batch's job started before it is handed
    out, so a single worker (which keeps the batches' order) never waits for this thread."""
    waiting: deque[tuple[Batch, Future[tuple]]] = deque()
    for batch in batches:
        waiting.append((batch, start(batch)))
        if len(waiting) > 1:
            yield waiting.popleft()
    yield from waiting


def _interactions(
    dataset: DatasetFile,
    files: list[Path],
    ids: dict[str, SideIds],
    directory: Path,
    progress: _Progress,
) -> dict[str, Any]:
    """Stream, check and write the interactions of ``files``; their counts."""
    spec = dataset.spec.interactions
    outcomes = Outcomes(spec)
    weighed = spec.event is not None and bool(spec.event.weight)
    schema = pa.schema(
        [("user_id", pa.int64()), ("item_id", pa.int64()), ("rating", pa.float32())]
        + [("timestamp", pa.int64())]
        + ([("weight", pa.float32())] if weighed else [])
    )
    (directory / "interactions").mkdir()
    parts = _Parts(directory / "interactions", schema)
    problems = Problems()
    rows = {str(path): 0 for path in files}
    read = 0  # rows so far, all files
    span = [np.iinfo(np.int64).max, np.iinfo(np.int64).min]
    text = {spec.user: pa.string(), spec.item: pa.string()}
    # the user ids are mapped by a thread, one batch ahead, while this one maps the items
    # (numpy and the hash table release the GIL); problems are noted after, users first, so
    # the error is the same as in one thread
    mapper = ThreadPoolExecutor(1, thread_name_prefix="cascade-map")

    def map_users(batch: Batch) -> Future[tuple]:
        return mapper.submit(_mapped, ids["user"], batch.data.column(spec.user), batch, spec.user)

    try:
        batches = read_batches(files, spec.columns, spec.delimiter, text, plain=text)
        for batch, user_job in _one_ahead(batches, map_users):
            data = batch.data
            items, item_problems = _mapped(ids["item"], data.column(spec.item), batch, spec.item)
            stamps, bad = seconds(data.column(spec.timestamp), spec.timestamp_format)
            users, user_problems = user_job.result()
            for what, mask in user_problems + item_problems:
                problems.add(what, batch, mask)
            what = f"column {spec.timestamp!r}: timestamp is null or cannot be read"
            problems.add(what, batch, bad)
            rating, weight = outcomes.rate(data.column(spec.rule_column), batch, problems)
            rows[str(batch.file)] += data.num_rows
            read += data.num_rows
            progress.batch(batch, read, bool(problems.found))
            if problems.found:
                continue  # only checking from here on, to count the bad rows
            span = [min(span[0], int(stamps.min())), max(span[1], int(stamps.max()))]
            columns = [users, items, rating, stamps] + ([weight] if weighed else [])
            parts.write(pa.Table.from_arrays([pa.array(c) for c in columns], schema=schema))
    finally:
        mapper.shutdown(cancel_futures=True)
        parts.close()  # also on an error: the writing thread ends
    problems.raise_first()
    outcomes.check_some_positive(dataset.resolve(spec.path))
    return {
        "rows": read,
        "ratings": outcomes.counts,
        "timestamps": span if read else None,
        "files": [{"path": p, "bytes": os.path.getsize(p), "rows": n} for p, n in rows.items()],
    }


# --- the whole run --------------------------------------------------------------------------
def _side_frame(ids: SideIds, table: Table | None, column: str) -> pd.DataFrame:
    frame = pd.DataFrame({column: ids.internal_ids()})
    if table is not None:
        frame = frame.merge(table.frame.rename(columns={"id": column}), on=column, how="left")
        for name in table.separators:
            frame[name] = frame[name].fillna("")
    return frame


def _stored_schema(schema: FeatureSchema, tables: dict[str, Table | None]) -> FeatureSchema:
    """The declared schema with each multi-categorical feature's stored separator."""

    def side(features: tuple[Feature, ...], table: Table | None) -> tuple[Feature, ...]:
        seps = table.separators if table else {}
        return tuple(
            Feature(**{**f.__dict__, "separator": seps[f.name]}) if f.name in seps else f
            for f in features
        )

    return FeatureSchema(side(schema.user, tables["user"]), side(schema.item, tables["item"]))


def _run(
    dataset: DatasetFile,
    files: list[Path],
    directory: Path,
    kinds: dict[str, IdKind],
    progress: _Progress,
) -> dict[str, Any]:
    schema = dataset.feature_schema()
    ids = {side: SideIds(side, kinds[side]) for side in ("user", "item")}
    tables: dict[str, Table | None] = {"user": None, "item": None}
    for side, spec, features in (
        ("user", dataset.spec.users, schema.user),
        ("item", dataset.spec.items, schema.item),
    ):
        if spec is not None:
            tables[side] = read_table(dataset.resolve(spec.path), spec, features, ids[side])
    summary = _interactions(dataset, files, ids, directory, progress)
    for side in ("user", "item"):
        frame = _side_frame(ids[side], tables[side], f"{side}_id")
        frame.to_parquet(directory / f"{side}s.parquet", index=False)
        ids[side].id_map().save(directory / f"{side}_ids.parquet")
        seen = ids[side].seen_ids()
        summary[f"{side}s"] = len(frame)
        summary[f"{side}s_only_in_table"] = len(frame) - len(seen)
        table = tables[side]
        summary[f"{side}s_without_attributes"] = (
            int((~np.isin(seen, table.frame["id"].to_numpy())).sum()) if table is not None else None
        )
    summary["id_kinds"] = {side: ids[side].kind for side in ("user", "item")}
    stored = _stored_schema(schema, tables)
    (directory / "schema.json").write_text(json.dumps(stored.to_dict(), indent=2))
    return summary


def _guess_kinds(dataset: DatasetFile, first: Path) -> dict[str, IdKind]:
    """Integer ids unless the ``first`` interactions file types an id column as text (CSV
    columns are text until their values are seen)."""
    spec = dataset.spec.interactions
    schema = file_schema(first, spec.delimiter)
    kinds: dict[str, IdKind] = {}
    for side, column in (("user", spec.user), ("item", spec.item)):
        typed = schema.field(column).type if column in schema.names else pa.int64()
        text = file_format(first) != "csv" and not pa.types.is_integer(typed)
        kinds[side] = "str" if text else "int"
    return kinds


def ingest(
    dataset: DatasetFile, output: Path, log: Log | None = None, every_s: float | None = None
) -> dict[str, Any]:
    """Check and convert ``dataset`` into ``output`` (replaced if present); the summary also
    written to ``output/ingest.json``. DataError naming the file, column and first bad row.
    Progress lines go to ``log``, at most one per ``every_s`` seconds (``PROGRESS_S`` when not
    given), and one at the end."""
    started = time.perf_counter()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.ingest-{os.getpid()}")
    files = list_files(dataset.resolve(dataset.spec.interactions.path))
    kinds = _guess_kinds(dataset, files[0])
    while True:
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir()
        try:
            summary = _run(dataset, files, temporary, kinds, _Progress(log, files, every_s))
            break
        except KindMismatch as mismatch:
            kinds[mismatch.side] = "str"  # an id that is not an integer: string ids throughout
            if log is not None:
                log(f"ingest: {mismatch.side} ids are not all integers: reading again as strings")
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
    summary = {"name": dataset.name, "dataset_file": str(dataset.path), **summary}
    summary["seconds"] = round(time.perf_counter() - started, 3)
    (temporary / "ingest.json").write_text(json.dumps(summary, indent=2))
    previous = output.with_name(f".{output.name}.previous-{os.getpid()}")
    if output.exists():
        output.rename(previous)
    temporary.rename(output)
    shutil.rmtree(previous, ignore_errors=True)
    if log is not None:
        rate, read = summary["rows"] / max(summary["seconds"], 1e-9), len(summary["files"])
        log(
            f"ingest: {summary['rows']:,} interactions from {read} file{'s' * (read != 1)}"
            f" in {summary['seconds']:.1f} s ({rate:,.0f} rows/s): {summary['users']:,} users,"
            f" {summary['items']:,} items"
        )
    return summary


def load_ingested(directory: Path) -> RawDataset:
    """The data set ``ingest`` wrote into ``directory``, in memory."""
    directory = Path(directory)
    meta = json.loads((directory / "ingest.json").read_text())
    schema = FeatureSchema.from_dict(json.loads((directory / "schema.json").read_text()))
    parts = sorted((directory / "interactions").glob("part-*.parquet"))
    interactions = pa.concat_tables([pq.read_table(p) for p in parts]).to_pandas()
    return RawDataset(
        meta["name"],
        pd.read_parquet(directory / "users.parquet"),
        pd.read_parquet(directory / "items.parquet"),
        interactions,
        schema=schema,
        user_ids=IdMap.load(directory / "user_ids.parquet"),
        item_ids=IdMap.load(directory / "item_ids.parquet"),
    )
