"""Liveness (never depends on other services), readiness, Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from services.api.credentials import feedback_auth
from services.api.deps import GatewayDep
from services.metrics import render_metrics

router = APIRouter()


@router.get("/health/live")
async def live() -> dict[str, str]:
    return {"status": "live"}


@router.get(
    "/health/ready",
    responses={
        503: {
            "description": "No release is loaded (no answer is possible at all), or this "
            "replica's inference server does not serve the versions it routes users to yet "
            "(``unserved`` says which; follow.ready_requires_served)."
        }
    },
)
async def ready(gateway: GatewayDep, response: Response) -> dict[str, object]:
    """Ready when an answer is possible at all (a release is loaded) and, with an inference
    server of its own, that server serves the versions users are routed to (checked by the
    follower every tick): a replica whose Triton restarted leaves the load balancer until
    its versions are back, while it still answers, degraded, whoever reaches it. Other
    dependencies and what degrades the answers are reported, not turned into 503 (a fleet
    whose Redis came back empty still answers, from popularity, rather than leaving the
    load balancer with none)."""
    follower = gateway.follower
    unserved = (
        follower.unserved()
        if follower is not None and gateway.settings.follow.ready_requires_served
        else []
    )
    ready = gateway.ready and not unserved
    if not ready:
        response.status_code = 503
    monitor = gateway.store_monitor
    durability = monitor.durability if monitor is not None else None
    return {
        "ready": ready,
        "versions": sorted(gateway.releases),
        "unserved": unserved,
        "redis_breaker": gateway.redis_breaker.state,
        "triton_breaker": gateway.triton_breaker.state,
        "online_store": monitor.state if monitor is not None else "unknown",
        "feedback_durable": durability.durable if durability is not None else None,
        "feedback_refused": gateway.feedback_refusal,
        "feedback_auth": feedback_auth(gateway.settings.feedback),
        "release_problems": list(gateway.release_problems),
        "rollout": follower.status() if follower is not None else None,
    }


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics() -> Response:
    # rendering runs in a worker thread: a large registry never stalls the event loop
    body = await asyncio.to_thread(render_metrics)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
