"""Scoring stage: one inference call for all candidates (DLRM + tree model, blended).

Features for (user, candidate, now) rows come from the release's fitted workflow, the same
code the training rows went through. On failure or bad output the candidates keep their
retrieval order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from services.errors import DependencyUnavailable
from services.inference.backends import InferenceBackend
from services.serving.context import RequestContext
from services.serving.release import Release
from services.stages.retrieval import ModelStage
from services.util.resilience import CircuitBreaker

# Sees each scored request: (ctx, sparse, dense, probabilities); drift counting, never raises.
ScoredObserver = Callable[[RequestContext, np.ndarray, np.ndarray, np.ndarray], None]


class ScoringStage(ModelStage):
    name = "scoring"

    def __init__(
        self,
        releases: dict[int, Release],
        backend: InferenceBackend,
        breaker: CircuitBreaker,
        timeout_s: float,
        observe: ScoredObserver | None = None,
    ) -> None:
        super().__init__(releases, backend, breaker, timeout_s)
        self.observe = observe

    async def __call__(self, ctx: RequestContext) -> RequestContext:
        ctx.scores = ctx.retrieval_scores
        if len(ctx.candidates) == 0:
            return ctx
        sparse, dense = self.releases[ctx.model_version].features.ranking_inputs(ctx)
        try:
            logits, embeddings_degraded = await self.breaker.call(
                lambda: self.backend.rank(ctx.model_version, sparse, dense), self.timeout_s
            )
        except DependencyUnavailable as error:
            ctx.degrade(self.name, error.reason)
            return ctx
        logits = np.asarray(logits, dtype=np.float32).reshape(-1)
        if logits.shape != (len(ctx.candidates),) or not np.isfinite(logits).all():
            ctx.degrade(self.name, "bad_scores")
            return ctx
        ctx.scores = (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        if self.observe is not None:
            self.observe(ctx, sparse, dense, ctx.scores)
        if embeddings_degraded:
            ctx.degrade(self.name, "embeddings_unavailable")
        return ctx
