"""The embedded default store: process memory, same interface and semantics as Redis."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import numpy as np

from services.stores.base import (
    Appended,
    Durability,
    OnlineStore,
    UserLookup,
    UserRecord,
    validate_event,
)


class InMemoryStore(OnlineStore):
    """Dicts behind the OnlineStore interface (for the zero-setup path and tests)."""

    def __init__(self) -> None:
        self.users: dict[int, UserRecord] = {}
        self.unavailable = np.zeros(0, np.int64)
        self.feedback: list[tuple[str, dict[str, str]]] = []
        self._sequence = itertools.count()
        self._event_ids: dict[str, tuple[str, float]] = {}  # event_id -> (stream id, expiry)
        self._marker: dict[str, int] | None = None
        self._locks: dict[str, float] = {}  # name -> expiry

    async def start(self) -> None:
        return None

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

    async def append_feedback(
        self, events: Sequence[dict[str, str]], max_len: int, idempotency_ttl_s: int
    ) -> Appended:
        checked = [validate_event(e) for e in events]  # all validated before any is stored
        now = time.time()
        ids, duplicates = [], 0
        for event in checked:
            event_id = event.get("event_id")
            earlier = self._event_ids.get(event_id) if event_id else None
            if earlier is not None and earlier[1] > now:
                ids.append(earlier[0])
                duplicates += 1
                continue
            stream_id = f"{int(now * 1000)}-{next(self._sequence)}"
            self.feedback.append((stream_id, event))
            if event_id:
                self._event_ids[event_id] = (stream_id, now + idempotency_ttl_s)
            ids.append(stream_id)
        del self.feedback[: max(0, len(self.feedback) - max_len)]
        return Appended(ids, duplicates)

    async def read_feedback(self, count: int = 1000) -> list[dict[str, str]]:
        return [event for _, event in self.feedback[:count]]

    async def durability(self) -> Durability:
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
