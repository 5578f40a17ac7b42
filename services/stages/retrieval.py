"""Retrieval stage: candidates from two sources, deduplicated, within one budget.

- ANN: query tower -> user embedding -> search over the item index, for the budget plus as
  many as the user has seen (at most ``MAX_SEARCH``), the seen ones dropped: a model that
  learned from a user's items ranks them high, and filtering would drop them, leaving a
  heavy user's answer short (filled from popularity, a degraded answer);
- item neighbours: the neighbours of the user's recent items that the ANN did not find
  (``pipelines.training.item_neighbors``), up to ``neighbor_candidates`` of the budget, scored
  by the same two-tower dot product as the ANN's, so that every candidate's retrieval score
  means the same thing (the ordering fallback and the drift monitor read it).

Unknown users get popularity candidates. When the query tower cannot answer, a known user
gets the neighbours of their recent items (up to the whole budget), then popularity: personal
candidates without a model call. Candidates are counted per source.
"""

from __future__ import annotations

import numpy as np

from core.item_neighbors import merge_candidates
from services.errors import DependencyUnavailable
from services.inference.backends import InferenceBackend
from services.metrics import RETRIEVED
from services.serving.context import RequestContext
from services.serving.release import Release
from services.util.resilience import CircuitBreaker

FROM_ANN = RETRIEVED.labels(source="ann")
FROM_NEIGHBORS = RETRIEVED.labels(source="item_neighbors")
FROM_POPULARITY = RETRIEVED.labels(source="popularity")
MAX_SEARCH = 2048  # the most results one ANN search asks for (FAISS's GPU search limit)


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


def seen_positions(release: Release, ctx: RequestContext) -> np.ndarray:
    """The catalog positions of the items the user has seen (none for an unknown user)."""
    if ctx.user is None or not len(ctx.user.seen):
        return np.zeros(0, np.int64)
    positions = release.positions(np.asarray(ctx.user.seen, np.int64))
    return positions[positions >= 0]


class RetrievalStage(ModelStage):
    name = "retrieval"

    def __init__(
        self,
        releases: dict[int, Release],
        backend: InferenceBackend,
        breaker: CircuitBreaker,
        timeout_s: float,
        candidates: int,
        neighbor_candidates: int = 0,
    ) -> None:
        super().__init__(releases, backend, breaker, timeout_s)
        self.candidates = candidates
        self.neighbor_candidates = neighbor_candidates

    def neighbors_of_history(
        self, release: Release, ctx: RequestContext, count: int, seen: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``count`` neighbours of the user's recent items that the user has not seen,
        best first, with their summed similarities (none without a table or a history);
        ``seen``: the user's seen positions (``seen_positions``) when already looked up."""
        if release.neighbors is None or ctx.user is None or count <= 0 or not len(ctx.user.recent):
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        recent = np.asarray(ctx.user.recent, np.int64)[-release.features.history_length :]
        if seen is None:
            seen = seen_positions(release, ctx)
        return release.neighbors.candidates(release.positions(recent), count, seen)

    def without_query(self, release: Release, ctx: RequestContext, wanted: int) -> RequestContext:
        """The query tower could not answer: the history's neighbours, then popularity. The
        neighbours' scores (1 + similarity) rank them above every popularity score."""
        found, similarity = self.neighbors_of_history(release, ctx, wanted)
        popular, popular_scores = popularity_candidates(release, wanted + len(found))
        fresh = np.flatnonzero(~np.isin(popular, found))[: wanted - len(found)]
        popular, popular_scores = popular[fresh], popular_scores[fresh]
        ctx.candidates = np.concatenate([found, popular]).astype(np.int64)
        ctx.retrieval_scores = np.concatenate([1.0 + similarity, popular_scores]).astype(np.float32)
        FROM_NEIGHBORS.inc(len(found))
        FROM_POPULARITY.inc(len(popular))
        return ctx

    async def __call__(self, ctx: RequestContext) -> RequestContext:
        release = self.releases[ctx.model_version]
        wanted = max(self.candidates, ctx.k)
        if ctx.user is None:
            ctx.count_fallback(self.name, "cold_start")
            ctx.candidates, ctx.retrieval_scores = popularity_candidates(release, wanted)
            FROM_POPULARITY.inc(len(ctx.candidates))
            return ctx
        features, history = release.features.query_inputs(ctx)
        try:
            embedding = await self.breaker.call(
                lambda: self.backend.encode_query(ctx.model_version, features, history),
                self.timeout_s,
            )
        except DependencyUnavailable as error:
            ctx.degrade(self.name, error.reason)
            return self.without_query(release, ctx, wanted)
        embedding = np.asarray(embedding, dtype=np.float32)
        if embedding.shape != (1, release.index.d) or not np.isfinite(embedding).all():
            ctx.degrade(self.name, "bad_scores")
            return self.without_query(release, ctx, wanted)
        seen = seen_positions(release, ctx)
        fetch = min(wanted + len(seen), max(wanted, MAX_SEARCH), release.index.ntotal)
        scores, positions = release.index.search(embedding, fetch)
        found = positions[0] >= 0
        if len(seen):
            found &= ~np.isin(positions[0], seen)
        ann = positions[0][found][:wanted].astype(np.int64)
        ann_scores = scores[0][found][:wanted]
        extra, _ = self.neighbors_of_history(
            release, ctx, min(self.neighbor_candidates, wanted), seen
        )
        if len(extra) == 0 or release.embeddings is None:
            ctx.candidates, ctx.retrieval_scores = ann, ann_scores.astype(np.float32)
            FROM_ANN.inc(len(ann))
            return ctx
        merged, from_ann = merge_candidates(ann, extra, wanted)
        added = merged[from_ann:]
        added_scores = np.asarray(release.embeddings[added], np.float32) @ embedding[0]
        merged_scores = np.concatenate([ann_scores[:from_ann], added_scores]).astype(np.float32)
        order = np.argsort(-merged_scores, kind="stable")  # best first, as the ANN's
        ctx.candidates, ctx.retrieval_scores = merged[order], merged_scores[order]
        FROM_ANN.inc(from_ann)
        FROM_NEIGHBORS.inc(len(added))
        return ctx
