"""POST /v1/admin/alerts: Alertmanager's webhook; a retraining alert enqueues one retrain.

Alerts labelled ``action: retrain`` that are firing become one retrain request per alert
group and data window (the window of the earliest ``startsAt``, ``retrain_trigger.window_s``
wide): Alertmanager's re-sends of the same group are answered ``duplicate``, and any request
within ``retrain_trigger.cooldown_s`` of the last enqueued one ``cooldown``. Resolved
notifications (``resolved``) and alerts without the label (``not_retrain``) are acknowledged
and change nothing. Every decision is counted in ``cascade_retrain_requests_total``.

The endpoint needs ``Authorization: Bearer <CASCADE_ADMIN__TOKEN>`` (compared in constant
time; none or a wrong one: 401); with no token configured, a caller that sends one learns
that the endpoint is off (404).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials

from services.api.credentials import KeyRing, bearer
from services.api.schemas import (
    ERROR_RESPONSES,
    AlertDecision,
    AlertmanagerPayload,
    ErrorResponse,
)
from services.metrics import RETRAIN_REQUESTS
from services.settings import Settings
from services.state.retrain_queue import RetrainQueue

RETRAIN_LABEL = ("action", "retrain")
TRIGGER_LABELS = ("model_version", "feature", "severity")  # copied into the request

router = APIRouter()


@dataclass
class AlertWebhook:
    """What the route needs: the settings, the queue and the admin token (built in the app's
    lifespan)."""

    settings: Settings
    queue: RetrainQueue

    def __post_init__(self) -> None:
        admin = self.settings.admin
        self.keys = KeyRing([admin.token] if admin.token is not None else [], admin.token_file)


def require_admin(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> AlertWebhook:
    """The webhook's state, once the caller proved it holds the admin token."""
    webhook: AlertWebhook = request.app.state.alert_webhook
    refused = HTTPException(
        401,
        "a valid admin bearer token is required (Authorization: Bearer <token>)",
        headers={"WWW-Authenticate": "Bearer"},
    )
    if credentials is None:  # unauthenticated, whatever the configuration
        raise refused
    if not webhook.keys.current():  # none configured, or an empty token file
        raise HTTPException(
            404,
            "the admin endpoints are off: no admin token is configured "
            "(set CASCADE_ADMIN__TOKEN or CASCADE_ADMIN__TOKEN_FILE)",
        )
    if webhook.keys.match(credentials.credentials) is None:
        raise refused
    return webhook


def retrain_request(
    payload: AlertmanagerPayload, window_s: int
) -> tuple[str, str | None, dict[str, Any] | None]:
    """The decision a notification gets before the queue is asked: ``resolved`` or
    ``not_retrain`` (nothing to enqueue), else ``offer`` with its dedup key (group key +
    data window) and the trigger recorded with the retrain."""
    key, value = RETRAIN_LABEL
    retraining = [a for a in payload.alerts if a.labels.get(key) == value]
    firing = [a for a in retraining if a.status == "firing"]
    if not firing:
        return ("resolved" if retraining else "not_retrain"), None, None
    started = min(a.starts_at for a in firing)
    window = int(started.timestamp()) // window_s * window_s
    dedup_key = f"{payload.group_key}|{window}"
    trigger = {
        "source": "alertmanager",
        "group_key": payload.group_key,
        "receiver": payload.receiver,
        "alerts": [
            {
                "alertname": a.labels.get("alertname", ""),
                **{name: a.labels[name] for name in TRIGGER_LABELS if name in a.labels},
                "starts_at": a.starts_at.isoformat(),
                "fingerprint": a.fingerprint,
            }
            for a in firing[:50]
        ],
        "firing": len(firing),
        "window_start": datetime.fromtimestamp(window, UTC).isoformat(),
        "received_at": datetime.fromtimestamp(time.time(), UTC).isoformat(),
    }
    return "offer", dedup_key, trigger


@router.post(
    "/v1/admin/alerts",
    response_model=AlertDecision,
    responses={
        **ERROR_RESPONSES,
        401: {"model": ErrorResponse, "description": "No or a wrong bearer token."},
        404: {"model": ErrorResponse, "description": "No admin token is configured."},
        503: {
            "model": ErrorResponse,
            "description": "The retrain queue or the token file cannot be read (Alertmanager "
            "retries).",
        },
    },
    summary="Alertmanager webhook: retraining alerts enqueue one retrain",
)
async def receive_alerts(
    payload: AlertmanagerPayload, webhook: Annotated[AlertWebhook, Depends(require_admin)]
) -> AlertDecision:
    trigger_settings = webhook.settings.retrain_trigger
    decision, dedup_key, trigger = retrain_request(payload, trigger_settings.window_s)
    request_id = None
    if dedup_key is not None and trigger is not None:
        offer = await asyncio.to_thread(
            webhook.queue.offer,
            dedup_key,
            trigger,
            trigger_settings.cooldown_s,
            trigger_settings.dedup_ttl_s,
        )
        decision, request_id = offer.decision, offer.request_id
    RETRAIN_REQUESTS.labels(decision=decision).inc()
    return AlertDecision(decision=decision, request_id=request_id)
