"""Shared fixtures: small datasets made in the test, never downloaded."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from pipelines.data.schema import RawDataset
from pipelines.data.synthetic import make_synthetic
from services.util.local_redis import start_redis_server

# The shared test Redis does not persist (nor does CI's): gateways in tests accept that, except
# in the tests of that refusal, which set FeedbackSettings(require_durable=True) themselves.
os.environ.setdefault("CASCADE_FEEDBACK__REQUIRE_DURABLE", "false")
# Feedback needs a client key: the gateways in tests accept this one (their settings read
# the environment, `cascade serve` processes inherit it) and the simulated users send it;
# test clients made in the tests send FEEDBACK_HEADERS.
TEST_FEEDBACK_KEY = "cascade-test-feedback-key"
FEEDBACK_HEADERS = {"Authorization": f"Bearer {TEST_FEEDBACK_KEY}"}
os.environ.setdefault("CASCADE_FEEDBACK__KEYS", f'["{TEST_FEEDBACK_KEY}"]')
os.environ.setdefault("CASCADE_FEEDBACK_KEY", TEST_FEEDBACK_KEY)
# The test exports' tables are tiny: served through the embedding cache all the same (as
# tables over the in-memory budget are), so that the cache tests exercise it; the tests of
# the choice by size set the budget themselves.
os.environ.setdefault("CASCADE_EMBEDDING_CACHE__IN_MEMORY_MAX_MB", "0")

# What the `exported` fixture trains on (synthetic users, items, interactions; seed 0) and how
EXPORTED_SIZE = (300, 400, 15_000)
EXPORTED_TRAINING = {"two_tower_epochs": 2, "bpr_epochs": 1, "dlrm_epochs": 1, "gbm_rounds": 20}


@pytest.fixture(scope="session")
def small_dataset() -> RawDataset:
    """A few thousand synthetic interactions in the MovieLens schema."""
    return make_synthetic(n_users=300, n_items=400, n_interactions=12_000, seed=7)


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export root with one release, trained briefly on a small synthetic dataset."""
    from pipelines.config import TrainConfig
    from pipelines.pipeline import run_pipeline

    root = tmp_path_factory.mktemp("export")
    run_pipeline(
        root / "work",
        root,
        TrainConfig(**EXPORTED_TRAINING),
        dataset="synthetic",
        synthetic_size=EXPORTED_SIZE,
        log=lambda _: None,
    )
    return root


def redis_url(db: int = 9) -> str | None:
    """The test Redis if it answers, else None: ``CASCADE_TEST_REDIS_URL`` as given, or db
    ``db`` of the server at ``CASCADE_TEST_REDIS_ADDRESS`` (host:port, default 127.0.0.1:6379),
    so that two test runs can each use a private server."""
    import os
    import socket

    address = os.environ.get("CASCADE_TEST_REDIS_ADDRESS", "127.0.0.1:6379")
    url = os.environ.get("CASCADE_TEST_REDIS_URL", f"redis://{address}/{db}")
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return url
    except OSError:
        return None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A throw-away redis-server on a free loopback port, (url, process), that the test may
    stop, pause (SIGSTOP) or kill; killed at the end whatever state it is in."""
    try:
        url, process = start_redis_server(tmp_path)
    except FileNotFoundError:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    yield url, process
    process.send_signal(signal.SIGCONT)
    process.kill()
    process.wait()


@pytest.fixture
def private_redis_url(private_redis: tuple[str, subprocess.Popen[bytes]]) -> str:
    """The URL of ``private_redis``."""
    return private_redis[0]


@asynccontextmanager
async def app_client(settings: Any, headers: dict[str, str] | None = None) -> AsyncIterator[Any]:
    """An httpx client on the gateway app built from ``settings``, its lifespan run (the
    app is on ``client.app``); ``headers`` default to the test feedback key's."""
    import httpx

    from services.api.app import create_app

    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://gateway",
            headers=FEEDBACK_HEADERS if headers is None else headers,
        ) as http:
            http.app = app  # type: ignore[attr-defined]
            yield http
