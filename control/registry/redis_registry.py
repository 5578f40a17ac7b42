"""The registry in Redis: one document changed in WATCH/MULTI transactions, an audit stream,
locks that expire in Redis."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from control.registry.base import Registry
from control.registry.lock import held_message
from control.registry.records import (
    HOLDER,
    Change,
    LockHeld,
    RegistryError,
    RegistryUnavailable,
    State,
    T,
)
from services.util.redis_client import LazyRedis

AUDIT_MAX_LEN = 100_000  # Redis audit stream bound (XADD MAXLEN ~)


_REFRESH = """
local held = redis.call('GET', KEYS[1])
if held and cjson.decode(held)['token'] ~= ARGV[1] then return held end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return false
"""
_RELEASE = """
local held = redis.call('GET', KEYS[1])
if held and cjson.decode(held)['token'] == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisRegistry(LazyRedis, Registry):
    """The registry in Redis (sync redis-py): what every replica and job reads."""

    decode_responses = True

    def __init__(self, url: str, namespace: str = "cascade", timeout_s: float = 5.0) -> None:
        self.url, self.namespace, self.timeout_s = url, namespace, timeout_s
        self.state_key = f"{namespace}:registry:state"
        self.audit_key = f"{namespace}:registry:audit"

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        from core.redact import redact_url

        try:
            yield
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise RegistryUnavailable(f"registry at {redact_url(self.url)}: {error}") from None
        except RedisError as error:
            raise RegistryError(f"registry at {redact_url(self.url)}: {error}") from None

    def _read(self) -> State:
        with self._errors():
            raw = self.client.get(self.state_key)
        return State.parse(raw, self.state_key)

    def _mutate(self, change: Change[T]) -> T:
        from redis.exceptions import WatchError

        with self._errors(), self.client.pipeline() as pipe:
            while True:  # optimistic: WATCH the state, change it, EXEC unless it changed
                try:
                    pipe.watch(self.state_key)
                    state = State.parse(pipe.get(self.state_key), self.state_key)
                    before = state.dump()
                    result, entries = change(state)
                    pipe.multi()
                    if state.dump() != before:
                        pipe.set(self.state_key, state.dump())
                    for entry in entries:
                        pipe.xadd(
                            self.audit_key,
                            {"entry": json.dumps(entry)},
                            maxlen=AUDIT_MAX_LEN,
                            approximate=True,
                        )
                    pipe.execute()
                    return result
                except WatchError:
                    continue

    def audit(self, count: int = 100) -> list[dict[str, Any]]:
        with self._errors():
            rows: Any = self.client.xrevrange(self.audit_key, count=count)
        return [json.loads(fields["entry"]) for _, fields in reversed(rows)]

    def _lock_key(self, name: str) -> str:
        return f"{self.namespace}:registry:lock:{name}"

    def _lock_value(self, token: str, ttl_s: float) -> tuple[str, float]:
        until = time.time() + ttl_s
        return json.dumps({"token": token, "holder": HOLDER, "until": until}), until

    def _take_lock(self, name: str, token: str, ttl_s: float) -> float:
        for _ in range(3):  # the holder's key may expire between SET NX and GET
            value, until = self._lock_value(token, ttl_s)
            with self._errors():
                if self.client.set(self._lock_key(name), value, nx=True, px=int(ttl_s * 1000)):
                    return until
                held = self.client.get(self._lock_key(name))
            if held is not None:
                raise LockHeld(held_message(name, json.loads(held)))
        raise LockHeld(f"lock {name!r} changed hands three times while taking it")

    def _refresh_lock(self, name: str, token: str, ttl_s: float) -> float:
        value, until = self._lock_value(token, ttl_s)
        with self._errors():
            held = self.client.eval(
                _REFRESH, 1, self._lock_key(name), token, value, int(ttl_s * 1000)
            )
        if held:
            raise LockHeld(held_message(name, json.loads(held)))
        return until

    def _release_lock(self, name: str, token: str) -> None:
        with self._errors():
            self.client.eval(_RELEASE, 1, self._lock_key(name), token)
