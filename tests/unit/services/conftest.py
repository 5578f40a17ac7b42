"""The HTTP API over the embedded default (in-memory store, in-process models), shared by the
API tests: ``client.app.state.gateway`` is the started gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from services.api.app import create_app
from services.settings import Settings
from tests.conftest import FEEDBACK_HEADERS


@pytest.fixture
async def client(exported: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(artifacts=exported, max_body_bytes=4096))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", headers=FEEDBACK_HEADERS
        ) as http:
            http.app = app  # type: ignore[attr-defined]
            yield http
