"""Synchronous Redis clients of the control plane and jobs (registry, desired state, rollout
log, retrain queue, the embedding cache's row store), opened one way: the same timeout for
connecting and for each command, so a Redis that does not answer fails a call within it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

if TYPE_CHECKING:
    import redis
    import redis.asyncio

# A URL with one of these schemes names any one node of a Redis Cluster (the client finds
# the others); the rebuildable role (features, embedding rows) may be one, the durable not.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# A URL with one of these names the Sentinels that watch a primary and its replicas
# (``redis+sentinel://[:password@]host:26379,host:26379/service/db``): the client asks them
# for the primary and asks again after a failover. The durable role may be one.
SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.partition("://")[0] in CLUSTER_SCHEMES


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names Sentinels (``redis+sentinel://`` or ``rediss+sentinel://``)."""
    return url.partition("://")[0] in SENTINEL_SCHEMES


@dataclass(frozen=True)
class SentinelTarget:
    """What a Sentinel URL names: the Sentinels, the primary's service name, the db, and the
    primary's password (Sentinels themselves are asked without one)."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int
    password: str | None
    tls: bool


def sentinel_target(url: str) -> SentinelTarget:
    """Parse a Sentinel URL; ValueError naming what is wrong."""
    scheme, _, rest = url.partition("://")
    hosts, _, path = rest.partition("/")
    password = None
    if "@" in hosts:
        credentials, _, hosts = hosts.rpartition("@")
        password = unquote(credentials.partition(":")[2]) or None
    sentinels = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"a Sentinel URL lists host:port pairs, got {host!r}")
        sentinels.append((name, int(port)))
    service, _, db = path.partition("/")
    if not service or (db and not db.isdigit()):
        raise ValueError(
            "a Sentinel URL ends with /service/db, e.g. "
            "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/cascade/0"
        )
    return SentinelTarget(sentinels, service, int(db or 0), password, SENTINEL_SCHEMES[scheme])


def _primary(module: Any, url: str, options: dict[str, Any]) -> Any:
    """The primary's client from ``module`` (``redis.sentinel`` or ``redis.asyncio.sentinel``)."""
    target = sentinel_target(url)
    asking = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout") if k in options}
    sentinels = module.Sentinel(target.sentinels, sentinel_kwargs=asking)
    extra: dict[str, Any] = {"password": target.password} if target.password else {}
    if target.tls:
        extra["ssl"] = True
    return sentinels.master_for(target.service, db=target.db, **extra, **options)


def async_client(url: str, **options: Any) -> redis.asyncio.Redis:
    """A ``redis.asyncio.Redis`` for a plain or a Sentinel URL (cluster URLs: the caller's
    ``RedisCluster``)."""
    if is_sentinel(url):
        import redis.asyncio.sentinel

        client: redis.asyncio.Redis = _primary(redis.asyncio.sentinel, url, options)
        return client
    import redis.asyncio

    return redis.asyncio.Redis.from_url(url, **options)


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
    if is_sentinel(url):
        import redis.sentinel

        primary: redis.Redis = _primary(redis.sentinel, url, options)
        return primary
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
