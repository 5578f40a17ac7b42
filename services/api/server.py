"""The HTTP server: uvicorn with limits a hostile or broken client cannot get around.

uvicorn's httptools protocol keeps reading an unterminated header for as long as the client
sends it, keeps a connection that never sends a request open forever and accepts any number
of connections. ``GuardedHttpToolsProtocol`` adds, per worker:

- a cap on request line + headers (431 and close past ``max_header_bytes``; memory grows by
  at most one socket read beyond it);
- a header read timeout (408 and close when a connection has not sent complete headers
  ``header_timeout_s`` after it opened or its request began);
- a connection cap (503 and close for connections beyond ``max_connections``);
- one send per response instead of two (``services.api.coalescing``).

Keep-alive idle time and the graceful-shutdown timeout are uvicorn's own options.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import uvicorn
from uvicorn.main import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from services.api.coalescing import CoalescingTransport
from services.metrics import MULTIPROCESS_ENV
from services.settings import ServerSettings, Settings

log = logging.getLogger(__name__)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header size, header time and connection limits."""

    configured: ClassVar[ServerSettings | None] = None  # set by serve(); else from CASCADE_*

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = self.configured or Settings().server
        self.header_bytes = 0
        self.awaiting_headers = True
        self.header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport))  # type: ignore[arg-type]
        if len(self.connections) > self.limits.max_connections:
            self.refuse(503, "too many open connections")
            return
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        if isinstance(self.transport, CoalescingTransport):
            self.transport.flush()  # a head with no body write (HEAD, 204) goes out now
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.awaiting_headers and not self.transport.is_closing():
            self.header_bytes += len(data)
            if self.header_bytes > self.limits.max_header_bytes:
                self.refuse(431, f"request headers exceed {self.limits.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.awaiting_headers, self.header_bytes = True, 0
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self.awaiting_headers = False
        self._disarm_header_timer()
        super().on_headers_complete()

    def _arm_header_timer(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._header_timeout
            )

    def _disarm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_timeout(self) -> None:
        self.header_timer = None
        if self.awaiting_headers and not self.transport.is_closing():
            self.refuse(408, "request headers not received in time")

    def refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with a plain-text ``message`` and close the connection."""
        self._disarm_header_timer()
        body = message.encode()
        self.transport.write(
            STATUS_LINE[status]
            + b"content-type: text/plain; charset=utf-8\r\n"
            + b"content-length: "
            + str(len(body)).encode()
            + b"\r\nconnection: close\r\n\r\n"
            + body
        )
        self.transport.close()


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn options: the guarded protocol and the settings' limits. Worker processes
    (``--workers``) read the limits from the same CASCADE_* environment."""
    GuardedHttpToolsProtocol.configured = settings.server
    return {
        "http": GuardedHttpToolsProtocol,
        "timeout_keep_alive": settings.server.keep_alive_s,
        "timeout_graceful_shutdown": settings.server.graceful_shutdown_s,
        "log_level": "warning",
        "access_log": False,
    }


def server_config(app: Any, host: str, port: int, settings: Settings) -> uvicorn.Config:
    """A uvicorn Config for ``app`` (tests run it in a thread)."""
    return uvicorn.Config(app, host=host, port=port, **server_options(settings))


def prepare_worker_metrics(workers: int) -> Path | None:
    """More than one worker: prometheus_client's multiprocess mode, so that ``/metrics``
    (whichever worker answers) shows every worker's counts. The directory is
    ``PROMETHEUS_MULTIPROC_DIR`` when set (e.g. an emptyDir), else a new temporary one; the
    files of an earlier run are removed first, as prometheus_client requires. Set in the
    environment before the workers start (they are spawned, and read it on import)."""
    if workers <= 1 and not os.environ.get(MULTIPROCESS_ENV):
        return None
    given = os.environ.get(MULTIPROCESS_ENV)
    directory = Path(given) if given else Path(tempfile.mkdtemp(prefix="cascade-metrics-"))
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROCESS_ENV] = str(directory)
    return directory


def serve(host: str, port: int, workers: int, settings: Settings) -> None:
    """Run the gateway (the app factory of services.api.app) until SIGINT/SIGTERM."""
    metrics_dir = prepare_worker_metrics(workers)
    if metrics_dir is not None:
        log.info("metrics of %d workers combined through %s", workers, metrics_dir)
    if workers > 1:  # uvicorn binds the port in the parent before it starts the workers
        uvicorn.run(
            "services.api.app:create_worker_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            **server_options(settings),
        )
        return
    # One process: bind before the app starts (uvicorn alone would start the app first), so
    # that once "gateway ready" is logged a client can connect.
    config = uvicorn.Config(
        "services.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        **server_options(settings),
    )
    listening = config.bind_socket()
    log.info("listening on %s:%d; starting the gateway", host, port)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[listening])
    except KeyboardInterrupt:
        pass
    finally:
        listening.close()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
