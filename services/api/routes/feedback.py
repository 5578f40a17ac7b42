"""POST /v1/feedback: impressions and clicks, acknowledged only once stored."""

from __future__ import annotations

import time

from fastapi import APIRouter

from services.api.deps import GatewayDep
from services.api.schemas import FeedbackRequest, FeedbackResponse
from services.metrics import FEEDBACK

router = APIRouter()


@router.post("/v1/feedback", response_model=FeedbackResponse)
async def feedback(body: FeedbackRequest, gateway: GatewayDep) -> FeedbackResponse:
    now = int(time.time())
    events = [
        {
            "user_id": str(e.user_id),
            "item_id": str(e.item_id),
            "type": e.type,
            "model_version": str(e.model_version or ""),
            "timestamp": str(e.timestamp or now),
        }
        for e in body.events
    ]
    timeout_s = gateway.settings.redis.timeout_ms / 1000 * 4  # a durable write may take longer
    ids = await gateway.redis_breaker.call(lambda: gateway.store.append_feedback(events), timeout_s)
    for event in body.events:
        FEEDBACK.labels(model_version=str(event.model_version or "none"), type=event.type).inc()
    return FeedbackResponse(stored=len(ids), ids=ids)
