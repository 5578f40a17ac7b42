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
FEEDBACK_FIELDS = ("user_id", "item_id", "type", "model_version", "timestamp")


@dataclass
class UserRecord:
    """Raw user attributes (as text), recent positive items (oldest first), every seen item."""

    user_id: int
    attributes: dict[str, str]
    recent: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


@dataclass
class UserLookup:
    """What the features stage needs, fetched in one round trip."""

    user: UserRecord | None
    unavailable: np.ndarray


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
    async def append_feedback(self, events: Sequence[dict[str, str]]) -> list[str]:
        """Append events durably and atomically (all or none); return their ids."""

    @abstractmethod
    async def read_feedback(self, count: int = 1000) -> list[dict[str, str]]:
        """The oldest ``count`` stored events (for KPIs and retraining)."""


def validate_event(event: dict[str, str]) -> dict[str, str]:
    """Keep only the known fields, all as text; a missing required field is an error."""
    missing = [f for f in ("user_id", "item_id", "type") if f not in event]
    if missing:
        raise ValueError(f"feedback event lacks {missing}")
    return {k: str(event[k]) for k in FEEDBACK_FIELDS if k in event}
