"""What a hostile client tried against the API (issue 8): strict, bounded, documented."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from services.api.schemas import INT64_MAX


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"user_id": 2**63}, "user_id"),
        ({"user_id": 1, "exclude": [2**63]}, "exclude"),
        ({"user_id": 1, "exclude": [-1]}, "exclude"),
        ({"user_id": 1, "model_version": 2**64}, "model_version"),
        ({"user_id": "0" * 300}, "user_id"),  # a string is never read as a number
        ({"user_id": True}, "user_id"),  # nor a boolean as an id
        ({"user_id": 1, "exclude": [True, False]}, "exclude"),
        ({"user_id": 1, "k": "5"}, "k"),
        ({"user_id": 1.5}, "user_id"),
        ({"user_id": 1, "k": True}, "k"),
    ],
)
async def test_out_of_range_or_mistyped_ids_are_422_naming_the_field(
    client: httpx.AsyncClient, payload: dict, field: str
) -> None:
    response = await client.post("/v1/recommend", json=payload)
    assert response.status_code == 422
    assert any(field in map(str, error["loc"]) for error in response.json()["detail"])


async def test_the_largest_int64_ids_are_served(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/recommend", json={"user_id": INT64_MAX, "k": 3, "exclude": [INT64_MAX, 5.0]}
    )
    assert response.status_code == 200 and len(response.json()["items"]) == 3


@pytest.mark.parametrize(
    "event",
    [
        {"user_id": 2**63, "item_id": 1, "type": "click"},
        {"user_id": 1, "item_id": 2**63, "type": "click"},
        {"user_id": "", "item_id": 1, "type": "click"},
        {"user_id": 1, "item_id": "x" * 257, "type": "click"},
        {"user_id": 1, "item_id": True, "type": "click"},
        {"user_id": 1, "item_id": 1, "type": "click", "event_id": "a b"},
        {"user_id": 1, "item_id": 1, "type": "click", "event_id": "x" * 65},
    ],
)
async def test_bad_feedback_ids_are_422(client: httpx.AsyncClient, event: dict) -> None:
    assert (await client.post("/v1/feedback", json={"events": [event]})).status_code == 422


async def test_chunked_body_over_the_limit_is_413(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"user_id": 1, "context": {"pad": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}}'

    response = await client.post(
        "/v1/recommend", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and "exceeds 4096 bytes" in response.json()["detail"]


async def test_chunked_body_under_the_limit_is_served(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"user_id": 3,'
        yield b' "k": 4}'

    response = await client.post(
        "/v1/recommend", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200 and len(response.json()["items"]) == 4


async def test_openapi_documents_every_status_the_routes_give(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    for route in ("/v1/recommend", "/v1/feedback"):
        assert {"200", "400", "413", "422", "503"} <= set(paths[route]["post"]["responses"])
    assert "401" in paths["/v1/feedback"]["post"]["responses"]  # no or a wrong client key


async def test_the_api_docs_load_without_internet_access(client: httpx.AsyncClient) -> None:
    """/docs links only assets the gateway serves itself (a CDN is blank offline)."""
    page = await client.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    links = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert links and not [link for link in links if "//" in link]  # nothing off the host
    for link in links:
        asset = await client.get(link)
        assert asset.status_code == 200 and len(asset.content) > 500, link
    assert (await client.get("/redoc")).status_code == 404  # it loads from a CDN: not served


async def test_feedback_model_versions_never_create_new_series(client: httpx.AsyncClient) -> None:
    for version in range(1000, 1025):
        events = [{"user_id": 1, "item_id": 2, "type": "click", "model_version": version}]
        assert (await client.post("/v1/feedback", json={"events": events})).status_code == 200
    metrics = (await client.get("/metrics")).text
    series = [
        line for line in metrics.splitlines() if line.startswith("cascade_feedback_events_total{")
    ]
    versions = {line.split('model_version="')[1].split('"')[0] for line in series}
    assert "unattributed" in versions  # a claimed version is never the label (nor trusted)
    assert not any(str(v) in versions for v in range(1000, 1025))


async def test_feedback_retries_with_an_event_id_are_stored_once(
    client: httpx.AsyncClient,
) -> None:
    event = {"user_id": 3, "item_id": 7, "type": "click", "event_id": "c-42"}
    first = (await client.post("/v1/feedback", json={"events": [event]})).json()
    again = (await client.post("/v1/feedback", json={"events": [event, event]})).json()
    assert first["stored"] == 1 and first["duplicates"] == 0
    assert again["stored"] == 0 and again["duplicates"] == 2
    assert again["ids"] == first["ids"] * 2  # the earlier stream id, acknowledged again
    store = client.app.state.gateway.store  # type: ignore[attr-defined]
    assert len(await store.read_feedback()) == 1


async def test_new_users_are_counted_as_cold_starts_without_degrading(
    client: httpx.AsyncClient,
) -> None:
    body = (await client.post("/v1/recommend", json={"user_id": 987654321, "k": 3})).json()
    assert body["degraded"] is False
    metrics = (await client.get("/metrics")).text
    assert 'cascade_fallback_total{reason="cold_start",stage="retrieval"}' in metrics


async def test_metrics_are_rendered_off_the_event_loop(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow scrape (a large registry) must not stall request handling: the exposition
    is rendered in a worker thread, not on the loop's thread."""
    import threading

    from services.api.routes import health

    rendered_on = []

    def render() -> bytes:
        rendered_on.append(threading.current_thread())
        return b"# rendered\n"

    monkeypatch.setattr(health, "render_metrics", render)
    response = await client.get("/metrics")
    assert response.status_code == 200 and response.text == "# rendered\n"
    assert rendered_on and rendered_on[0] is not threading.main_thread()
