"""`cascade retrain`'s lock (issue 30): kept alive by its heartbeat through phases that log
nothing for longer than its ttl, and free within one ttl of the job being killed with -9.
A real retrain process on a private Redis; it is killed long before it trains anything."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from control.registry import LockHeld, RedisRegistry
from tests.integration import control_processes as processes

pytestmark = pytest.mark.integration

TTL_S = 3.0
KEY = f"{processes.NAMESPACE}:registry:lock:retrain"


def test_a_retrain_killed_with_9_frees_its_lock_within_its_ttl(
    tmp_path: Path, private_redis_url: str
) -> None:
    client = redis.Redis.from_url(private_redis_url)
    job = processes.Command(
        tmp_path / "retrain",
        private_redis_url,
        "retrain",
        "--artifacts",
        str(tmp_path / "export"),
        "--dataset",
        "synthetic",  # 200,000 interactions: minutes of work, epochs of many seconds
        "--lock-ttl",
        str(TTL_S),
    )
    try:
        processes.wait_until(lambda: client.get(KEY) or not job.alive(), 120, "the lock")
        assert job.alive(), job.output()
        holder = json.loads(client.get(KEY))["holder"]  # type: ignore[arg-type]
        assert holder.endswith(f":{job.process.pid}")
        for _ in range(int(3 * TTL_S / 0.1)):  # three ttls: the heartbeat keeps it
            assert job.alive(), job.output()
            assert client.get(KEY) is not None, job.output()
            time.sleep(0.1)
        job.kill()
    finally:
        job.stop()
    assert 0 < client.pttl(KEY) <= TTL_S * 1000  # the crash left it, for at most its ttl
    registry = RedisRegistry(private_redis_url, processes.NAMESPACE)

    def taken() -> bool:
        try:
            with registry.lock("retrain", ttl_s=30):
                return True
        except LockHeld:
            return False

    assert not taken()  # the dead job's, for now
    processes.wait_until(taken, TTL_S + 5, "the lock free again")  # generous: ttl + 5 s
    registry.close()
    client.close()
