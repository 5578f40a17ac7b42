"""POST /v1/recommend."""

from __future__ import annotations

from fastapi import APIRouter

from services.api.deps import GatewayDep
from services.api.schemas import ERROR_RESPONSES, RecommendRequest, RecommendResponse, ScoredItem
from services.impressions import impression_record

router = APIRouter()


@router.post("/v1/recommend", response_model=RecommendResponse, responses=ERROR_RESPONSES)
async def recommend(body: RecommendRequest, gateway: GatewayDep) -> RecommendResponse:
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
            ),
            gateway.releases.keys(),
        )
    ids = item_ids.tolist()
    return RecommendResponse(
        request_id=ctx.request_id,
        user_id=ctx.user_id,
        items=[
            ScoredItem(item_id=i, score=s) for i, s in zip(ids, ctx.scores.tolist(), strict=True)
        ],
        model_versions={
            "query_tower": ctx.model_version,
            "ranker": ctx.model_version,
            "release": ctx.model_version,
        },
        degraded=ctx.degraded,
        reasons=ctx.reasons,
        timings_ms=ctx.timings_ms,
    )
