"""POST /v1/feedback waits for a slow store up to its own budget (redis.feedback_timeout_ms),
longer than the request path's redis.timeout_ms, and refuses (503) beyond it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from services.api.app import create_app
from services.serving.gateway import Gateway
from services.settings import RedisSettings, Settings
from tests.conftest import FEEDBACK_HEADERS

CLICK = {"events": [{"user_id": 3, "item_id": 1, "type": "click", "event_id": "e-1"}]}


async def _post_with_store_delay(exported: Path, delay_s: float) -> httpx.Response:
    settings = Settings(
        artifacts=exported, redis=RedisSettings(timeout_ms=25, feedback_timeout_ms=300)
    )
    gateway = Gateway(settings)
    app = create_app(gateway=gateway)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g", headers=FEEDBACK_HEADERS
        ) as http,
    ):
        append = gateway.store.append_feedback

        async def slow_append(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(delay_s)
            return await append(*args, **kwargs)

        gateway.store.append_feedback = slow_append  # type: ignore[method-assign]
        return await http.post("/v1/feedback", json=CLICK)


async def test_a_store_slower_than_the_request_path_budget_still_stores_the_click(
    exported: Path,
) -> None:
    response = await _post_with_store_delay(exported, 0.15)  # 6x timeout_ms
    assert response.status_code == 200, response.text
    assert response.json()["stored"] == 1


async def test_a_store_slower_than_the_feedback_budget_gets_a_503(exported: Path) -> None:
    response = await _post_with_store_delay(exported, 0.6)
    assert response.status_code == 503
    assert "redis" in response.text.lower() or "store" in response.text.lower()
