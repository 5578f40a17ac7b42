"""POST /v1/feedback: impressions and clicks, acknowledged only once stored durably."""

from __future__ import annotations

import time

from fastapi import APIRouter

from services.api.deps import GatewayDep
from services.api.schemas import ERROR_RESPONSES, FeedbackRequest, FeedbackResponse
from services.errors import FeedbackNotDurable
from services.metrics import FEEDBACK, FEEDBACK_DUPLICATES, OTHER_VERSION

router = APIRouter()


@router.post("/v1/feedback", response_model=FeedbackResponse, responses=ERROR_RESPONSES)
async def feedback(body: FeedbackRequest, gateway: GatewayDep) -> FeedbackResponse:
    refusal = gateway.feedback_refusal
    if refusal is not None:
        raise FeedbackNotDurable(refusal)
    now = int(time.time())
    events = [
        {
            "user_id": str(e.user_id),
            "item_id": str(e.item_id),
            "type": e.type,
            "model_version": str(e.model_version or ""),
            "timestamp": str(e.timestamp or now),
            **({"event_id": e.event_id} if e.event_id else {}),
        }
        for e in body.events
    ]
    settings = gateway.settings
    timeout_s = settings.redis.timeout_ms / 1000 * 4  # a durable write may take longer
    appended = await gateway.redis_breaker.call(
        lambda: gateway.store.append_feedback(
            events, settings.feedback.max_len, settings.feedback.idempotency_ttl_s
        ),
        timeout_s,
    )
    served = gateway.releases
    for event in body.events:  # label values only from the versions this gateway serves
        version = str(event.model_version) if event.model_version in served else OTHER_VERSION
        FEEDBACK.labels(model_version=version, type=event.type).inc()
    FEEDBACK_DUPLICATES.inc(appended.duplicates)
    return FeedbackResponse(
        stored=len(appended.ids) - appended.duplicates,
        duplicates=appended.duplicates,
        ids=appended.ids,
    )
