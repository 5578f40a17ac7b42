"""POST /v1/recommend writes its answer itself (not through the response model): the body
must still be what the response model says, non-finite scores included."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from services.api.schemas import RecommendResponse


async def test_the_answer_matches_the_response_model(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/recommend", json={"user_id": 3, "k": 5})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = RecommendResponse.model_validate_json(response.content)
    assert len(body.items) == 5 and body.model_versions["release"] == 1
    assert set(body.timings_ms) == {"features", "retrieval", "filtering", "scoring", "ordering"}
    schema = client.app.openapi()["paths"]["/v1/recommend"]["post"]  # type: ignore[attr-defined]
    documented = schema["responses"]["200"]["content"]["application/json"]["schema"]
    assert documented == {"$ref": "#/components/schemas/RecommendResponse"}


async def test_a_non_finite_score_is_written_as_null_not_as_invalid_json(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = client.app.state.gateway  # type: ignore[attr-defined]
    real = gateway.recommend

    async def with_a_nan(*args: object, **kwargs: object) -> object:
        ctx, release = await real(*args, **kwargs)
        ctx.scores = ctx.scores.copy()
        ctx.scores[1] = np.nan
        ctx.scores[2] = np.inf
        return ctx, release

    monkeypatch.setattr(gateway, "recommend", with_a_nan)
    response = await client.post("/v1/recommend", json={"user_id": 3, "k": 4})
    assert response.status_code == 200
    scores = [item["score"] for item in json.loads(response.content)["items"]]
    assert scores[1] is None and scores[2] is None
    assert all(isinstance(s, float) for s in (scores[0], scores[3]))
