"""The HTTP API over the embedded default (in-memory store, in-process models), shared by the
API tests: ``client.app.state.gateway`` is the started gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from services.settings import Settings
from tests.conftest import app_client


@pytest.fixture
async def client(exported: Path) -> AsyncIterator[httpx.AsyncClient]:
    # a generous scoring timeout (default 25 ms): on a busy test machine an answer must not
    # come back degraded (unscored) where a test checks a scored one
    settings = Settings(artifacts=exported, max_body_bytes=4096, triton={"timeout_ms": 5000})
    async with app_client(settings) as http:
        yield http
