"""The recommender: the list of stages run over one request context, each timed.

A stage that raises despite its own fallbacks is recorded as degraded and the next stage
runs on what there is, so a request never fails because one stage did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from services.metrics import DEGRADED, RECOMMENDATIONS, REQUEST_LATENCY, STAGE_LATENCY
from services.serving.context import RequestContext, Stage

log = logging.getLogger(__name__)


class Recommender:
    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = list(stages)

    async def __call__(self, ctx: RequestContext) -> RequestContext:
        started = time.perf_counter()
        for stage in self.stages:
            stage_started = time.perf_counter()
            try:
                ctx = await stage(ctx)
            except Exception:
                log.exception("stage %s failed for request %s", stage.name, ctx.request_id)
                ctx.degrade(stage.name, "error")
            elapsed = time.perf_counter() - stage_started
            STAGE_LATENCY.labels(stage=stage.name).observe(elapsed)
            ctx.timings_ms[stage.name] = round(elapsed * 1000, 3)
        REQUEST_LATENCY.observe(time.perf_counter() - started)
        RECOMMENDATIONS.labels(model_version=str(ctx.model_version)).inc()
        if ctx.degraded:
            DEGRADED.inc()
        return ctx
