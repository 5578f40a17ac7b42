"""Scoring stage: one inference call for all candidates (DLRM + tree model, blended).

Features for (user, candidate, now) rows come from the release's fitted workflow, the same
code the training rows went through. On failure or bad output the candidates keep their
retrieval order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipelines.features.ops import Columns
from pipelines.features.rows import USER_ATTRIBUTES
from pipelines.features.spec import DENSE, GENRES, SPARSE_COLUMNS
from services.context import RequestContext
from services.errors import DependencyUnavailable
from services.inference.backends import InferenceBackend
from services.release import Release
from services.resilience import CircuitBreaker
from services.stages.retrieval import ModelStage

# Sees each scored request: (ctx, sparse, dense, probabilities); drift counting, never raises.
ScoredObserver = Callable[[RequestContext, np.ndarray, np.ndarray, np.ndarray], None]


def ranking_inputs(release: Release, ctx: RequestContext) -> tuple[np.ndarray, np.ndarray]:
    """``sparse [N, T]`` and ``dense [N, D]`` for the candidates of this request.

    The same workflow as training, split by side: item columns were encoded once when the
    release loaded, the user is encoded once here (one row, broadcast), and the workflow
    finishes what depends on both (event time, standardisation).
    """
    n = len(ctx.candidates)
    attributes = ctx.user.attributes if ctx.user is not None else {}
    user: Columns = {"user_id": np.asarray([ctx.user_id], dtype=np.int64)}
    for name in USER_ATTRIBUTES:
        user[name] = np.asarray([attributes.get(name)], dtype=object)
    rows: Columns = {
        k: np.broadcast_to(v, (n, *v.shape[1:]))
        for k, v in release.workflow.transform(user, partial=True).items()
    }
    rows.update({k: v[ctx.candidates] for k, v in release.item_columns.items()})
    rows["timestamp"] = np.full(n, ctx.timestamp, dtype=np.int64)
    encoded = release.workflow.transform(rows, reuse=True)
    sparse = np.stack([encoded[c] for c in SPARSE_COLUMNS], axis=1).astype(np.int64)
    dense = np.concatenate([encoded[DENSE], encoded[GENRES]], axis=1).astype(np.float32)
    return sparse, dense


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
        sparse, dense = ranking_inputs(self.releases[ctx.model_version], ctx)
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
