"""The embedded default store: process memory, same interface and semantics as Redis."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import numpy as np

from services.stores.base import OnlineStore, UserLookup, UserRecord, validate_event


class InMemoryStore(OnlineStore):
    """Dicts behind the OnlineStore interface (for the zero-setup path and tests)."""

    def __init__(self) -> None:
        self.users: dict[int, UserRecord] = {}
        self.unavailable = np.zeros(0, np.int64)
        self.feedback: list[tuple[str, dict[str, str]]] = []
        self._sequence = itertools.count()

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def ping(self) -> bool:
        return True

    async def lookup(self, user_id: int) -> UserLookup:
        return UserLookup(self.users.get(int(user_id)), self.unavailable)

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

    async def append_feedback(self, events: Sequence[dict[str, str]]) -> list[str]:
        checked = [validate_event(e) for e in events]  # all validated before any is stored
        now = int(time.time() * 1000)
        ids = [f"{now}-{next(self._sequence)}" for _ in checked]
        self.feedback.extend(zip(ids, checked, strict=True))
        return ids

    async def read_feedback(self, count: int = 1000) -> list[dict[str, str]]:
        return [event for _, event in self.feedback[:count]]
