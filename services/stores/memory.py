"""The embedded default store: process memory, same interface and semantics as Redis.

With a ``stream_dir`` the two streams (feedback, impressions) live in JSON-lines files there
(appended, fsynced before a feedback write is acknowledged; memory caches them and picks up
what other processes appended on every read), so the embedded stack's logged traffic
survives a restart and separate ``cascade retrain`` and ``cascade rollout`` processes read
it as it is written. One writing gateway process keeps the stream ids ordered; the files are
not trimmed (Redis is the store for a fleet).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from services.stores.base import (
    STREAMS,
    Answer,
    Appended,
    Durability,
    OnlineStore,
    StreamEntry,
    UserLookup,
    UserRecord,
    stream_id_key,
    validate_event,
)


class InMemoryStore(OnlineStore):
    """Dicts behind the OnlineStore interface (for the zero-setup path and tests)."""

    def __init__(self, stream_dir: Path | None = None) -> None:
        self.users: dict[int, UserRecord] = {}
        self.unavailable = np.zeros(0, np.int64)
        self.stream_dir = stream_dir
        self.streams: dict[str, list[StreamEntry]] = {name: [] for name in STREAMS}
        self._last_id = (0, 0)
        self._event_ids: dict[str, tuple[str, float]] = {}  # event_id -> (stream id, expiry)
        self._answers: dict[str, tuple[Answer, float]] = {}  # request_id -> (answer, expiry)
        self._hits: dict[str, float] = {}  # request_id -> expiry
        self._marker: dict[str, int] | None = None
        self._locks: dict[str, float] = {}  # name -> expiry
        self._offsets: dict[str, int] = {}  # bytes of each stream file already read

    @property
    def feedback(self) -> list[StreamEntry]:
        return self.streams["feedback"]

    async def start(self) -> None:
        if self.stream_dir is None:
            return
        self.stream_dir.mkdir(parents=True, exist_ok=True)
        for name in STREAMS:
            path = self.stream_dir / f"{name}.jsonl"
            if path.is_file():
                _drop_torn_tail(path)
            self._tail(name)
        for stream_id, event in self.feedback:
            if event.get("event_id"):
                self._event_ids[event["event_id"]] = (stream_id, float("inf"))
        for _, record in self.streams["impressions"]:  # answers logged before a restart
            self._remember(record, float("inf"))

    def _remember(self, record: dict[str, str], expiry: float) -> None:
        with contextlib.suppress(KeyError, ValueError):  # a malformed line: nothing to vouch
            self._answers[record["request_id"]] = (Answer.of_impression(record), expiry)

    def _tail(self, name: str) -> None:
        """Add the complete lines another process (or this one) appended to the stream file
        since the last read: the file is the stream, memory a cache of it."""
        assert self.stream_dir is not None
        path = self.stream_dir / f"{name}.jsonl"
        if not path.is_file():
            return
        with path.open("rb") as handle:
            handle.seek(self._offsets.get(name, 0))
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offsets[name] = self._offsets.get(name, 0) + len(complete)
        entries = _parse_lines(complete.decode(errors="replace").splitlines())
        if entries:
            self.streams[name].extend(entries)
            self._last_id = max(self._last_id, stream_id_key(entries[-1][0]))

    async def close(self) -> None:
        return None

    async def ping(self) -> bool:
        return True

    async def lookup(self, user_id: int) -> UserLookup:
        return UserLookup(
            self.users.get(int(user_id)), self.unavailable, loaded=self._marker is not None
        )

    async def write_users(self, users: Sequence[UserRecord]) -> None:
        for user in users:
            self.users[int(user.user_id)] = UserRecord(
                int(user.user_id),
                {k: str(v) for k, v in user.attributes.items()},
                np.asarray(user.recent, np.int64).copy(),
                np.unique(np.asarray(user.seen, np.int64)),
            )

    async def set_unavailable(self, item_ids: np.ndarray) -> None:
        self.unavailable = np.unique(np.asarray(item_ids, np.int64))

    def _next_id(self) -> str:
        """A stream id after every earlier one, ``<ms>-<seq>`` as Redis makes them."""
        for name in STREAMS if self.stream_dir is not None else ():
            self._tail(name)  # ids stay ordered after what another process appended
        now = int(time.time() * 1000)
        ms, seq = self._last_id
        self._last_id = (now, 0) if now > ms else (ms, seq + 1)
        return f"{self._last_id[0]}-{self._last_id[1]}"

    def _append(self, name: str, entries: list[StreamEntry], max_len: int, sync: bool) -> None:
        stream = self.streams[name]
        if self.stream_dir is None:
            stream.extend(entries)
        elif entries:
            with (self.stream_dir / f"{name}.jsonl").open("a") as out:
                out.writelines(json.dumps([i, fields]) + "\n" for i, fields in entries)
                out.flush()
                if sync:
                    os.fsync(out.fileno())
            self._tail(name)
        del stream[: max(0, len(stream) - max_len)]

    async def append_feedback(
        self, events: Sequence[dict[str, str]], max_len: int, idempotency_ttl_s: int
    ) -> Appended:
        checked = [validate_event(e) for e in events]  # all validated before any is stored
        now = time.time()
        ids, stored, fresh = [], [], []
        for event in checked:
            event_id = event.get("event_id")
            earlier = self._event_ids.get(event_id) if event_id else None
            if earlier is not None and earlier[1] > now:
                ids.append(earlier[0])
                fresh.append(False)
                continue
            stream_id = self._next_id()
            stored.append((stream_id, event))
            if event_id:
                self._event_ids[event_id] = (stream_id, now + idempotency_ttl_s)
            ids.append(stream_id)
            fresh.append(True)
        self._append("feedback", stored, max_len, sync=True)
        return Appended(ids, fresh)

    async def read_feedback(self, count: int = 1000) -> list[dict[str, str]]:
        return [event for _, event in self.feedback[:count]]

    async def append_impressions(
        self, records: Sequence[dict[str, str]], max_len: int, ttl_s: int
    ) -> None:
        expiry = time.time() + ttl_s
        entries = [(self._next_id(), dict(record)) for record in records]
        for _, record in entries:
            self._remember(record, expiry)
        self._append("impressions", entries, max_len, sync=False)

    async def answers(self, request_ids: Sequence[str]) -> list[Answer | None]:
        now = time.time()
        found = [self._answers.get(r) for r in request_ids]
        return [a[0] if a is not None and a[1] > now else None for a in found]

    async def first_hits(self, request_ids: Sequence[str], ttl_s: int) -> list[bool]:
        now, first = time.time(), []
        for request_id in request_ids:
            seen = self._hits.get(request_id, 0.0) > now
            if not seen:
                self._hits[request_id] = now + ttl_s
            first.append(not seen)
        return first

    async def read_stream(
        self, name: str, after: str = "0-0", count: int = 10_000
    ) -> list[StreamEntry]:
        if name not in STREAMS:
            raise ValueError(f"unknown stream {name!r}; one of {STREAMS}")
        if self.stream_dir is not None:
            self._tail(name)
        stream = self.streams[name]
        start = bisect.bisect_right(stream, stream_id_key(after), key=lambda e: stream_id_key(e[0]))
        return stream[start : start + count]

    async def durability(self) -> Durability:
        if self.stream_dir is not None:
            return Durability(True, f"append-only files in {self.stream_dir} (fsync per write)")
        return Durability(False, "in-process memory: feedback is lost when the gateway stops")

    async def mark_loaded(self, release_version: int, users: int) -> None:
        self._marker = {"release": int(release_version), "users": int(users)}

    async def loaded_marker(self) -> dict[str, int] | None:
        return self._marker

    async def try_lock(self, name: str, ttl_s: float) -> bool:
        now = time.monotonic()
        if self._locks.get(name, 0.0) > now:
            return False
        self._locks[name] = now + ttl_s
        return True

    async def unlock(self, name: str) -> None:
        self._locks.pop(name, None)


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line without its newline (a crash mid-write), so appends start clean."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as out:
            out.truncate(data.rfind(b"\n") + 1)


def _parse_lines(lines: list[str]) -> list[StreamEntry]:
    """Entries of stream-file lines; a line that does not parse is skipped."""
    entries = []
    for line in lines:
        try:
            stream_id, fields = json.loads(line)
        except (ValueError, TypeError):
            continue
        entries.append((str(stream_id), {str(k): str(v) for k, v in fields.items()}))
    return entries
