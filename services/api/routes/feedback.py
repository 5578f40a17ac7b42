"""POST /v1/feedback: impressions and clicks, acknowledged only once stored durably.

An event that names the ``request_id`` of an answer is attributed to the model version that
served that answer, resolved from the impression log on the server; metric labels only ever
take versions this gateway serves (or one fixed bucket), never a value from the body.
"""

from __future__ import annotations

import time

from fastapi import APIRouter

from services.api.deps import GatewayDep
from services.api.schemas import ERROR_RESPONSES, FeedbackRequest, FeedbackResponse
from services.errors import FeedbackNotDurable
from services.gateway import Gateway
from services.metrics import FEEDBACK, FEEDBACK_DUPLICATES, HITS, version_label

router = APIRouter()


async def _attribute(gateway: Gateway, body: FeedbackRequest) -> list[int | None]:
    """The model version of each event: the one that served its request_id when it names
    one (from the store, or from this gateway's impression sets not yet written there; None
    when that is unknown or expired), else the client's own claim."""
    request_ids = sorted({e.request_id for e in body.events if e.request_id})
    resolved: dict[str, int | None] = {}
    if request_ids:
        timeout_s = gateway.settings.redis.feedback_timeout_ms / 1000
        versions = await gateway.redis_breaker.call(
            lambda: gateway.store.impression_versions(request_ids), timeout_s
        )
        resolved = dict(zip(request_ids, versions, strict=True))
        if gateway.impressions is not None:  # answered just now: its set may still be queued
            for request_id, version in resolved.items():
                if version is None:
                    resolved[request_id] = gateway.impressions.pending_version(request_id)
    return [resolved[e.request_id] if e.request_id else e.model_version for e in body.events]


async def _first_clicks(
    gateway: Gateway, body: FeedbackRequest, versions: list[int | None]
) -> set[str]:
    """The requests whose first click this is: their impression set becomes a hit (stored
    on the event as ``hit: 1``, counted per version for the hit rate)."""
    clicked = {
        e.request_id: v
        for e, v in zip(body.events, versions, strict=True)
        if e.type == "click" and e.request_id and v is not None
    }
    if not clicked:
        return set()
    ttl_s = gateway.settings.impressions.attribution_ttl_s
    timeout_s = gateway.settings.redis.feedback_timeout_ms / 1000
    firsts = await gateway.redis_breaker.call(
        lambda: gateway.store.first_hits(list(clicked), ttl_s), timeout_s
    )
    return {request_id for request_id, first in zip(clicked, firsts, strict=True) if first}


@router.post("/v1/feedback", response_model=FeedbackResponse, responses=ERROR_RESPONSES)
async def feedback(body: FeedbackRequest, gateway: GatewayDep) -> FeedbackResponse:
    refusal = gateway.feedback_refusal
    if refusal is not None:
        raise FeedbackNotDurable(refusal)
    versions = await _attribute(gateway, body)
    hits = await _first_clicks(gateway, body, versions)
    now = int(time.time())
    events = [
        {
            "user_id": str(e.user_id),
            "item_id": str(e.item_id),
            "type": e.type,
            "model_version": "" if version is None else str(version),
            "timestamp": str(e.timestamp or now),
            **({"event_id": e.event_id} if e.event_id else {}),
            **({"request_id": e.request_id} if e.request_id else {}),
        }
        for e, version in zip(body.events, versions, strict=True)
    ]
    for event, e in zip(events, body.events, strict=True):
        if e.type == "click" and e.request_id in hits:
            event["hit"] = "1"
            hits.discard(e.request_id)  # one event per request carries it
    settings = gateway.settings
    timeout_s = settings.redis.feedback_timeout_ms / 1000
    appended = await gateway.redis_breaker.call(
        lambda: gateway.store.append_feedback(
            events, settings.feedback.max_len, settings.feedback.idempotency_ttl_s
        ),
        timeout_s,
    )
    for stored, version in zip(events, versions, strict=True):
        label = version_label(version, gateway.releases)
        FEEDBACK.labels(model_version=label, type=stored["type"]).inc()
        if stored.get("hit"):
            HITS.labels(model_version=label).inc()
    FEEDBACK_DUPLICATES.inc(appended.duplicates)
    return FeedbackResponse(
        stored=len(appended.ids) - appended.duplicates,
        duplicates=appended.duplicates,
        ids=appended.ids,
    )
