"""Acknowledged feedback is durable (issue 8, item 4), and the Redis store survives a
restart under its pooled connections (item 12)."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from services.api.app import create_app
from services.embedding_cache.backing import RedisRows
from services.errors import FeedbackNotDurable
from services.serving.gateway import Gateway
from services.settings import FeedbackSettings, RedisSettings, Settings
from services.stores.materialize import materialize_embeddings
from services.stores.redis import RedisStore
from services.util.local_redis import start_redis_server
from tests.conftest import FEEDBACK_HEADERS, TEST_FEEDBACK_KEY

pytestmark = pytest.mark.integration

STRICT = FeedbackSettings(require_durable=True, keys=[SecretStr(TEST_FEEDBACK_KEY)])


class RedisProcess:
    """A private redis-server that a test can kill -9 and start again on the same port."""

    def __init__(self, directory: Path, persist: bool) -> None:
        self.directory, self.persist = directory, persist
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> str:
        try:
            self.url, self.process = start_redis_server(
                self.directory, port=self.port, persist=self.persist
            )
        except FileNotFoundError:
            pytest.skip("redis-server is not installed (.ci/run installs it)")
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        return self.url

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path, persist=True)
    server.start()
    yield server
    server.kill()


async def _client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    rows = RedisRows(str(settings.redis.url), settings.embedding_cache.namespace, timeout_s=5.0)
    materialize_embeddings(rows, settings.artifacts / "model_repository", 1)
    rows.close()
    app = create_app(gateway=Gateway(settings))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g", headers=FEEDBACK_HEADERS
        ) as http,
    ):
        yield http


async def test_a_redis_without_aof_is_refused_at_start(exported: Path, tmp_path: Path) -> None:
    server = RedisProcess(tmp_path, persist=False)
    url = server.start()
    try:
        settings = Settings(artifacts=exported, redis=RedisSettings(url=url), feedback=STRICT)
        gateway = Gateway(settings)
        with pytest.raises(FeedbackNotDurable, match="CASCADE_FEEDBACK__REQUIRE_DURABLE"):
            await gateway.start()
        await gateway.close()
        lenient = settings.model_copy(update={"feedback": FeedbackSettings(require_durable=False)})
        async for http in _client(lenient):  # accepted on request, and said so
            ready = (await http.get("/health/ready")).json()
            assert ready["feedback_durable"] is False and ready["feedback_refused"] is None
    finally:
        server.kill()


async def test_acknowledged_feedback_survives_a_redis_kill_and_restart(
    exported: Path, durable_redis: RedisProcess
) -> None:
    settings = Settings(
        artifacts=exported,
        redis=RedisSettings(url=durable_redis.url, timeout_ms=500),
        feedback=STRICT,
    )
    acknowledged: list[str] = []
    async for http in _client(settings):
        assert (await http.get("/health/ready")).json()["feedback_durable"] is True
        for batch in range(20):
            events = [
                {"user_id": batch, "item_id": i, "type": "click", "event_id": f"e{batch}-{i}"}
                for i in range(10)
            ]
            response = await http.post("/v1/feedback", json={"events": events})
            assert response.status_code == 200
            acknowledged += response.json()["ids"]
    durable_redis.kill()  # kill -9, right after the last acknowledgement
    durable_redis.start()
    store = RedisStore(durable_redis.url)
    await store.start()
    try:
        stored = await store.read_feedback(count=1000)
        assert len(stored) == len(acknowledged) == 200  # 0 acknowledged events lost
        again = await store.append_feedback(
            [{"user_id": "0", "item_id": "0", "type": "click", "event_id": "e0-0"}],
            max_len=10_000,
            idempotency_ttl_s=60,
        )
        assert again.duplicates == 1 and again.ids == [acknowledged[0]]  # ids persist too
    finally:
        await store.close()


async def test_feedback_stream_is_trimmed_to_its_bound(durable_redis: RedisProcess) -> None:
    store = RedisStore(durable_redis.url)
    await store.start()
    try:
        for _ in range(30):
            events = [{"user_id": "1", "item_id": str(i), "type": "click"} for i in range(200)]
            await store.append_feedback(events, max_len=1000, idempotency_ttl_s=60)
        length = await store.client.xlen(store.key("feedback"))
        assert 1000 <= length < 2000  # MAXLEN ~ trims whole macro nodes: about the bound
    finally:
        await store.close()


async def test_pooled_connections_survive_a_redis_restart(durable_redis: RedisProcess) -> None:
    store = RedisStore(durable_redis.url, socket_timeout_s=1.0)
    await store.start()
    try:
        await store.mark_loaded(1, 0)
        for _ in range(3):  # the pool now holds connections to the first process
            await store.lookup(1)
        durable_redis.kill()
        durable_redis.start()
        found = await store.lookup(1)  # first call after the restart: no error
        assert found.loaded
    finally:
        await store.close()
