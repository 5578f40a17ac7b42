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

Ids: integer id columns keep their ids (identity map; CSV ids count as integers when every one
is written as a positive integer); any other id gets an internal id in first-seen order, table
rows first. When a later file breaks the integer guess, the run starts again with string ids.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.errors import DataError
from core.features.schema import Feature, FeatureSchema
from core.ids import MAX_ID_LENGTH, IdKind, IdMap
from pipelines.data.dataset_file import DatasetFile, InteractionsSpec, TableSpec
from pipelines.data.reader import Batch, file_format, file_schema, list_files, read_batches
from pipelines.data.schema import RawDataset
from pipelines.data.string_ids import StringIds

POSITIVE, RETRIEVAL_ONLY, NEGATIVE = 5.0, 3.0, 1.0
PART_ROWS = 1 << 24  # rows per written interactions file
SEPARATORS = ("|", ";", ",", "/", "\x1f")  # tried in order for stored multi-categorical values
_SCALE = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
_BOOLS |= {"t": True, "f": False, "y": True, "n": False}


# --- finding bad rows -----------------------------------------------------------------------
def _row(batch: Batch, position: int) -> str:
    values = {name: batch.data.column(name)[position].as_py() for name in batch.data.schema.names}
    return f"row {batch.offset + position + 1}: {values}"


@dataclass
class _Problem:
    what: str
    file: Path
    example: str
    count: int = 0


@dataclass
class Problems:
    """The first bad row of each kind of problem, and how many rows have it."""

    found: dict[str, _Problem] = field(default_factory=dict)

    def add(self, what: str, batch: Batch, bad: np.ndarray | None) -> None:
        """Note the rows of ``batch`` where ``bad`` (a boolean mask) holds."""
        if bad is None or not bad.any():
            return
        if what not in self.found:
            self.found[what] = _Problem(what, batch.file, _row(batch, int(np.argmax(bad))))
        self.found[what].count += int(bad.sum())

    def raise_first(self) -> None:
        if self.found:
            p = next(iter(self.found.values()))
            rows = "1 row" if p.count == 1 else f"{p.count} rows"
            raise DataError(p.file, f"{p.what} ({rows} in all; first at {p.example})")


def _missing(values: pa.Array) -> np.ndarray:
    return np.asarray(values.is_null(), dtype=bool)


# --- ids ------------------------------------------------------------------------------------
_EMPTY, _LONG = 1, 2  # why a string id is rejected


def _check_words(words: pa.Array) -> np.ndarray:
    """The rejection code of each new distinct string id (0: a good id)."""
    empty = np.asarray(pc.equal(pc.utf8_trim_whitespace(words), ""), dtype=bool)
    long = np.asarray(pc.greater(pc.utf8_length(words), MAX_ID_LENGTH), dtype=bool)
    return np.where(empty, _EMPTY, np.where(long, _LONG, 0)).astype(np.uint8)


class KindMismatch(Exception):
    """An id column broke the integer guess: start again with string ids."""

    def __init__(self, side: str) -> None:
        super().__init__(side)
        self.side = side


class SideIds:
    """Maps one side's external ids (users or items) to internal ids, batch by batch."""

    def __init__(self, side: str, kind: IdKind) -> None:
        self.side, self.kind = side, kind
        self.known = StringIds()
        self._seen: list[np.ndarray] = []  # integer ids met so far (merged now and then)
        self._table = np.zeros(0, np.int64)  # integer ids of the user or item table
        self._bits = np.zeros(1, bool)  # string ids of the table met: _bits[internal id]
        self._table_count = 0  # string ids numbered by the user or item table

    def map(self, values: pa.Array, batch: Batch, column: str, problems: Problems) -> np.ndarray:
        """The internal ids of ``values`` (0 where an id is bad; the bad rows are noted)."""
        internal, found = self.find(values, batch, column)
        for what, bad in found:
            problems.add(what, batch, bad)
        return internal

    def find(self, values: pa.Array, batch: Batch, column: str) -> tuple[np.ndarray, list]:
        """The internal ids of ``values`` (0 where an id is bad) and the problems found, as
        (what, mask of bad rows) pairs. Only this side's state is touched, so the two sides
        can be mapped in two threads and their problems noted in a fixed order after."""
        what = f"column {column!r}: {self.side} id"
        if self.kind == "int":
            null = _missing(values)
            if pa.types.is_string(values.type) and file_format(batch.file) == "csv":
                if not canonical_ints(values):
                    raise KindMismatch(self.side)
                values = values.cast(pa.int64())
            if not pa.types.is_integer(values.type):
                raise KindMismatch(self.side)
            ints = values.cast(pa.int64()).fill_null(0).to_numpy()
            below = (ints <= 0) & ~null
            found = [(f"{what} is null", null), (f"{what} is not >= 1 (0 means unknown)", below)]
            return np.where(ints > 0, ints, 0), found
        if pa.types.is_dictionary(values.type):  # each distinct word once, then per row
            words, codes = self._strings(values.dictionary)
            index = values.indices.fill_null(len(words)).to_numpy()
            internal = np.append(words, 0)[index]
            if codes is not None or values.null_count:
                known = np.zeros(len(words), np.uint8) if codes is None else codes
                codes = np.append(known, _EMPTY)[index]
        else:
            internal, codes = self._strings(values)
        if codes is None:
            return internal, []
        return internal, [
            (f"{what} is null or empty", codes == _EMPTY),
            (f"{what} is longer than {MAX_ID_LENGTH} characters", codes == _LONG),
        ]

    def _strings(self, values: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
        """Internal ids and problem codes (or None) of a text column, row by row."""
        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            values = values.cast(pa.string())
        if values.null_count:  # a null is rejected as the empty string is
            values = values.fill_null("")
        return self.known.lookup(values, _check_words)

    def mark_seen(self, internal: np.ndarray) -> None:
        """Note the ids met in the interactions (to count the ids met only in a table)."""
        if self.kind == "int":
            self._seen.append(pd.unique(internal[internal > 0]))
            if len(self._seen) > 16:
                self._seen = [pd.unique(np.concatenate(self._seen))]
            return
        if not self._table_count:  # every string id was numbered here: all of them met
            return
        if len(self._bits) <= self.known.count:
            self._bits = np.concatenate([self._bits, np.zeros(self.known.count + 1, bool)])
        self._bits[internal] = True

    def table_ids(self, internal: np.ndarray) -> None:
        """Note the ids of the user or item table (the integer map has no other record)."""
        if self.kind == "int":
            self._table = np.unique(internal[internal > 0])
        self._table_count = self.known.count  # string ids past this one come from the rows

    def seen_ids(self) -> np.ndarray:
        """The internal ids met in the interactions, ascending."""
        if self.kind == "str":
            table = self._table_count
            marked = np.flatnonzero(self._bits[1 : table + 1]).astype(np.int64) + 1
            return np.concatenate([marked, np.arange(table + 1, self.known.count + 1)])
        return np.unique(np.concatenate([np.zeros(0, np.int64), *self._seen]))

    def internal_ids(self) -> np.ndarray:
        """Every internal id known (table or interactions), ascending."""
        if self.kind == "str":
            return np.arange(1, self.known.count + 1, dtype=np.int64)
        return np.union1d(self._table, self.seen_ids())

    def id_map(self) -> IdMap:
        return IdMap("str", self.known.words()) if self.kind == "str" else IdMap.identity()


def canonical_ints(values: pa.Array) -> bool:
    """Whether every non-null string is a positive integer written plainly (no sign, no
    leading zero), so reading it as an integer loses nothing."""
    plain = pc.match_substring_regex(values.drop_null(), r"^[1-9][0-9]{0,17}$")
    return bool(pc.all(plain).as_py() is not False)


# --- timestamps and the positive rule -------------------------------------------------------
def _unit(value: float) -> str:
    size = abs(value)
    return "s" if size < 1e11 else "ms" if size < 1e14 else "us" if size < 1e17 else "ns"


def _from_numbers(numbers: np.ndarray, fmt: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Unix seconds of numeric timestamps: in ``fmt``'s unit, else each value's unit read
    from its magnitude (below 1e11 seconds, then ms, us, ns)."""
    bad = ~np.isfinite(numbers)
    numbers = np.where(bad, 0.0, numbers)
    if fmt is not None:
        return np.floor(numbers / _SCALE[fmt]).astype(np.int64), bad
    size = np.abs(numbers)
    scale = np.select([size < 1e11, size < 1e14, size < 1e17], [1.0, 1e3, 1e6], 1e9)
    return np.floor(numbers / scale).astype(np.int64), bad


def seconds(values: pa.Array, fmt: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Unix seconds (int64) of a timestamp column, and a mask of the unparseable rows."""
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    kind, numeric = values.type, fmt is None or fmt in _SCALE
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        parsed = values.cast(pa.timestamp("s"), safe=False).cast(pa.int64())
        return parsed.fill_null(0).to_numpy(), _missing(parsed)
    if pa.types.is_integer(kind) and numeric:
        ints = values.cast(pa.int64()).fill_null(0).to_numpy()
        bounds = pc.min_max(values).values()
        units = {_unit(v.as_py() or 0) for v in bounds}
        if fmt is not None or len(units) == 1:  # one unit for the whole batch
            return ints // _SCALE[fmt or units.pop()], _missing(values)
    if (pa.types.is_integer(kind) or pa.types.is_floating(kind)) and numeric:
        return _from_numbers(_numbers(values), fmt)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return np.zeros(len(values), np.int64), np.ones(len(values), bool)
    if fmt is not None and "%" in fmt:
        parsed = pc.strptime(values, format=fmt, unit="s", error_is_null=True).cast(pa.int64())
        return parsed.fill_null(0).to_numpy(), _missing(parsed)
    # ISO 8601 text, possibly beside numbers written as text (CSV)
    number = pc.match_substring_regex(values, r"^\s*-?\d+(\.\d*)?\s*$").fill_null(False)
    number = np.asarray(number, bool)
    out, bad = _from_numbers(_numbers(values), fmt if numeric else "s")
    if fmt in _SCALE:
        return out, bad
    if not number.all():
        text = values.filter(pa.array(~number))
        parsed = _parse_iso(text)
        out[~number] = parsed.fill_null(0).to_numpy()
        bad[~number] = _missing(parsed)
    return out, bad


def _parse_iso(values: pa.Array) -> pa.Array:
    """ISO 8601 strings as int64 unix seconds, null where unparseable."""
    for target in (pa.timestamp("ns"), pa.timestamp("ns", "UTC")):
        try:  # arrow's own parser, when every row agrees on having a zone or not
            return pc.divide(values.cast(target).cast(pa.int64()), 10**9)
        except pa.ArrowInvalid:
            pass
    parsed = pd.to_datetime(
        pd.Series(values.to_pandas(), dtype=object), format="ISO8601", utc=True, errors="coerce"
    )
    missing = parsed.isna().to_numpy()
    nanoseconds = parsed.fillna(pd.Timestamp(0, tz="UTC")).dt.as_unit("ns").astype("int64")
    return pa.array(nanoseconds.to_numpy() // 10**9, pa.int64(), mask=missing)


@dataclass
class _Outcomes:
    """The positive rule applied batch by batch, with what it found."""

    spec: InteractionsSpec
    counts: dict[str, int] = field(default_factory=lambda: {"5": 0, "3": 0, "1": 0})
    values: list[Any] = field(default_factory=list)  # a few distinct values met

    def rate(self, values: pa.Array, batch: Batch, problems: Problems) -> tuple:
        """(rating, weight or None) for each row."""
        rows: np.ndarray | None = None
        if (event := self.spec.event) is not None:
            encoded = (
                values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
            )
            words = [str(v) for v in encoded.dictionary.to_pylist()]
            self._remember(words)
            positive = {str(v) for v in event.positive}
            neutral = {str(v) for v in event.retrieval_only}
            weights = {str(k): w for k, w in event.weight.items()}
            lut = [
                POSITIVE if w in positive else RETRIEVAL_ONLY if w in neutral else NEGATIVE
                for w in words
            ]
            codes = encoded.indices.fill_null(len(words)).to_numpy()
            classes = np.asarray([*lut, NEGATIVE], np.float32)
            rating = classes[codes]
            rows = np.bincount(codes, minlength=len(classes))  # rows per value, one pass
            weight = None
            if weights:
                weight = np.asarray([weights.get(w, 1.0) for w in words] + [1.0], np.float32)
                weight = weight[codes]
        else:
            rule = self.spec.rating
            assert rule is not None
            numbers = _numbers(values)
            bad = np.isnan(numbers)
            column = f"column {rule.column!r}"
            problems.add(f"{column}: rating is null or not a number", batch, bad)
            self._remember(np.unique(numbers[~bad])[:10].tolist())
            rating = np.full(len(numbers), NEGATIVE, np.float32)
            if rule.neutral_at is not None:
                rating[numbers >= rule.neutral_at] = RETRIEVAL_ONLY
            rating[numbers >= rule.positive_at] = POSITIVE
            weight = None
            classes = rating  # rows is None: counted row by row below
        for key, value in (("5", POSITIVE), ("3", RETRIEVAL_ONLY), ("1", NEGATIVE)):
            if rows is None:
                self.counts[key] += int((rating == value).sum())
            else:
                self.counts[key] += int(rows[classes == value].sum())
        return rating, weight

    def _remember(self, values: list[Any]) -> None:
        for value in values:
            if len(self.values) < 10 and value not in self.values:
                self.values.append(value)

    def check_some_positive(self, where: Path) -> None:
        if self.counts["5"] == 0:
            if self.spec.event is not None:
                rule = f"no row holds one of {self.spec.event.positive}"
            else:
                assert self.spec.rating is not None
                rule = f"no rating is >= {self.spec.rating.positive_at:g}"
            raise DataError(
                where,
                f"column {self.spec.rule_column!r}: no positive row: {rule} "
                f"(values found: {self.values})",
            )


def _numbers(values: pa.Array) -> np.ndarray:
    """Float64 values of a column, NaN where null or not a number."""
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
        return values.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(values.type):
        return _numbers(values.cast(pa.int8()))
    text = pd.Series(values.cast(pa.string()).to_pandas(), dtype=object)
    return pd.to_numeric(text, errors="coerce").to_numpy(np.float64)


# --- user and item tables -------------------------------------------------------------------
def _feature(values: pa.Array, feature: Feature, batch: Batch, problems: Problems) -> pa.Array:
    """A feature column in its stored type (multi-categorical: a list of strings), the rows
    of the wrong type noted."""
    what = f"column {feature.name!r}: {feature.kind} feature"
    null = _missing(values)
    nested = pa.types.is_list(values.type) or pa.types.is_large_list(values.type)
    if (nested and feature.kind != "multi_categorical") or pa.types.is_struct(values.type):
        problems.add(f"{what} holds {values.type} values", batch, ~null)
        return pa.nulls(len(values), pa.string())
    if feature.kind == "numeric":
        numbers = _numbers(values)
        problems.add(f"{what} holds a value that is not a number", batch, np.isnan(numbers) & ~null)
        return pa.array(numbers, pa.float64())
    if feature.kind == "bool":
        if pa.types.is_boolean(values.type):
            return values
        text = [None if v is None else str(v).strip().lower() for v in values.to_pylist()]
        words = [None if t is None else _BOOLS.get(t) for t in text]
        bad = np.array([w is None for w in words]) & ~null
        problems.add(f"{what} holds a value that is not true/false", batch, bad)
        return pa.array(words, pa.bool_())
    if feature.kind == "categorical":
        return values.cast(pa.string())
    if nested:
        return values.cast(pa.list_(pa.string()))
    if feature.separator is None:
        problems.add(f"{what} holds text: give its `separator:`", batch, ~null)
        return pa.nulls(len(values), pa.list_(pa.string()))
    sep = feature.separator
    lists = [
        None if s is None else [t.strip() for t in s.split(sep) if t.strip()]
        for s in values.cast(pa.string()).to_pylist()
    ]
    return pa.array(lists, pa.list_(pa.string()))


def _separator(lists: pa.ChunkedArray, name: str) -> str:
    """A separator no value of a multi-categorical column contains."""
    flat = pc.list_flatten(lists)
    for sep in SEPARATORS:
        if not pc.any(pc.match_substring(flat, sep)).as_py():
            return sep
    raise DataError(name, f"every separator {SEPARATORS} occurs in a value")


@dataclass
class Table:
    """A user or item table: internal id and stored features, one row per key."""

    frame: pd.DataFrame
    separators: dict[str, str]
    files: list[Path]


def read_table(path: Path, spec: TableSpec, features: tuple[Feature, ...], ids: SideIds) -> Table:
    """A user or item table at ``path`` (its key mapped by ``ids``, its features checked and
    normalised); DataError naming the file, column and first bad row."""
    files = list_files(path)
    text = {f.name: pa.string() for f in features if f.kind != "numeric" and f.kind != "bool"}
    types = text | {spec.key: pa.string()}
    batches = list(read_batches(files, spec.columns, spec.delimiter, types))
    if not batches:
        raise DataError(path, "the table has no rows")
    problems = Problems()
    columns: dict[str, list[Any]] = {"id": [], **{f.name: [] for f in features}}
    for batch in batches:
        internal = ids.map(batch.data.column(spec.key), batch, spec.key, problems)
        columns["id"].append(pa.array(internal))
        for f in features:
            columns[f.name].append(_feature(batch.data.column(f.name), f, batch, problems))
    problems.raise_first()
    table = pa.table({k: pa.chunked_array(v) for k, v in columns.items()})
    multi = [f.name for f in features if f.kind == "multi_categorical"]
    separators = {name: _separator(table[name], name) for name in multi}
    frame = pd.DataFrame({"id": table["id"].to_numpy()})
    for f in features:
        values = table[f.name]
        if f.name in separators:
            values = pc.binary_join(values, separators[f.name]).fill_null("")
        frame[f.name] = values.to_pandas()
    frame["where"] = [(b, i) for b, batch in enumerate(batches) for i in range(batch.data.num_rows)]
    _check_duplicates(frame, batches, spec.key)
    ids.table_ids(frame["id"].to_numpy())
    return Table(frame.drop_duplicates("id").drop(columns="where"), separators, files)


def _check_duplicates(frame: pd.DataFrame, batches: list[Batch], key: str) -> None:
    """Duplicate keys are fine when their attributes agree; DataError when they differ."""
    distinct = frame.drop(columns="where").astype(str).drop_duplicates()
    conflict = distinct["id"].duplicated(keep=False)
    if conflict.any():
        first = distinct["id"][conflict].iloc[0]
        one, two = (frame["where"][r] for r in distinct.index[distinct["id"] == first][:2])
        raise DataError(
            batches[two[0]].file,
            f"column {key!r}: a key appears twice with different attributes "
            f"({_row(batches[one[0]], one[1])}; {_row(batches[two[0]], two[1])})",
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


def _interactions(dataset: DatasetFile, ids: dict[str, SideIds], directory: Path) -> dict[str, Any]:
    """Stream, check and write the interactions; their counts."""
    spec = dataset.spec.interactions
    files = list_files(dataset.resolve(spec.path))
    outcomes = _Outcomes(spec)
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
        "rows": sum(rows.values()),
        "ratings": outcomes.counts,
        "timestamps": span if sum(rows.values()) else None,
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


def _run(dataset: DatasetFile, directory: Path, kinds: dict[str, IdKind]) -> dict[str, Any]:
    schema = dataset.feature_schema()
    ids = {side: SideIds(side, kinds[side]) for side in ("user", "item")}
    tables: dict[str, Table | None] = {"user": None, "item": None}
    for side, spec, features in (
        ("user", dataset.spec.users, schema.user),
        ("item", dataset.spec.items, schema.item),
    ):
        if spec is not None:
            tables[side] = read_table(dataset.resolve(spec.path), spec, features, ids[side])
    summary = _interactions(dataset, ids, directory)
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


def _guess_kinds(dataset: DatasetFile) -> dict[str, IdKind]:
    """Integer ids unless the first interactions file types an id column as text (CSV
    columns are text until their values are seen)."""
    spec = dataset.spec.interactions
    first = list_files(dataset.resolve(spec.path))[0]
    schema = file_schema(first, spec.delimiter)
    kinds: dict[str, IdKind] = {}
    for side, column in (("user", spec.user), ("item", spec.item)):
        typed = schema.field(column).type if column in schema.names else pa.int64()
        text = file_format(first) != "csv" and not pa.types.is_integer(typed)
        kinds[side] = "str" if text else "int"
    return kinds


def ingest(dataset: DatasetFile, output: Path) -> dict[str, Any]:
    """Check and convert ``dataset`` into ``output`` (replaced if present); the summary also
    written to ``output/ingest.json``. DataError naming the file, column and first bad row."""
    started = time.perf_counter()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.ingest-{os.getpid()}")
    kinds = _guess_kinds(dataset)
    while True:
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir()
        try:
            summary = _run(dataset, temporary, kinds)
            break
        except KindMismatch as mismatch:
            kinds[mismatch.side] = "str"  # an id that is not an integer: string ids throughout
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
