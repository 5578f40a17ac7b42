"""The gateway on a real Triton server (from the nvidia-pytriton wheel) and the real Redis."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from services.api.app import create_app
from services.embedding_cache.backing import CLIENT_NAME, RedisRows
from services.inference.placement import PlacedBackend
from services.inference.triton_server import TritonServer, TritonUnavailable, wheel_directory
from services.serving.gateway import Gateway
from services.settings import RedisSettings, Settings, TritonSettings
from services.stores.materialize import materialize, materialize_embeddings
from services.util.local_redis import free_port
from tests.conftest import FEEDBACK_HEADERS, redis_url

pytestmark = pytest.mark.integration

SLOW_RANKER = '''
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from services.inference.models import RankingModel


class TritonPythonModel:
    """The ranker with a 300 ms delay: a Triton that answers, but too late."""

    def initialize(self, args):
        self.model = RankingModel(Path(args["model_repository"]) / args["model_version"])
        self.model.load()

    def execute(self, requests):
        time.sleep(0.3)
        responses = []
        for request in requests:
            sparse = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "sparse"))
            dense = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "dense"))
            scores, degraded = self.model.score(sparse, dense)
            score = scores.astype(np.float32).reshape(-1, 1)
            flags = np.full_like(score, float(degraded))
            outputs = [pb_utils.Tensor.from_dlpack("score", score),
                       pb_utils.Tensor.from_dlpack("degraded", flags)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
'''


def _start(repository: Path, log: Path, env: dict[str, str] | None = None) -> TritonServer:
    try:
        wheel_directory()
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    server = TritonServer(
        repository,
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=log,
        env=env,
    )
    server.start(timeout_s=90)
    return server


@pytest.fixture(scope="module")
def triton(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """Triton whose ranker reads its embedding rows through the hierarchical cache, backed
    by the real Redis (the rows materialized first, as ``cascade materialize`` does)."""
    url = redis_url(db=10)
    if url is None:
        pytest.skip("no Redis answers on 127.0.0.1:6379 (.ci/run starts one)")
    rows = RedisRows(url, "cascade", timeout_s=5.0)
    materialize_embeddings(rows, exported / "model_repository", 1)
    rows.close()
    server = _start(
        exported / "model_repository",
        tmp_path_factory.mktemp("triton") / "triton.log",
        env={"CASCADE_REDIS__URL": url},
    )
    yield server
    server.stop()


async def _client(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    gateway = Gateway(settings)
    app = create_app(gateway=gateway)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g", headers=FEEDBACK_HEADERS
        ) as http,
    ):
        yield http, gateway


def _redis() -> RedisSettings:
    url = redis_url(db=10)
    if url is None:
        pytest.skip("no Redis answers on 127.0.0.1:6379 (.ci/run starts one)")
    return RedisSettings(url=url, timeout_ms=200)


@pytest.mark.parametrize(
    ("protocol", "query_tower"), [("http", "triton"), ("grpc", "triton"), ("grpc", "gateway")]
)
async def test_triton_with_the_embedding_cache_and_redis_answer_like_the_embedded_default(
    exported: Path, triton: TritonServer, protocol: str, query_tower: str
) -> None:
    port = triton.http_port if protocol == "http" else triton.grpc_port
    real = Settings(
        artifacts=exported,
        redis=_redis(),
        triton=TritonSettings(
            url=f"127.0.0.1:{port}",
            protocol=protocol,
            timeout_ms=2000,
            query_tower=query_tower,  # type: ignore[arg-type]
        ),
    )
    async for http, gateway in _client(real):
        placed = isinstance(gateway.backend, PlacedBackend)
        assert placed == (query_tower == "gateway")
        await materialize(gateway.store, exported / "releases" / "1")
        served = [
            (await http.post("/v1/recommend", json={"user_id": u, "k": 10})).json()
            for u in (3, 4, 5)
        ]
    async for http, _ in _client(Settings(artifacts=exported)):
        embedded = [
            (await http.post("/v1/recommend", json={"user_id": u, "k": 10})).json()
            for u in (3, 4, 5)
        ]
    readers = [
        c
        for c in redis.Redis.from_url(real.redis.url or "").client_list()
        if c["name"] == CLIENT_NAME
    ]
    assert any(c["db"] == "10" for c in readers)  # the ranker in Triton read rows from Redis
    for a, b in zip(served, embedded, strict=True):
        assert not a["degraded"], a["reasons"]
        assert [i["item_id"] for i in a["items"]] == [i["item_id"] for i in b["items"]]
        for x, y in zip(a["items"], b["items"], strict=True):
            assert x["score"] == pytest.approx(y["score"], abs=1e-5)


async def test_triton_metrics_count_our_requests(exported: Path, triton: TritonServer) -> None:
    import urllib.request

    settings = Settings(
        artifacts=exported, triton=TritonSettings(url=triton.http_url, timeout_ms=2000)
    )
    async for http, _ in _client(settings):
        assert not (await http.post("/v1/recommend", json={"user_id": 3})).json()["degraded"]
    with urllib.request.urlopen(
        f"http://127.0.0.1:{triton.metrics_port}/metrics", timeout=5
    ) as response:
        text = response.read().decode()
    assert 'nv_inference_request_success{model="ranker",version="1"}' in text


async def test_slow_triton_model_times_out_and_degrades(exported: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    shutil.copytree(exported / "model_repository", repository)
    (repository / "ranker" / "1" / "model.py").write_text(SLOW_RANKER)
    server = _start(repository, tmp_path / "triton.log")
    try:
        settings = Settings(
            artifacts=exported, triton=TritonSettings(url=server.http_url, timeout_ms=100)
        )
        async for http, _ in _client(settings):
            body = (await http.post("/v1/recommend", json={"user_id": 3, "k": 10})).json()
            assert body["reasons"] == ["scoring:timeout"]
            assert len({i["item_id"] for i in body["items"]}) == 10
    finally:
        server.stop()


async def test_triton_stopped_while_serving_degrades(exported: Path, tmp_path: Path) -> None:
    server = _start(exported / "model_repository", tmp_path / "triton.log")
    settings = Settings(
        artifacts=exported, triton=TritonSettings(url=server.http_url, timeout_ms=500)
    )
    try:
        async for http, _ in _client(settings):
            assert not (await http.post("/v1/recommend", json={"user_id": 3})).json()["degraded"]
            server.stop()
            body = (await http.post("/v1/recommend", json={"user_id": 3, "k": 10})).json()
            assert body["degraded"] and "scoring:error" in body["reasons"]
            assert len({i["item_id"] for i in body["items"]}) == 10
    finally:
        server.stop()
