"""Retrieval stage: query tower -> user embedding -> ANN search over the item index.

Unknown users (and any failure) get popularity candidates instead.
"""

from __future__ import annotations

import numpy as np

from services.context import RequestContext
from services.errors import DependencyUnavailable
from services.inference.backends import InferenceBackend
from services.release import Release
from services.resilience import CircuitBreaker


def popularity_candidates(release: Release, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` most popular catalog positions, scored by descending rank in (0, 1]."""
    positions = release.popularity[:count]
    return positions, (1.0 - np.arange(len(positions), dtype=np.float32) / max(len(positions), 1))


class ModelStage:
    """A stage that calls a model on the inference backend, behind the breaker and timeout."""

    name = "model"

    def __init__(
        self,
        releases: dict[int, Release],
        backend: InferenceBackend,
        breaker: CircuitBreaker,
        timeout_s: float,
    ) -> None:
        self.releases = releases
        self.backend = backend
        self.breaker = breaker
        self.timeout_s = timeout_s


class RetrievalStage(ModelStage):
    name = "retrieval"

    def __init__(
        self,
        releases: dict[int, Release],
        backend: InferenceBackend,
        breaker: CircuitBreaker,
        timeout_s: float,
        candidates: int,
    ) -> None:
        super().__init__(releases, backend, breaker, timeout_s)
        self.candidates = candidates

    async def __call__(self, ctx: RequestContext) -> RequestContext:
        release = self.releases[ctx.model_version]
        wanted = max(self.candidates, ctx.k)
        if ctx.user is None:
            ctx.count_fallback(self.name, "cold_start")
            ctx.candidates, ctx.retrieval_scores = popularity_candidates(release, wanted)
            return ctx
        features, history = release.features.query_inputs(ctx)
        try:
            embedding = await self.breaker.call(
                lambda: self.backend.encode_query(ctx.model_version, features, history),
                self.timeout_s,
            )
        except DependencyUnavailable as error:
            ctx.degrade(self.name, error.reason)
            ctx.candidates, ctx.retrieval_scores = popularity_candidates(release, wanted)
            return ctx
        embedding = np.asarray(embedding, dtype=np.float32)
        if embedding.shape != (1, release.index.d) or not np.isfinite(embedding).all():
            ctx.degrade(self.name, "bad_scores")
            ctx.candidates, ctx.retrieval_scores = popularity_candidates(release, wanted)
            return ctx
        scores, positions = release.index.search(embedding, min(wanted, release.index.ntotal))
        found = positions[0] >= 0
        ctx.candidates = positions[0][found].astype(np.int64)
        ctx.retrieval_scores = scores[0][found].astype(np.float32)
        return ctx
