"""The FastAPI application factory; settings and clients are built in the lifespan."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from core.errors import CascadeError
from services.api.credentials import KeyRing, feedback_auth
from services.api.docs import add_offline_docs
from services.api.fast_recommend import RecommendFastPath
from services.api.limits import BodySizeLimit
from services.api.routes import alerts, feedback, health, recommend
from services.errors import http_status
from services.metrics import worker_exited
from services.serving.gateway import Gateway
from services.settings import Settings
from services.state.retrain_queue import make_retrain_queue
from services.util.server_log import configure_server_logging

log = logging.getLogger(__name__)


FEEDBACK_AUTH_WARNINGS = {
    "open": "OPEN: POST /v1/feedback accepts events without a key (feedback.open); anyone "
    "who reaches this port can write training data. For local experiments only.",
    "off": "no client key configured: every POST /v1/feedback is refused (401); set "
    "CASCADE_FEEDBACK__KEYS or CASCADE_FEEDBACK__KEYS_FILE",
}


def create_worker_app() -> FastAPI:
    """The app of one of ``cascade serve --workers N``'s processes: uvicorn starts each as a
    new interpreter, so its logging (the "gateway ready" line among it) is set up here."""
    configure_server_logging()
    return create_app()


def create_app(settings: Settings | None = None, gateway: Gateway | None = None) -> FastAPI:
    """Build the app; ``gateway`` lets tests inject stores and backends."""
    resolved = gateway.settings if gateway is not None else (settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        chosen = gateway or Gateway(resolved)
        app.state.gateway = chosen
        queue = make_retrain_queue(resolved)  # no I/O until the first alert
        app.state.alert_webhook = alerts.AlertWebhook(resolved, queue)
        await chosen.start()
        monitor = chosen.store_monitor
        auth = feedback_auth(resolved.feedback)
        if auth != "keys":
            log.warning("feedback: %s", FEEDBACK_AUTH_WARNINGS[auth])
        log.info(
            "gateway ready: versions %s, online store %s, inference %s",
            sorted(chosen.releases),
            monitor.state if monitor is not None else "unknown",
            "triton" if resolved.triton.url else "in process",
        )
        try:
            yield
        finally:
            queue.close()
            await chosen.close()
            worker_exited(os.getpid())

    app = FastAPI(
        title="Cascade",
        version="0.1.0",
        lifespan=lifespan,
        description="Multi-stage recommendation: retrieval, filtering, scoring, ordering.",
        docs_url=None,  # served from the package by add_offline_docs, not from a CDN
        redoc_url=None,
    )
    add_offline_docs(app)
    app.state.feedback_keys = KeyRing(resolved.feedback.keys, resolved.feedback.keys_file)
    for module in (recommend, feedback, health, alerts):
        app.include_router(module.router)

    @app.exception_handler(CascadeError)
    async def domain_error(request: Request, error: CascadeError) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=http_status(error))

    app.add_middleware(RecommendFastPath)  # inside the body-size limit (added after it)
    app.add_middleware(BodySizeLimit, max_bytes=resolved.max_body_bytes)
    return app
