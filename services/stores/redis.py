"""The Redis online store: hashes for attributes, packed int64 strings for id lists, a stream
for feedback. A user lookup is one pipelined round trip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from services.stores.base import (
    SCHEMA,
    OnlineStore,
    UserLookup,
    UserRecord,
    pack_ids,
    unpack_ids,
    validate_event,
)

WRITE_BATCH = 500


class RedisStore(OnlineStore):
    """OnlineStore on a Redis server (``redis.asyncio``, binary values)."""

    def __init__(self, url: str, namespace: str = "cascade", socket_timeout_s: float = 1.0) -> None:
        self.url = url
        self.prefix = f"{namespace}:s{SCHEMA}"
        self.socket_timeout_s = socket_timeout_s
        self._client: aioredis.Redis | None = None

    @property
    def client(self) -> aioredis.Redis:
        if self._client is None:
            raise RuntimeError("RedisStore.start() was not called")
        return self._client

    def key(self, *parts: object) -> str:
        return ":".join([self.prefix, *map(str, parts)])

    async def start(self) -> None:
        self._client = aioredis.Redis.from_url(
            self.url,
            decode_responses=False,
            socket_timeout=self.socket_timeout_s,
            socket_connect_timeout=self.socket_timeout_s,
            health_check_interval=0,
            max_connections=256,
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except Exception:
            return False

    async def lookup(self, user_id: int) -> UserLookup:
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.key("user", user_id))
        pipe.get(self.key("recent", user_id))
        pipe.get(self.key("seen", user_id))
        pipe.get(self.key("unavailable"))
        attributes, recent, seen, unavailable = await pipe.execute()
        user = None
        if attributes:
            user = UserRecord(
                int(user_id),
                {k.decode(): v.decode() for k, v in attributes.items()},
                unpack_ids(recent),
                unpack_ids(seen),
            )
        return UserLookup(user, unpack_ids(unavailable))

    async def write_users(self, users: Sequence[UserRecord]) -> None:
        for start in range(0, len(users), WRITE_BATCH):
            pipe = self.client.pipeline(transaction=False)
            for user in users[start : start + WRITE_BATCH]:
                key = self.key("user", user.user_id)
                pipe.delete(key)
                if user.attributes:
                    pipe.hset(key, mapping={k: str(v) for k, v in user.attributes.items()})
                pipe.set(self.key("recent", user.user_id), pack_ids(user.recent))
                pipe.set(self.key("seen", user.user_id), pack_ids(np.unique(user.seen)))
            await pipe.execute()

    async def set_unavailable(self, item_ids: np.ndarray) -> None:
        await self.client.set(self.key("unavailable"), pack_ids(np.unique(item_ids)))

    async def append_feedback(self, events: Sequence[dict[str, str]]) -> list[str]:
        checked = [validate_event(e) for e in events]
        pipe = self.client.pipeline(transaction=True)  # MULTI/EXEC: all events or none
        for event in checked:
            pipe.xadd(self.key("feedback"), event)  # type: ignore[arg-type]
        ids: list[bytes] = await pipe.execute()
        return [i.decode() for i in ids]

    async def read_feedback(self, count: int = 1000) -> list[dict[str, str]]:
        entries: Any = await self.client.xrange(self.key("feedback"), count=count)
        return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]
