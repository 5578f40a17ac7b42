"""Synchronous Redis clients of the control plane and jobs (registry, desired state, rollout
log, retrain queue, the embedding cache's row store), opened one way: the same timeout for
connecting and for each command, so a Redis that does not answer fails a call within it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

# A URL with one of these schemes names any one node of a Redis Cluster (the client finds
# the others); the rebuildable role (features, embedding rows) may be one, the durable not.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.partition("://")[0] in CLUSTER_SCHEMES


def node_url(url: str) -> str:
    """``url`` with a cluster scheme turned into the plain one its nodes speak."""
    scheme, separator, rest = url.partition("://")
    return f"{CLUSTER_SCHEMES.get(scheme, scheme)}{separator}{rest}"


def sync_client(url: str, timeout_s: float, decode_responses: bool = False) -> redis.Redis:
    """A ``redis.Redis`` for ``url``, or a ``RedisCluster`` (same commands, routed by key)
    for a cluster URL (imported here: ``cascade`` starts without it)."""
    import redis

    options = {
        "decode_responses": decode_responses,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
    }
    if is_cluster(url):
        cluster: redis.Redis = redis.RedisCluster.from_url(node_url(url), **options)  # type: ignore[assignment]
        return cluster
    return redis.Redis.from_url(url, **options)


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
