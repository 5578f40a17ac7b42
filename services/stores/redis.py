"""The Redis online store: hashes for attributes, packed int64 strings for id lists, a stream
for feedback. A user lookup is one pipelined round trip.

Two roles (docs/redis.md): the features (users, histories, seen sets, the loaded marker) are
rebuildable by ``cascade materialize`` and may live on a Redis Cluster; the streams, answers,
first-hit and idempotency keys and the reload lock are durable and live on one Redis."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from services.stores.base import (
    SCHEMA,
    STREAMS,
    Answer,
    Appended,
    Durability,
    OnlineStore,
    StreamEntry,
    UserLookup,
    UserRecord,
    pack_ids,
    unpack_ids,
    validate_event,
)
from services.util.redis_client import async_client, is_cluster, node_url

WRITE_BATCH = 500
HEALTH_CHECK_S = 5  # a pooled connection idle longer than this is PINGed before use

# Appends feedback events atomically: per event, an event_id seen before returns its earlier
# stream id instead of adding it again; new events are XADDed with MAXLEN ~ and their
# event_id remembered for the TTL. ARGV: max_len, ttl_s, key prefix of event ids, then per
# event: event_id ('' = none), field count, fields and values.
APPEND_FEEDBACK = """
local stream, max_len, ttl, prefix = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local out, i = {}, 4
while i <= #ARGV do
  local event_id, n = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  local earlier = false
  if event_id ~= '' then earlier = redis.call('GET', prefix .. event_id) end
  if earlier then
    table.insert(out, {earlier, 0})
  else
    local args = {'XADD', stream, 'MAXLEN', '~', max_len, '*'}
    for j = i, i + 2 * n - 1 do table.insert(args, ARGV[j]) end
    local id = redis.call(unpack(args))
    if event_id ~= '' then redis.call('SET', prefix .. event_id, id, 'EX', ttl) end
    table.insert(out, {id, 1})
  end
  i = i + 2 * n
end
return out
"""


class RedisStore(OnlineStore):
    """OnlineStore on Redis (``redis.asyncio``, binary values): features at ``url`` (one
    Redis, or a Cluster for a ``redis+cluster://`` URL), the durable data at ``durable_url``
    (unset = ``url``)."""

    def __init__(
        self,
        url: str,
        namespace: str = "cascade",
        durable_url: str | None = None,
        socket_timeout_s: float = 1.0,
    ) -> None:
        durable_url = durable_url or url
        if is_cluster(durable_url):
            raise ValueError("the durable data (streams, answers) needs one Redis, not a Cluster")
        self.url, self.durable_url = url, durable_url
        self.cluster = is_cluster(url)
        self.prefix = f"{namespace}:s{SCHEMA}"
        self.socket_timeout_s = socket_timeout_s
        self._client: Any = None  # aioredis.Redis, or aioredis.RedisCluster
        self._durable: aioredis.Redis | None = None
        self._append: Any = None
        self._lock_tokens: dict[str, str] = {}

    @property
    def client(self) -> aioredis.Redis:
        """The features' client (a ``RedisCluster`` speaks the same commands)."""
        if self._client is None:
            raise RuntimeError("RedisStore.start() was not called")
        return self._client

    @property
    def durable(self) -> aioredis.Redis:
        """The durable data's client (the features' one when a single URL serves both)."""
        if self._durable is None:
            raise RuntimeError("RedisStore.start() was not called")
        return self._durable

    def key(self, *parts: object) -> str:
        return ":".join([self.prefix, *map(str, parts)])

    def _options(self) -> dict[str, Any]:
        return {
            "decode_responses": False,
            "socket_timeout": self.socket_timeout_s,
            "socket_connect_timeout": self.socket_timeout_s,
            # after a Redis restart the pool's sockets are dead: check idle ones before use
            # and retry a call once on a fresh connection instead of failing it
            "health_check_interval": HEALTH_CHECK_S,
            "retry": Retry(NoBackoff(), 1),
            "retry_on_error": [RedisConnectionError],
            "max_connections": 256,
        }

    async def start(self) -> None:
        self._durable = async_client(self.durable_url, **self._options())
        if self.cluster:  # a pool of max_connections per node, routed by each key's slot
            self._client = aioredis.RedisCluster.from_url(node_url(self.url), **self._options())
        elif self.url == self.durable_url:
            self._client = self._durable
        else:
            self._client = async_client(self.url, **self._options())
        self._append = self._durable.register_script(APPEND_FEEDBACK)

    async def close(self) -> None:
        if self._client is not None and self._client is not self._durable:
            await self._client.aclose()
        if self._durable is not None:
            await self._durable.aclose()
        self._client = self._durable = None

    async def ping(self) -> bool:
        """Whether both roles' Redis answer."""
        try:
            clients = {id(c): c for c in (self.client, self.durable)}.values()
            return all([bool(await client.ping()) for client in clients])
        except Exception:
            return False

    async def lookup(self, user_id: int) -> UserLookup:
        pipe = self.client.pipeline(transaction=False)  # one round trip (per node of a Cluster)
        pipe.hgetall(self.key("user", user_id))
        keys = [
            self.key("recent", user_id),
            self.key("seen", user_id),
            self.key("unavailable"),
            self.key("loaded"),
        ]
        if self.cluster:  # the keys are in different slots: one GET each, routed by slot
            for key in keys:
                pipe.get(key)
            attributes, recent, seen, unavailable, loaded = await pipe.execute()
        else:
            pipe.mget(keys)
            attributes, (recent, seen, unavailable, loaded) = await pipe.execute()
        user = None
        if attributes:
            user = UserRecord(
                int(user_id),
                {k.decode(): v.decode() for k, v in attributes.items()},
                unpack_ids(recent),
                unpack_ids(seen),
            )
        return UserLookup(user, unpack_ids(unavailable), loaded=loaded is not None)

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

    async def append_feedback(
        self, events: Sequence[dict[str, str]], max_len: int, idempotency_ttl_s: int
    ) -> Appended:
        args: list[object] = [max_len, idempotency_ttl_s, self.key("feedback", "event", "")]
        for event in map(validate_event, events):
            fields = [part for item in event.items() for part in item]
            args += [event.get("event_id", ""), len(event), *fields]
        replies = await self._append(keys=[self.key("feedback")], args=args)
        return Appended(
            [stream_id.decode() for stream_id, _ in replies], [bool(new) for _, new in replies]
        )

    async def read_feedback(self, count: int = 1000) -> list[dict[str, str]]:
        entries: Any = await self.durable.xrange(self.key("feedback"), count=count)
        return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]

    async def append_impressions(
        self, records: Sequence[dict[str, str]], max_len: int, ttl_s: int
    ) -> None:
        pipe = self.durable.pipeline(transaction=False)
        for record in records:
            pipe.xadd(self.key("impressions"), record, maxlen=max_len, approximate=True)  # type: ignore[arg-type]
            answer = Answer.of_impression(record).encode()
            pipe.set(self.key("answer", record["request_id"]), answer, ex=ttl_s)
        await pipe.execute()

    async def answers(self, request_ids: Sequence[str]) -> list[Answer | None]:
        if not request_ids:
            return []
        found = await self.durable.mget([self.key("answer", r) for r in request_ids])
        return [None if v is None else Answer.decode(_text(v)) for v in found]

    async def first_hits(self, request_ids: Sequence[str], ttl_s: int) -> list[bool]:
        pipe = self.durable.pipeline(transaction=False)
        for request_id in request_ids:
            pipe.set(self.key("hit", request_id), 1, nx=True, ex=ttl_s)
        return [bool(first) for first in await pipe.execute()]

    async def read_stream(
        self, name: str, after: str = "0-0", count: int = 10_000
    ) -> list[StreamEntry]:
        if name not in STREAMS:
            raise ValueError(f"unknown stream {name!r}; one of {STREAMS}")
        entries: Any = await self.durable.xrange(self.key(name), min=f"({after}", count=count)
        return [
            (i.decode(), {k.decode(): v.decode() for k, v in fields.items()})
            for i, fields in entries
        ]

    async def durability(self) -> Durability:
        try:
            config: Any = await self.durable.config_get("append*")
            settings = {_text(k): _text(v) for k, v in config.items()}
            aof, fsync = settings.get("appendonly") == "yes", settings.get("appendfsync", "?")
        except ResponseError:  # CONFIG disabled (managed Redis): INFO still says it
            info = await self.durable.info("persistence")
            aof, fsync = int(info.get("aof_enabled", 0)) == 1, "unknown"
        if not aof:
            return Durability(False, "appendonly is off: a restart loses every event")
        if fsync == "no":
            return Durability(True, "appendonly on, appendfsync no: an OS crash may lose ~30 s")
        return Durability(True, f"appendonly on, appendfsync {fsync}")

    async def mark_loaded(self, release_version: int, users: int) -> None:
        marker = {"release": int(release_version), "users": int(users), "at": int(time.time())}
        await self.client.set(self.key("loaded"), json.dumps(marker))

    async def loaded_marker(self) -> dict[str, int] | None:
        raw = await self.client.get(self.key("loaded"))
        return None if raw is None else dict(json.loads(raw))

    async def try_lock(self, name: str, ttl_s: float) -> bool:
        token = secrets.token_hex(8)
        taken = await self.durable.set(self.key("lock", name), token, nx=True, px=int(ttl_s * 1000))
        if taken:
            self._lock_tokens[name] = token
        return bool(taken)

    async def unlock(self, name: str) -> None:
        token = self._lock_tokens.pop(name, None)
        if token is not None:  # delete only our own lock, never one that expired and was retaken
            await self.durable.eval(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end",
                1,
                self.key("lock", name),
                token,
            )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
