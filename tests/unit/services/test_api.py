"""The HTTP API over the embedded default (in-memory store, in-process models)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from services.api.app import create_app
from services.serving.gateway import Gateway
from services.settings import Settings


def _gateway(client: httpx.AsyncClient) -> Gateway:
    return client.app.state.gateway  # type: ignore[attr-defined,no-any-return]


async def test_recommend_returns_k_sorted_unseen_items(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/recommend", json={"user_id": 3, "k": 15})
    assert response.status_code == 200
    body = response.json()
    assert body["user_id"] == 3 and not body["degraded"] and body["reasons"] == []
    items = [i["item_id"] for i in body["items"]]
    scores = [i["score"] for i in body["items"]]
    assert len(items) == 15 == len(set(items))
    assert scores == sorted(scores, reverse=True)
    seen = (await _gateway(client).store.lookup(3)).user.seen  # type: ignore[union-attr]
    assert not set(items) & set(seen.tolist())
    assert set(body["timings_ms"]) == {"features", "retrieval", "filtering", "scoring", "ordering"}
    assert body["model_versions"]["ranker"] == 1


async def test_exclude_is_honoured(client: httpx.AsyncClient) -> None:
    first = (await client.post("/v1/recommend", json={"user_id": 3, "k": 5})).json()
    banned = [i["item_id"] for i in first["items"][:3]]
    again = (
        await client.post("/v1/recommend", json={"user_id": 3, "k": 5, "exclude": banned})
    ).json()
    assert not {i["item_id"] for i in again["items"]} & set(banned)


async def test_unknown_user_gets_a_cold_start_answer(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/recommend", json={"user_id": 987654321, "k": 5})).json()
    assert len(body["items"]) == 5 and body["degraded"] is False


async def test_k_larger_than_candidates_is_filled(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/recommend", json={"user_id": 3, "k": 350})).json()
    ids = [i["item_id"] for i in body["items"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 300


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"user_id": 1, "k": 0}, "k"),
        ({"user_id": 1, "k": 501}, "k"),
        ({"user_id": ""}, "user_id"),  # an id is a number or 1..256 characters
        ({"user_id": "x" * 257}, "user_id"),
        ({"user_id": 1, "colour": "red"}, "colour"),
        ({"user_id": 1, "exclude": list(range(1001))}, "exclude"),
        ({"k": 3}, "user_id"),
        ({"user_id": 1, "context": {"nested": {"a": 1}}}, "context"),
    ],
)
async def test_bad_input_is_422_naming_the_field(
    client: httpx.AsyncClient, payload: dict, field: str
) -> None:
    response = await client.post("/v1/recommend", json=payload)
    assert response.status_code == 422
    assert any(field in map(str, error["loc"]) for error in response.json()["detail"])


async def test_oversized_body_is_413(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/recommend",
        content=b'{"user_id": 1, "pad": "' + b"x" * 5000 + b'"}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413 and "exceeds 4096 bytes" in response.json()["detail"]


async def test_not_json_is_422(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/recommend", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422


async def test_feedback_is_stored_before_it_is_acknowledged(client: httpx.AsyncClient) -> None:
    events = [
        {"user_id": 3, "item_id": 7, "type": "impression", "model_version": 1},
        {"user_id": 3, "item_id": 7, "type": "click", "model_version": 1},
    ]
    response = await client.post("/v1/feedback", json={"events": events})
    assert response.status_code == 200 and response.json()["stored"] == 2
    stored = await _gateway(client).store.read_feedback()
    assert [e["type"] for e in stored] == ["impression", "click"]
    # no request_id: organic, whatever version the client claims
    assert {(e["trust"], e["model_version"]) for e in stored} == {("organic", "")}
    metrics = (await client.get("/metrics")).text
    organic = 'model_version="unattributed",trust="organic",type="click"'
    assert f"cascade_feedback_events_total{{{organic}}}" in metrics


@pytest.mark.parametrize(
    "payload",
    [
        {"events": []},
        {"events": [{"user_id": 1, "item_id": 2, "type": "purchase"}]},
        {"events": [{"user_id": 1, "type": "click"}]},
    ],
)
async def test_bad_feedback_is_422_and_stores_nothing(
    client: httpx.AsyncClient, payload: dict
) -> None:
    assert (await client.post("/v1/feedback", json=payload)).status_code == 422
    assert await _gateway(client).store.read_feedback() == []


async def test_health_and_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health/live")).json() == {"status": "live"}
    ready = await client.get("/health/ready")
    assert ready.status_code == 200 and ready.json()["versions"] == [1]
    await client.post("/v1/recommend", json={"user_id": 3})
    metrics = (await client.get("/metrics")).text
    assert 'cascade_stage_latency_seconds_count{stage="scoring"}' in metrics
    assert "cascade_recommendations_total" in metrics
    assert (await client.get("/openapi.json")).json()["paths"]["/v1/recommend"]


async def test_pinning_a_version_that_is_not_served_uses_the_default(
    client: httpx.AsyncClient,
) -> None:
    body = (await client.post("/v1/recommend", json={"user_id": 3, "model_version": 42})).json()
    assert body["model_versions"]["release"] == 1


async def test_readiness_is_false_before_start(exported: Path) -> None:
    app = create_app(Settings(artifacts=exported))
    app.state.gateway = Gateway(Settings(artifacts=exported))  # built, never started
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        assert (await http.get("/health/ready")).status_code == 503
        assert (await http.get("/health/live")).status_code == 200
        response = await http.post("/v1/recommend", json={"user_id": 1})
        assert response.status_code == 503 and "no release" in response.json()["detail"]
