"""A real 3-node Redis Cluster on free loopback ports, for tests that need one.

- ``redis_cluster``: a session fixture, the ``LocalCluster`` (started once: forming a cluster
  takes a few seconds); skips when redis-server or redis-cli is missing. Import it into a test
  module (``from tests.integration.redis_cluster import redis_cluster``).
- ``flush(cluster)``: empty every node, so that each test starts from nothing.
- ``keys_per_node(cluster, pattern)``: how many keys matching ``pattern`` each node holds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from services.util.local_redis_cluster import LocalCluster, start_redis_cluster


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three primaries, no replicas, nothing persisted; stopped at the end of the session."""
    try:
        cluster = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    except FileNotFoundError:
        pytest.skip("redis-server and redis-cli are not installed (.ci/run installs them)")
    yield cluster
    cluster.stop()


def flush(cluster: LocalCluster) -> None:
    for url in cluster.node_urls():
        with redis.Redis.from_url(url) as node:
            node.flushall()


def keys_per_node(cluster: LocalCluster, pattern: str = "*") -> list[int]:
    counts = []
    for url in cluster.node_urls():
        with redis.Redis.from_url(url) as node:
            counts.append(sum(1 for _ in node.scan_iter(match=pattern, count=1000)))
    return counts
