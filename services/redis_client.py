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
