"""A Redis stall under the ranker in Triton degrades embeddings, not all of scoring."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from services.api.app import create_app
from services.embedding_cache.backing import RedisRows
from services.inference.triton_server import TritonServer, TritonUnavailable, wheel_directory
from services.serving.gateway import Gateway
from services.settings import RedisSettings, Settings, TritonSettings
from services.stores.materialize import materialize, materialize_embeddings
from services.util.local_redis import free_port
from tests.conftest import FEEDBACK_HEADERS

pytestmark = pytest.mark.integration


async def test_a_redis_stall_degrades_embeddings_and_the_triton_breaker_stays_closed(
    exported: Path, tmp_path: Path, private_redis: tuple[str, subprocess.Popen[bytes]]
) -> None:
    try:
        wheel_directory()
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    url, redis_process = private_redis
    rows = RedisRows(url, "cascade", timeout_s=5.0)
    materialize_embeddings(rows, exported / "model_repository", 1)
    rows.close()
    server = TritonServer(
        exported / "model_repository",
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=tmp_path / "triton.log",
        env={"CASCADE_REDIS__URL": url},  # the default cache timeout
    )
    server.start(timeout_s=120)
    # the default timeouts and breakers: the point is that they nest
    settings = Settings(
        artifacts=exported,
        candidates=50,
        redis=RedisSettings(url=url),
        triton=TritonSettings(url=server.http_url),
    )
    gateway = Gateway(settings)
    app = create_app(gateway=gateway)
    try:
        async for http in _client(app):
            await materialize(gateway.store, exported / "releases" / "1")
            for user in (1, 2, 3):  # warm: imports, the gateway's connections
                await http.post("/v1/recommend", json={"user_id": user, "k": 10})
            redis_process.send_signal(signal.SIGSTOP)
            reasons = []
            for user in range(10, 30):  # new users: their rows miss the cache -> Redis
                body = (await http.post("/v1/recommend", json={"user_id": user, "k": 10})).json()
                assert len({i["item_id"] for i in body["items"]}) == 10
                reasons.append(body["reasons"])
            redis_process.send_signal(signal.SIGCONT)
    finally:
        server.stop()
    scoring = [r for rs in reasons for r in rs if r.startswith("scoring:")]
    assert "scoring:circuit_open" not in scoring, reasons
    assert gateway.triton_breaker.state == "closed", reasons
    unavailable = sum("scoring:embeddings_unavailable" in rs for rs in reasons)
    assert unavailable >= len(reasons) // 2, reasons  # scored, with default embedding rows


async def _client(app: object) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app),  # type: ignore[attr-defined]
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g", headers=FEEDBACK_HEADERS
        ) as http,  # type: ignore[arg-type]
    ):
        yield http
