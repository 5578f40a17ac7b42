"""Liveness (never depends on other services), readiness, Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.api.deps import GatewayDep

router = APIRouter()


@router.get("/health/live")
async def live() -> dict[str, str]:
    return {"status": "live"}


@router.get("/health/ready")
async def ready(gateway: GatewayDep, response: Response) -> dict[str, object]:
    """Ready when an answer is possible at all (a release is loaded); dependencies are reported."""
    if not gateway.ready:
        response.status_code = 503
    return {
        "ready": gateway.ready,
        "versions": sorted(gateway.releases),
        "redis_breaker": gateway.redis_breaker.state,
        "triton_breaker": gateway.triton_breaker.state,
    }


@router.get("/metrics")
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
