"""The online store interface: user features, recent history, seen set, availability, feedback.

Key schema (Redis; the in-memory store mirrors it), versioned so a layout change never
reads old data as new: ``{namespace}:s{SCHEMA}:...``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

SCHEMA = 1
FEEDBACK_FIELDS = (
    "user_id",
    "item_id",
    "type",
    "model_version",
    "timestamp",
    "event_id",
    "request_id",
    "hit",
    "trust",  # what the server vouches for: services.events.attribution.TRUST_LEVELS
    "source",  # which client credential sent it (a key's fingerprint, or "open")
)
# One impression set per answer: items and scores space-separated in rank order.
IMPRESSION_FIELDS = (
    "request_id",
    "user_id",
    "model_version",
    "items",
    "scores",
    "degraded",
    "reasons",
    "latency_ms",
    "timestamp",
)
STREAMS = ("feedback", "impressions")
StreamEntry = tuple[str, dict[str, str]]  # (stream id, fields)


@dataclass
class UserRecord:
    """Raw user attributes (as text), recent positive items (oldest first), every seen item."""

    user_id: int
    attributes: dict[str, str]
    recent: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


@dataclass
class UserLookup:
    """What the features stage needs, fetched in one round trip. ``loaded`` is False when the
    store lacks the completeness marker ``materialize`` writes last: it lost its data (a
    restart without persistence) or was never filled, so a missing user is not a new user."""

    user: UserRecord | None
    unavailable: np.ndarray
    loaded: bool = True


@dataclass
class Appended:
    """The result of ``append_feedback``: a stream id per event (the earlier id for a
    duplicate ``event_id``) and whether each was stored now (False: a duplicate, stored
    before, so not stored again)."""

    ids: list[str]
    new: list[bool]

    @property
    def duplicates(self) -> int:
        return self.new.count(False)


@dataclass(frozen=True)
class Answer:
    """What the server logged of one answer: the version that served it, the user it was
    for and the items it showed (ids as text, as they are in the streams)."""

    version: int
    user_id: str
    items: frozenset[str]

    def encode(self) -> str:
        return " ".join([str(self.version), self.user_id, *self.items])

    @classmethod
    def decode(cls, text: str) -> Answer | None:
        """The inverse of ``encode``; None for a value in another layout (an older key)."""
        parts = text.split()
        if len(parts) < 2 or not parts[0].isdigit():
            return None
        return cls(int(parts[0]), parts[1], frozenset(parts[2:]))

    @classmethod
    def of_impression(cls, record: dict[str, str]) -> Answer:
        """The answer an impression set (``IMPRESSION_FIELDS``) records."""
        return cls(
            int(record["model_version"]), record["user_id"], frozenset(record["items"].split())
        )


@dataclass
class Durability:
    """Whether an acknowledged write survives a restart of the store, and why."""

    durable: bool
    detail: str


def pack_ids(ids: np.ndarray) -> bytes:
    """Item ids as little-endian int64 bytes (compact, parsed without a loop)."""
    return np.ascontiguousarray(ids, dtype="<i8").tobytes()


def unpack_ids(blob: bytes | None) -> np.ndarray:
    if not blob:
        return np.zeros(0, np.int64)
    if len(blob) % 8:
        raise ValueError(f"id blob of {len(blob)} bytes is not a multiple of 8")
    return np.frombuffer(blob, dtype="<i8").astype(np.int64)


class OnlineStore(ABC):
    """Backends implement these; both pass the same contract tests."""

    @abstractmethod
    async def start(self) -> None:
        """Connect (no I/O happens in the constructor)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def ping(self) -> bool:
        """True when the store answers."""

    @abstractmethod
    async def lookup(self, user_id: int) -> UserLookup:
        """The user's record (None when unknown) and the unavailable items, in one round trip."""

    @abstractmethod
    async def write_users(self, users: Sequence[UserRecord]) -> None:
        """Insert or replace users (attributes, recent history and seen set together)."""

    @abstractmethod
    async def set_unavailable(self, item_ids: np.ndarray) -> None:
        """Replace the set of items that may not be recommended."""

    @abstractmethod
    async def append_feedback(
        self, events: Sequence[dict[str, str]], max_len: int, idempotency_ttl_s: int
    ) -> Appended:
        """Append events atomically to the stream, trimmed to about ``max_len`` entries; an
        event whose ``event_id`` was appended in the last ``idempotency_ttl_s`` is not
        appended again (its earlier id is returned)."""

    @abstractmethod
    async def append_impressions(
        self, records: Sequence[dict[str, str]], max_len: int, ttl_s: int
    ) -> None:
        """Append impression sets (``IMPRESSION_FIELDS``) to their stream, trimmed to about
        ``max_len``, and remember each request's ``Answer`` for ``ttl_s``."""

    @abstractmethod
    async def answers(self, request_ids: Sequence[str]) -> list[Answer | None]:
        """The logged answer of each request (None: unknown or expired)."""

    @abstractmethod
    async def first_hits(self, request_ids: Sequence[str], ttl_s: int) -> list[bool]:
        """For each request, True the first time an outcome arrives for it (hit rate)."""

    @abstractmethod
    async def read_stream(
        self, name: str, after: str = "0-0", count: int = 10_000
    ) -> list[StreamEntry]:
        """Up to ``count`` entries of stream ``name`` (one of ``STREAMS``) with ids after
        ``after``, oldest first."""

    @abstractmethod
    async def durability(self) -> Durability:
        """Whether acknowledged feedback survives a restart of the store."""

    @abstractmethod
    async def mark_loaded(self, release_version: int, users: int) -> None:
        """Write the completeness marker (last, after every user of the release)."""

    @abstractmethod
    async def loaded_marker(self) -> dict[str, int] | None:
        """The completeness marker (release version, users), or None when absent."""

    @abstractmethod
    async def try_lock(self, name: str, ttl_s: float) -> bool:
        """Take a named lock shared by every gateway replica, expiring after ``ttl_s``."""

    @abstractmethod
    async def unlock(self, name: str) -> None: ...

    @abstractmethod
    async def read_feedback(self, count: int = 1000) -> list[dict[str, str]]:
        """The oldest ``count`` stored events (for KPIs and retraining)."""


def stream_id_key(stream_id: str) -> tuple[int, int]:
    """A stream id ``<ms>-<seq>`` as a sortable pair."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def validate_event(event: dict[str, str]) -> dict[str, str]:
    """Keep only the known fields, all as text; a missing required field is an error."""
    missing = [f for f in ("user_id", "item_id", "type") if f not in event]
    if missing:
        raise ValueError(f"feedback event lacks {missing}")
    return {k: str(event[k]) for k in FEEDBACK_FIELDS if k in event}
