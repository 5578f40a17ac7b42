"""A gateway replica's report of what it applied (issue 30): short-lived, renewed while a
model loads, withdrawn when the replica stops. On a private Redis and on the embedded
stack's files."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.state import follower as state_follower
from services.state.desired_state import (
    DesiredState,
    DesiredStateStore,
    FileDesiredState,
    RedisDesiredState,
)
from services.state.follower import StateFollower
from services.util.local_redis import start_redis_server

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DesiredStateStore]:
    if request.param == "file":
        yield FileDesiredState(tmp_path / "rollout" / "desired.json")
        return
    try:
        url, process = start_redis_server(tmp_path)
    except FileNotFoundError:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    yield RedisDesiredState(url, "reports")
    process.kill()
    process.wait()


def _follower(store: DesiredStateStore, interval_s: float) -> StateFollower:
    """A follower of a gateway that serves nothing yet (what a report needs of it)."""
    gateway: Any = SimpleNamespace(router=None, releases={}, backend=None)
    return StateFollower(gateway, store, interval_s=interval_s)


def _replicas(store: DesiredStateStore) -> list[str]:
    return [str(report["replica"]) for report in store.reports()]


def _expires_in_s(store: DesiredStateStore, replica: str) -> float:
    if isinstance(store, RedisDesiredState):
        return float(store.client.pttl(f"{store.key}:replica:{replica}")) / 1000
    assert isinstance(store, FileDesiredState)
    import json

    entry = json.loads((store.directory / f"{replica}.json").read_text())
    return float(entry["expires"]) - time.time()


async def _until(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.05)


async def test_a_stopped_replica_withdraws_its_report_and_a_dead_one_expires_soon(
    store: DesiredStateStore,
) -> None:
    follower = _follower(store, interval_s=0.1)
    follower.start()
    try:
        await _until(lambda: follower.replica in _replicas(store), 10)
        # a replica killed with -9 counts as live no longer than this
        assert 0 < _expires_in_s(store, follower.replica) <= state_follower.REPORT_TTL_S <= 10
    finally:
        await follower.close()  # what Gateway.close() (the lifespan's shutdown) calls
    assert follower.replica not in _replicas(store)  # at once, not after its ttl


async def test_the_report_stays_live_through_a_long_load(
    store: DesiredStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # six intervals of 0.1 s: a busy machine may delay one renewal, not five in a row
    monkeypatch.setattr(state_follower, "REPORT_TTL_S", 0.6)
    follower = _follower(store, interval_s=0.1)
    loading = asyncio.Event()

    async def slow_load(state: DesiredState) -> None:  # a canary taking long to load
        loading.set()
        await asyncio.sleep(3.0)

    monkeypatch.setattr(follower, "apply", slow_load)
    store.write(DesiredState(production=1, canary=2, canary_weight=0.05, revision=1), 0)
    follower.start()
    try:
        await asyncio.wait_for(loading.wait(), 10)
        for _ in range(24):  # 2.4 s of the load, four ttls: still live, still behind
            reports = {r["replica"]: r for r in store.reports()}
            assert follower.replica in reports
            assert reports[follower.replica]["applied_revision"] is None
            await asyncio.sleep(0.1)
    finally:
        await follower.close()
