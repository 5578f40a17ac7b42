"""Snapshot the logged streams after the committed cursor into parquet.

Entries are read page by page (``OnlineStore.read_stream``) up to the newest one, parsed,
and written atomically as ``<run>-feedback.parquet`` and ``<run>-impressions.parquet``.
A corrupt or partial entry (a missing field, an id that is not an integer, an unknown
event type, an empty item list) is skipped and counted by reason; it never fails the job.
The cursor advances past skipped entries too, so they are not read again.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from services.stores.base import OnlineStore, StreamEntry

PAGE = 10_000
EVENT_TYPES = ("click", "impression")
FEEDBACK_SCHEMA = pa.schema(
    [
        ("stream_id", pa.string()),
        ("user_id", pa.int64()),
        ("item_id", pa.int64()),
        ("type", pa.string()),
        ("timestamp", pa.int64()),
        ("model_version", pa.int64()),
        ("request_id", pa.string()),
        ("trust", pa.string()),  # what the gateway vouched for ("": logged before it did)
        ("source", pa.string()),
    ]
)
IMPRESSION_SCHEMA = pa.schema(
    [
        ("stream_id", pa.string()),
        ("request_id", pa.string()),
        ("user_id", pa.int64()),
        ("model_version", pa.int64()),
        ("timestamp", pa.int64()),
        ("items", pa.list_(pa.int64())),
    ]
)


class Skip(ValueError):
    """A stream entry that cannot become training data; the message is the reason."""


@dataclass
class Snapshot:
    """What one run read: parsed rows per stream, the cursor after them, skips by reason."""

    feedback: pd.DataFrame
    impressions: pd.DataFrame
    cursor: dict[str, str]
    skipped: Counter = field(default_factory=Counter)

    @property
    def entries(self) -> int:
        return len(self.feedback) + len(self.impressions)


def _id(fields: dict[str, str], name: str) -> int:
    if name not in fields or fields[name] in ("", None):
        raise Skip(f"missing_{name}")
    try:
        value = int(fields[name])
    except (TypeError, ValueError):
        raise Skip(f"bad_{name}") from None
    if value < 0 or value >= 2**63:
        raise Skip(f"bad_{name}")
    return value


def _timestamp(stream_id: str, fields: dict[str, str]) -> int:
    """Event time in unix seconds: the entry's ``timestamp``, else the stream id's time."""
    raw = fields.get("timestamp")
    if raw not in (None, ""):
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise Skip("bad_timestamp") from None
        if not np.isfinite(value) or value < 0:
            raise Skip("bad_timestamp")
        return int(value)
    try:
        return int(stream_id.split("-", 1)[0]) // 1000
    except ValueError:
        raise Skip("bad_stream_id") from None


def _version(fields: dict[str, str]) -> int:
    try:
        return int(fields.get("model_version") or -1)
    except ValueError:
        return -1


def parse_feedback(stream_id: str, fields: dict[str, str]) -> dict[str, Any]:
    kind = fields.get("type")
    if kind not in EVENT_TYPES:
        raise Skip("bad_type" if kind else "missing_type")
    return {
        "stream_id": stream_id,
        "user_id": _id(fields, "user_id"),
        "item_id": _id(fields, "item_id"),
        "type": kind,
        "timestamp": _timestamp(stream_id, fields),
        "model_version": _version(fields),
        "request_id": fields.get("request_id") or "",
        "trust": fields.get("trust") or "",
        "source": fields.get("source") or "",
    }


def parse_impression(stream_id: str, fields: dict[str, str]) -> dict[str, Any]:
    request_id = fields.get("request_id")
    if not request_id:
        raise Skip("missing_request_id")
    try:
        items = [int(i) for i in (fields.get("items") or "").split()]
    except ValueError:
        raise Skip("bad_items") from None
    if not items or any(i < 0 or i >= 2**63 for i in items):
        raise Skip("bad_items")
    return {
        "stream_id": stream_id,
        "request_id": request_id,
        "user_id": _id(fields, "user_id"),
        "model_version": _version(fields),
        "timestamp": _timestamp(stream_id, fields),
        "items": items,
    }


PARSERS = {"feedback": parse_feedback, "impressions": parse_impression}
SCHEMAS = {"feedback": FEEDBACK_SCHEMA, "impressions": IMPRESSION_SCHEMA}


def parse_entries(
    stream: str, entries: list[StreamEntry], skipped: Counter
) -> list[dict[str, Any]]:
    rows = []
    for stream_id, fields in entries:
        try:
            if not isinstance(fields, dict):
                raise Skip("not_a_mapping")
            rows.append(PARSERS[stream](stream_id, fields))
        except Skip as reason:
            skipped[f"{stream}:{reason}"] += 1
    return rows


async def read_since(store: OnlineStore, cursor: dict[str, str], page: int = PAGE) -> Snapshot:
    """Every entry of both streams after ``cursor``, parsed (the store must be started)."""
    skipped: Counter = Counter()
    tables: dict[str, pd.DataFrame] = {}
    after = dict(cursor)
    for stream in ("feedback", "impressions"):
        rows: list[dict[str, Any]] = []
        while True:
            entries = await store.read_stream(stream, after=after[stream], count=page)
            if not entries:
                break
            rows += parse_entries(stream, entries, skipped)
            after[stream] = entries[-1][0]
            if len(entries) < page:
                break
        tables[stream] = pa.Table.from_pylist(rows, schema=SCHEMAS[stream]).to_pandas()
    return Snapshot(tables["feedback"], tables["impressions"], after, skipped)


def write_snapshot(snapshot: Snapshot, paths: dict[str, Path]) -> None:
    """Each stream's rows as parquet, atomically (temporary file, fsync, rename)."""
    for stream, frame in (("feedback", snapshot.feedback), ("impressions", snapshot.impressions)):
        path = paths[stream]
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        table = pa.Table.from_pandas(frame, schema=SCHEMAS[stream], preserve_index=False)
        pq.write_table(table, temporary)
        with temporary.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)


def read_snapshots(paths: list[Path], stream: str) -> pd.DataFrame:
    """The rows of several snapshot files of one stream, in order."""
    frames = [_read(path, SCHEMAS[stream]) for path in paths if path.is_file()]
    if not frames:
        return SCHEMAS[stream].empty_table().to_pandas()
    return pd.concat(frames, ignore_index=True)


def _read(path: Path, schema: pa.Schema) -> pd.DataFrame:
    """One snapshot file in ``schema``; columns added since it was written are empty text."""
    table = pq.read_table(path)
    for name in schema.names:
        if name not in table.column_names:
            table = table.append_column(name, pa.array([""] * table.num_rows, pa.string()))
    return table.select(schema.names).cast(schema).to_pandas()
