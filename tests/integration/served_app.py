"""A gateway app served by uvicorn in a thread on a free loopback port, for tests that talk
to it over real HTTP (the simulator, Prometheus scrapes, Alertmanager's webhook calls)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from services.api.app import create_app
from services.api.server import server_config
from services.gateway import Gateway
from services.local_redis import free_port
from services.settings import Settings


@contextmanager
def served_app(settings: Settings, gateway: Gateway | None = None) -> Iterator[str]:
    """Serve ``create_app`` (around ``gateway`` when given) until the block ends; yields the
    base URL once the server accepts connections (fails the test if it does not start)."""
    app = create_app(gateway=gateway) if gateway is not None else create_app(settings)
    port = free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
