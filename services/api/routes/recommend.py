"""POST /v1/recommend.

The answer is serialised once, straight from the request context's arrays, and returned as
a ready ``Response``: FastAPI then skips re-validating and re-serialising it through the
response model, which still documents the body in the OpenAPI schema (and the API tests
check every answer against it). A well-formed request does not even reach this route:
``services.api.fast_recommend`` answers it with the same ``answer``.
"""

from __future__ import annotations

import json
import math

import numpy as np
from fastapi import APIRouter, Response

from services.api.deps import GatewayDep
from services.api.schemas import ERROR_RESPONSES, RecommendRequest, RecommendResponse
from services.events.impressions import impression_record
from services.serving.gateway import Gateway

router = APIRouter()
RECOMMEND_PATH = "/v1/recommend"  # also matched by the short path (services/api/fast_recommend.py)


@router.post(RECOMMEND_PATH, response_model=RecommendResponse, responses=ERROR_RESPONSES)
async def recommend(body: RecommendRequest, gateway: GatewayDep) -> Response:
    return Response(await answer(body, gateway), media_type="application/json")


async def answer(body: RecommendRequest, gateway: Gateway) -> bytes:
    """The recommendation as the JSON body of the answer (the data set's ids, from the
    gateway); the impression is logged in the release's internal ids."""
    ctx, release = await gateway.recommend(
        body.user_id, body.k, body.context, body.exclude, body.model_version
    )
    item_ids = release.item_ids[ctx.candidates]
    if gateway.impressions is not None:
        gateway.impressions.record(
            impression_record(
                ctx.request_id,
                ctx.user_id,
                ctx.model_version,
                item_ids,
                ctx.scores,
                ctx.reasons,
                sum(ctx.timings_ms.values()),
                ctx.split,
            ),
            gateway.releases.keys(),
        )
    scores = ctx.scores.tolist()
    if not np.isfinite(ctx.scores).all():  # as pydantic writes them: null, never a bare NaN
        scores = [s if math.isfinite(s) else None for s in scores]
    result = {
        "request_id": ctx.request_id,
        "user_id": ctx.external_user_id,
        "items": [
            {"item_id": i, "score": s} for i, s in zip(ctx.external_item_ids, scores, strict=True)
        ],
        "model_versions": {
            "query_tower": ctx.model_version,
            "ranker": ctx.model_version,
            "release": ctx.model_version,
        },
        "degraded": ctx.degraded,
        "reasons": ctx.reasons,
        "timings_ms": ctx.timings_ms,
    }
    return json.dumps(result, separators=(",", ":"), allow_nan=False).encode()
