"""A write of the desired state to Redis is announced, and a follower waiting between its
ticks applies it at once (the poll stays the fallback). Against the test Redis."""

from __future__ import annotations

import asyncio
import json
import secrets
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from services.serving.routing import VersionRouter
from services.state.desired_state import DesiredState, DesiredStateConflict, RedisDesiredState
from services.state.follower import StateFollower
from tests.conftest import redis_url


@pytest.fixture
def url() -> str:
    found = redis_url()
    if found is None:
        pytest.skip("no Redis at the test address")
    return found


def _store(url: str, namespace: str) -> RedisDesiredState:
    return RedisDesiredState(url, namespace, timeout_s=2.0)


def test_only_a_write_that_happened_is_published(url: str) -> None:
    namespace = f"test-changes-{secrets.token_hex(4)}"
    store = _store(url, namespace)
    listener = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
    listener.subscribe(store.channel)
    try:
        store.write(DesiredState(production=1, revision=1), 0)
        with pytest.raises(DesiredStateConflict):
            store.write(DesiredState(production=2, revision=2), 0)  # stale revision
        store.write(DesiredState(production=1, canary=2, canary_weight=0.5, revision=2), 1)
        messages = []
        for _ in range(10):  # the subscription's confirmation reads as None
            if (message := listener.get_message(timeout=0.5)) is not None:
                messages.append(json.loads(message["data"]))
        assert [(m["revision"], m["canary"]) for m in messages] == [(1, None), (2, 2)]
    finally:
        listener.close()
        store.client.delete(store.key)
        store.close()


async def test_a_waiting_reader_returns_on_a_write(url: str) -> None:
    namespace = f"test-changes-{secrets.token_hex(4)}"
    watcher, writer = _store(url, namespace), _store(url, namespace)
    try:
        await watcher.wait_for_change(0.01)  # subscribed from here on
        await asyncio.to_thread(writer.write, DesiredState(production=1, revision=1), 0)
        await asyncio.wait_for(watcher.wait_for_change(600), 30)  # not the 600 s timeout
    finally:
        await watcher.stop_watching()
        writer.client.delete(writer.key)
        writer.close()


async def test_an_unreachable_redis_is_waited_out_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RedisDesiredState("redis://127.0.0.1:1", "nowhere", timeout_s=0.2)
    await store.wait_for_change(0.3)
    await store.wait_for_change(0.3)
    assert caplog.text.count("desired state changes not announced") == 1  # said once
    await store.stop_watching()


async def test_a_follower_applies_a_write_long_before_its_interval(url: str) -> None:
    namespace = f"test-changes-{secrets.token_hex(4)}"
    writer = _store(url, namespace)
    writer.write(DesiredState(production=1, revision=1), 0)

    async def nothing(*_: Any) -> None:
        return None

    gateway: Any = SimpleNamespace(
        releases={1: object(), 2: object()},
        router=VersionRouter(1),
        backend=SimpleNamespace(serve_versions=nothing),  # in process: nothing to reconcile
        warm_up=nothing,
    )
    follower = StateFollower(gateway, _store(url, namespace), interval_s=600, retire_after_s=600)
    follower.start()
    try:
        await _until(lambda: follower.applied_revision == 1)  # the first tick, at once
        await asyncio.sleep(0.2)  # waiting between ticks now
        next_state = DesiredState(production=1, canary=2, canary_weight=0.5, revision=2)
        await asyncio.to_thread(writer.write, next_state, 1)
        await _until(lambda: follower.applied_revision == 2)  # woken, not the 600 s tick
        assert gateway.router.canary == 2
    finally:
        await follower.close()
        writer.client.delete(writer.key)
        writer.close()


async def _until(condition: Any, timeout_s: float = 30.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout_s)
