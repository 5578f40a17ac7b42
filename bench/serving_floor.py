"""The compute floor of one recommendation: the stages' numeric work in one tight loop, no
HTTP, no event loop, no inference server (features transform, query tower, FAISS search,
filtering, ranking inputs, embedding lookup, DLRM dense part, LightGBM, ordering).

CPU time is this process's (``time.process_time``), so it is robust to other load; the
loop runs once per user over the same users the load generator picks from.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from core.tree_ranker import tree_features
from services.inference.embeddings import InMemoryTables
from services.inference.models import QueryTowerModel, RankingModel
from services.serving.context import RequestContext
from services.serving.release import load_release
from services.stages.filtering import FilteringStage
from services.stages.ordering import OrderingStage
from services.stages.retrieval import popularity_candidates
from services.stores.materialize import materialize
from services.stores.memory import InMemoryStore


def run_now(coroutine: Coroutine[Any, Any, RequestContext]) -> RequestContext:
    """Drive a stage coroutine that never awaits anything (filtering, ordering) to its end."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise RuntimeError("the stage awaited something: it is not pure computation")


def compute_floor(root: Path, users: list[int], k: int, candidates: int = 300) -> dict:
    """CPU-ms per request of the numeric work alone, and of LightGBM alone."""
    release = load_release(root)
    repository = root / "model_repository"
    query = QueryTowerModel(repository / "query_tower" / str(release.version))
    query.load()
    ranker_dir = repository / "ranker" / str(release.version)
    ranker = RankingModel(ranker_dir, embeddings=InMemoryTables.load(ranker_dir / "embeddings"))
    ranker.load()
    store = InMemoryStore()
    asyncio.run(store.start())
    asyncio.run(materialize(store, root / "releases" / str(release.version)))
    found = [asyncio.run(store.lookup(u)) for u in users]
    releases = {release.version: release}
    filtering, ordering = FilteringStage(releases), OrderingStage(releases)
    wanted = max(candidates, k)
    assert ranker.tree is not None and ranker.embeddings is not None and ranker.session is not None
    tree_s = 0.0
    started = time.process_time()
    for user_id, lookup in zip(users, found, strict=True):
        ctx = RequestContext(user_id, k, int(time.time()), release.version)
        ctx.user, ctx.unavailable = lookup.user, lookup.unavailable
        if ctx.user is None:
            ctx.candidates, ctx.retrieval_scores = popularity_candidates(release, wanted)
        else:
            features, history = release.features.query_inputs(ctx)
            embedding = query.encode(features, history)
            scores, positions = release.index.search(embedding, wanted)
            ctx.candidates = positions[0][positions[0] >= 0].astype(np.int64)
            ctx.retrieval_scores = scores[0][positions[0] >= 0].astype(np.float32)
        ctx = run_now(filtering(ctx))
        sparse, dense = release.features.ranking_inputs(ctx)
        embedded = ranker.embeddings.lookup(sparse)
        dlrm = ranker.session.run(None, {"dense": dense, "embedded": embedded})[0]
        tree_started = time.process_time()
        tree = ranker.tree.logits(tree_features({"sparse": sparse, "dense": dense})[0])
        tree_s += time.process_time() - tree_started
        logits = ranker.dlrm_weight * dlrm.reshape(-1) + (1 - ranker.dlrm_weight) * tree
        ctx.scores = (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        ctx = run_now(ordering(ctx))
    elapsed = time.process_time() - started
    ranker.close()
    return {
        "floor_cpu_ms_per_request": round(elapsed * 1000 / len(users), 3),
        "lightgbm_cpu_ms_per_request": round(tree_s * 1000 / len(users), 3),
        "requests": len(users),
    }
