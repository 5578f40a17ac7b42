"""The short path of POST /v1/recommend answers well-formed requests itself and hands
everything else to FastAPI unchanged."""

from __future__ import annotations

import httpx
import pytest

from services.api.schemas import RecommendResponse


@pytest.fixture
def route_calls(client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records each request that reached FastAPI's routing (the path behind the short one)."""
    router = type(client.app.router)  # type: ignore[attr-defined]
    calls: list[str] = []
    inner = router.__call__

    async def recording(self: object, scope: dict, receive: object, send: object) -> None:
        if scope["type"] == "http":
            calls.append(scope["path"])
        await inner(self, scope, receive, send)  # type: ignore[arg-type]

    monkeypatch.setattr(router, "__call__", recording)
    return calls


async def test_a_well_formed_request_is_answered_without_the_route(
    client: httpx.AsyncClient, route_calls: list[str]
) -> None:
    response = await client.post("/v1/recommend", json={"user_id": 3, "k": 4, "exclude": [1]})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert len(RecommendResponse.model_validate_json(response.content).items) == 4
    assert route_calls == []


@pytest.mark.parametrize(
    ("content", "field"),
    [(b'{"user_id": 3, "k": "five"}', "k"), (b'{"k": 5}', "user_id"), (b'{"user_id": 3,', None)],
)
async def test_a_request_the_model_rejects_gets_fastapis_422(
    client: httpx.AsyncClient, route_calls: list[str], content: bytes, field: str | None
) -> None:
    headers = {"content-type": "application/json"}
    response = await client.post("/v1/recommend", content=content, headers=headers)
    assert response.status_code == 422
    assert route_calls == ["/v1/recommend"]
    if field is not None:
        assert response.json()["detail"][0]["loc"] == ["body", field]


async def test_a_body_that_is_not_declared_json_goes_to_fastapi(
    client: httpx.AsyncClient, route_calls: list[str]
) -> None:
    headers = {"content-type": "text/plain"}
    response = await client.post("/v1/recommend", content=b'{"user_id": 3}', headers=headers)
    assert route_calls == ["/v1/recommend"]
    assert response.status_code in (200, 422)  # whatever FastAPI decides, FastAPI decided it


async def test_a_gateway_not_ready_is_503_with_a_detail(
    client: httpx.AsyncClient, route_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = client.app.state.gateway  # type: ignore[attr-defined]
    monkeypatch.setattr(gateway, "recommender", None)
    response = await client.post("/v1/recommend", json={"user_id": 3})
    assert response.status_code == 503
    assert response.json() == {"detail": "no release is loaded"}
    assert route_calls == []
