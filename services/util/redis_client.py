"""Synchronous Redis clients of the control plane and jobs (registry, desired state, rollout
log, retrain queue, the embedding cache's row store), opened one way: the same timeout for
connecting and for each command, so a Redis that does not answer fails a call within it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis


def sync_client(url: str, timeout_s: float, decode_responses: bool = False) -> redis.Redis:
    """A ``redis.Redis`` for ``url`` (imported here: ``cascade`` starts without it)."""
    import redis

    return redis.Redis.from_url(
        url,
        decode_responses=decode_responses,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )


class LazyRedis:
    """A sync redis-py client made at its first use (no I/O in the constructor) and closed
    by ``close()``: the control plane's Redis-backed stores share it. Subclasses set
    ``url`` and ``timeout_s`` (and ``decode_responses``) in their constructor."""

    url: str
    timeout_s: float
    decode_responses = False
    _client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = sync_client(self.url, self.timeout_s, self.decode_responses)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
