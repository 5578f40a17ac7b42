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
    async with app_client(Settings(artifacts=exported, max_body_bytes=4096)) as http:
        yield http
