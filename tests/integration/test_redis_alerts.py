"""The Redis alerts on real processes: a Redis read by a real redis_exporter (Debian's
prometheus-redis-exporter) scraped as the durable role by a real Prometheus evaluating the
repository's rules (every ``for:`` shortened to 1 s). The durable Redis fills towards its
maxmemory, then evicts under a wrong policy, then stops: each alert fires in turn, critical,
with the runbook it links."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from services.util.local_redis import free_port, start_redis_server
from tests.integration.monitoring_servers import (
    REPO,
    Prometheus,
    require_binary,
    rules_for_tests,
    wait_until,
)

pytestmark = pytest.mark.integration

MAXMEMORY = 4 * 1024 * 1024
JOB = "cascade-redis-durable"


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A scratch Redis with a small maxmemory and the durable role's noeviction policy."""
    (tmp_path / "redis").mkdir()
    try:
        url, process = start_redis_server(tmp_path / "redis")
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    client = redis.Redis.from_url(url)
    client.config_set("maxmemory", MAXMEMORY)
    client.config_set("maxmemory-policy", "noeviction")
    client.close()
    yield url, process
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def exporter(durable_redis: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> Iterator[str]:
    """redis_exporter on a free loopback port, reading the scratch Redis: its address."""
    binary = require_binary("prometheus-redis-exporter", "redis_exporter")
    address = f"127.0.0.1:{free_port()}"
    with (tmp_path / "exporter.log").open("wb") as log:
        process = subprocess.Popen(
            [binary, "-redis.addr", durable_redis[0], "-web.listen-address", address],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def answers() -> bool:
        try:
            return httpx.get(f"http://{address}/metrics", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, 15, "redis_exporter to answer")
        yield address
    finally:
        process.terminate()
        process.wait(timeout=10)


def _firing(prometheus: Prometheus, name: str) -> list[dict]:
    return [
        alert
        for alert in prometheus.alerts()
        if alert["labels"]["alertname"] == name and alert["state"] == "firing"
    ]


def _fill(client: redis.Redis, share: float, start: int = 0) -> int:
    """Write 1 KiB values until Redis uses ``share`` of its maxmemory, refuses writes, or
    twice maxmemory was written; the next key number."""
    value = b"x" * 1024
    key = start
    while client.info("memory")["used_memory"] < share * MAXMEMORY:
        if key - start >= 2 * MAXMEMORY // len(value):
            break
        pipe = client.pipeline(transaction=False)
        for _ in range(100):
            pipe.set(f"fill:{key}", value)
            key += 1
        try:
            pipe.execute()
        except redis.ResponseError as refused:  # OOM: at the limit under noeviction
            assert "OOM" in str(refused)
            break
    return key


def test_redis_alerts_fire_in_turn(
    durable_redis: tuple[str, subprocess.Popen[bytes]],
    exporter: str,
    tmp_path: Path,
    prometheus_server: Callable[..., Prometheus],
) -> None:
    url, process = durable_redis
    prometheus = prometheus_server(
        targets={JOB: [exporter]}, rule_files=rules_for_tests(tmp_path / "rules", for_="1s")
    )
    wait_until(lambda: prometheus.query(f'redis_up{{job="{JOB}"}} == 1'), 30, "redis_up")
    wait_until(lambda: prometheus.query("cascade:threshold:redis_memory_used_ratio"), 30, "rules")
    assert not [a for a in prometheus.alerts() if "Redis" in a["labels"]["alertname"]]

    client = redis.Redis.from_url(url)
    written = _fill(client, 0.95)  # over the 90 % threshold
    (near,) = wait_until(
        lambda: _firing(prometheus, "CascadeRedisMemoryNearLimit"), 30, "the memory alert"
    )
    assert near["labels"]["severity"] == "critical" and near["labels"]["job"] == JOB
    assert float(near["value"]) > 0.9
    assert not _firing(prometheus, "CascadeRedisEvictions")  # noeviction: nothing evicted

    client.config_set("maxmemory-policy", "allkeys-lru")  # the misconfiguration to catch
    _fill(client, 1.5, start=written)  # never reached: Redis evicts to stay under it
    assert client.info("stats")["evicted_keys"] > 0
    client.close()
    (evicting,) = wait_until(
        lambda: _firing(prometheus, "CascadeRedisEvictions"), 30, "the eviction alert"
    )
    assert evicting["labels"]["severity"] == "critical"

    process.terminate()
    process.wait(timeout=10)
    (down,) = wait_until(lambda: _firing(prometheus, "CascadeRedisDown"), 30, "the down alert")
    assert down["labels"]["severity"] == "critical"
    for alert in (near, evicting, down):
        page = alert["annotations"]["runbook_url"].rsplit("/docs/", 1)[1]
        assert (REPO / "docs" / page).is_file()
