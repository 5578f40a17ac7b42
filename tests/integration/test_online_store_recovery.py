"""A Redis that comes back empty (restarted without persistence) is noticed, answered as
degraded, reported by readiness, and reloaded from the served release (issue 8, item 3)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis

from services.api.app import create_app
from services.embedding_cache.backing import RedisRows
from services.serving.gateway import Gateway
from services.settings import RedisSettings, Settings
from services.stores.materialize import materialize_embeddings
from services.stores.redis import RedisStore
from services.util.local_redis import start_redis_server
from tests.conftest import FEEDBACK_HEADERS

pytestmark = pytest.mark.integration


async def _client(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    rows = RedisRows(str(settings.redis.url), settings.embedding_cache.namespace, timeout_s=5.0)
    materialize_embeddings(rows, settings.artifacts / "model_repository", 1)
    rows.close()
    gateway = Gateway(settings)
    app = create_app(gateway=gateway)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g", headers=FEEDBACK_HEADERS
        ) as http,
    ):
        yield http, gateway


def _wipe_users(url: str) -> None:
    """What a restart without persistence does to the online store: the feature keys go
    (the embedding rows are left, so only the store's own detection is exercised)."""
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter("cascade:s*"))
    client.delete(*keys)
    client.close()


async def _recommend(http: httpx.AsyncClient, user_id: int = 3) -> dict:
    response = await http.post("/v1/recommend", json={"user_id": user_id, "k": 10})
    assert response.status_code == 200
    return dict(response.json())


async def test_empty_store_is_degraded_then_reloaded_automatically(
    exported: Path, private_redis_url: str
) -> None:
    settings = Settings(
        artifacts=exported, redis=RedisSettings(url=private_redis_url, timeout_ms=500)
    )
    async for http, gateway in _client(settings):
        assert gateway.store_monitor is not None
        assert gateway.store_monitor.state == "ok"  # the start filled the fresh Redis
        before = await _recommend(http)
        assert not before["degraded"]
        seen = set((await gateway.store.lookup(3)).user.seen.tolist())  # type: ignore[union-attr]

        _wipe_users(private_redis_url)
        gateway.store_monitor.auto_materialize = False  # first: what a request sees
        empty = await _recommend(http)
        assert empty["degraded"] and "features:store_empty" in empty["reasons"]
        await gateway.store_monitor.check()
        ready = (await http.get("/health/ready")).json()
        assert ready["online_store"] == "empty"
        metrics = (await http.get("/metrics")).text
        assert 'cascade_fallback_total{reason="store_empty",stage="features"}' in metrics
        assert 'cascade_online_store_state{state="empty"} 1.0' in metrics

        gateway.store_monitor.auto_materialize = True  # then: the gateway repairs it
        await _recommend(http)  # a request that sees the store empty wakes the monitor
        for _ in range(100):
            if gateway.store_monitor.state == "ok":
                break
            await asyncio.sleep(0.05)
        assert (await http.get("/health/ready")).json()["online_store"] == "ok"
        after = await _recommend(http)
        assert not after["degraded"]
        assert not {i["item_id"] for i in after["items"]} & seen  # seen items filtered again
        assert after["items"] == before["items"]


async def test_reload_is_left_to_the_replica_holding_the_lock(
    exported: Path, private_redis_url: str
) -> None:
    settings = Settings(
        artifacts=exported, redis=RedisSettings(url=private_redis_url, timeout_ms=500)
    )
    async for _http, gateway in _client(settings):
        _wipe_users(private_redis_url)
        other = RedisStore(private_redis_url)
        await other.start()
        assert await other.try_lock("materialize", 30)  # another replica is reloading
        assert gateway.store_monitor is not None
        assert await gateway.store_monitor.check() == "loading"
        assert (await gateway.store.lookup(3)).user is None  # this one did not write
        await other.unlock("materialize")
        await other.close()
        assert await gateway.store_monitor.check() == "ok"
        assert (await gateway.store.lookup(3)).user is not None


async def test_unreachable_store_is_reported_not_reloaded(exported: Path, tmp_path: Path) -> None:
    try:
        url, process = start_redis_server(tmp_path)
    except FileNotFoundError:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    try:
        settings = Settings(artifacts=exported, redis=RedisSettings(url=url, timeout_ms=200))
        async for http, gateway in _client(settings):
            process.send_signal(signal.SIGSTOP)
            assert gateway.store_monitor is not None
            gateway.store_monitor.timeout_s = 0.3
            assert await gateway.store_monitor.check() == "unreachable"
            assert (await http.get("/health/ready")).json()["online_store"] == "unreachable"
            process.send_signal(signal.SIGCONT)
            assert await gateway.store_monitor.check() == "ok"
    finally:
        process.kill()
        process.wait()
